"""Tests of the federated-context suite: the background work of a context."""

from __future__ import annotations

from collections.abc import Callable

import anyio
import pytest

from programlogic.context import FederatedContext

__all__ = ["BackgroundWorkTests"]


class BackgroundWorkTests:
    """Background work ends with its context, and a failure nobody collected is raised."""

    async def test_leaving_the_context_cancels_its_unfinished_background_work(
        self, make_context: Callable[[], FederatedContext]
    ) -> None:
        started, outcome = anyio.Event(), []

        async def forever() -> None:
            started.set()
            try:
                await anyio.sleep_forever()
            finally:
                outcome.append("cancelled")

        async with make_context() as context:
            context.background.start_soon(forever)
            await started.wait()
        assert outcome == ["cancelled"]

    async def test_a_background_failure_nobody_collected_is_raised_on_leaving(
        self, make_context: Callable[[], FederatedContext]
    ) -> None:
        progress: list[str] = []

        async def fail() -> None:
            raise KeyError("evaluation of round 3")

        with pytest.raises(KeyError, match="evaluation of round 3"):
            async with make_context() as context:
                context.background.start_soon(fail)
                await anyio.wait_all_tasks_blocked()
                progress.append("the program went on")
        assert progress == ["the program went on"]
