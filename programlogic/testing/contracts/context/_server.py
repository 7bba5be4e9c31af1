"""Tests of the federated-context suite: server-side steps run by ``run``."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import anyio
import pytest

from programlogic.context import FederatedContext
from programlogic.testing.contracts.context._work import (
    _raise_key_error,
    _until_exists,
    _wait_for_go,
    _where,
)

__all__ = ["ServerStepTests"]


class ServerStepTests:
    """``run`` computes off the event loop thread and returns, or raises, what the step does."""

    async def test_run_returns_the_result_computed_off_the_event_loop_thread(
        self, make_context: Callable[[], FederatedContext]
    ) -> None:
        async with make_context() as context:
            where = await context.run(_where)
            assert await context.run(pow, 2, 10) == 1024
        assert where != _where()

    async def test_run_lets_the_event_loop_run_while_it_computes(
        self, make_context: Callable[[], FederatedContext], tmp_path: Path
    ) -> None:
        async with make_context() as context, anyio.create_task_group() as group:
            saw_go: list[bool] = []

            async def step() -> None:
                saw_go.append(await context.run(_wait_for_go, str(tmp_path), "step"))

            group.start_soon(step)
            await _until_exists(tmp_path / "started-step")
            (tmp_path / "go").touch()
        assert saw_go == [True]

    async def test_an_error_of_run_propagates_unchanged(
        self, make_context: Callable[[], FederatedContext]
    ) -> None:
        async with make_context() as context:
            with pytest.raises(KeyError, match="server step 3"):
                await context.run(_raise_key_error, "server step 3")
            assert await context.run(pow, 3, 2) == 9
