"""What ``train_model`` needs of an evaluation manager, and how it stops one on failure."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncIterator
from typing import Any, Protocol, runtime_checkable

import anyio

__all__ = ["EvaluationManagerProtocol", "evaluations_stopped_on_failure"]

logger = logging.getLogger(__name__)


@runtime_checkable
class EvaluationManagerProtocol(Protocol):
    """What ``train_model`` needs of an evaluation manager.

    Optionally also ``async aclose()``: stop the running evaluations (their saved state
    stays) and release what the manager holds. ``train_model`` calls it when it fails
    or is cancelled, so that no evaluation outlives the failed run.
    """

    async def resume_from_previous_state(self) -> None:
        """Resume the evaluations that were in flight when the program last stopped."""
        ...

    async def start_evaluation(
        self, train_round: int, start_timestamp: int, model_weights: Any
    ) -> None:
        """Start evaluating ``model_weights`` of ``train_round``; a no-op if started before."""
        ...

    async def wait_for_evaluations_to_finish(self) -> None:
        """Wait for every started evaluation; raise what failed."""
        ...


@contextlib.asynccontextmanager
async def evaluations_stopped_on_failure(
    evaluation_manager: EvaluationManagerProtocol | None,
) -> AsyncIterator[None]:
    """On failure or cancellation, stop the evaluations this call started or resumed.

    An evaluation manager with an ``aclose`` (:class:`~programlogic.EvaluationManager`)
    is closed: its running evaluations are cancelled (their saved state stays for a
    resume) and its state managers released. A failure of ``aclose`` itself is logged:
    it must not hide the failure that got here.
    """
    try:
        yield
    except BaseException:
        close = getattr(evaluation_manager, "aclose", None)
        if close is not None:
            with anyio.CancelScope(shield=True):
                try:
                    await close()
                except Exception:
                    logger.exception("closing the evaluation manager after a failure failed")
        raise
