"""How ``train_model`` asks its stopping policy, and marks the round the policy makes the last."""

from __future__ import annotations

import dataclasses
import logging

from managers.clock import Clock
from programlogic.stopping import StoppingPolicy, StopReason
from programlogic.training._evaluations import EvaluationManagerProtocol
from programlogic.training._persister import Persister
from programlogic.training.checkpoint import Checkpoint

__all__ = ["Stopper"]

logger = logging.getLogger(__name__)


@dataclasses.dataclass
class Stopper:
    """Asks ``stopping`` (when there is one) about each round before its checkpoint is saved.

    No round after ``total_rounds`` is asked about. When the policy stops, the
    checkpoint is marked stopped for its reason and made due for evaluation.
    ``waits``: ask ``after_evaluation`` once the round's own evaluation has finished,
    for evaluated rounds only.
    """

    stopping: StoppingPolicy | None
    waits: bool
    total_rounds: int
    evaluation_manager: EvaluationManagerProtocol | None
    persister: Persister
    clock: Clock

    async def after_round(self, checkpoint: Checkpoint) -> None:
        """Ask whether the round of ``checkpoint``, just trained, is the last."""
        await self._ask_after_evaluation(checkpoint)
        await self.before_round(checkpoint)

    async def before_round(self, checkpoint: Checkpoint) -> None:
        """Ask ``before_round``: may the round after ``checkpoint``'s start?"""
        round_num = checkpoint.round_num
        if (
            self.stopping is None
            or checkpoint.stop_reason is not None
            or round_num >= self.total_rounds
        ):
            return
        reason = await self.stopping.before_round(round_num + 1)
        self._stop(checkpoint, _check_answer(reason, "before_round"))

    async def _ask_after_evaluation(self, checkpoint: Checkpoint) -> None:
        """Ask ``after_evaluation``; when waiting, once the round's evaluation has finished."""
        round_num = checkpoint.round_num
        if self.stopping is None or round_num >= self.total_rounds:
            return
        if self.waits:
            if not checkpoint.evaluation_due or self.evaluation_manager is None:
                return
            await self.persister.start_evaluation(checkpoint)
            await self.evaluation_manager.wait_for_evaluations_to_finish()
        reason = await self.stopping.after_evaluation(round_num)
        self._stop(checkpoint, _check_answer(reason, "after_evaluation"))

    def _stop(self, checkpoint: Checkpoint, reason: StopReason | None) -> None:
        """Make the round of ``checkpoint`` the last, for ``reason``; evaluate it."""
        if reason is None:
            return
        logger.info(
            "the stopping policy stopped training at round %d: %s", checkpoint.round_num, reason
        )
        checkpoint.stop_reason = reason
        if self.evaluation_manager is not None and not checkpoint.evaluation_due:
            checkpoint.evaluation_due = True
            checkpoint.last_evaluation = int(self.clock.now().timestamp())


def _check_answer(answer: object, hook: str) -> StopReason | None:
    """A stopping policy's answer to ``hook`` as a StopReason, or None to go on."""
    if answer is None or isinstance(answer, StopReason):
        return answer
    if isinstance(answer, str) and answer:
        return StopReason(answer)
    raise TypeError(
        f"the stopping policy's {hook} must return None or a StopReason, got "
        f"{type(answer).__name__} {answer!r}"
    )
