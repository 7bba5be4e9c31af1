"""What every contract suite builds on: each test runs under asyncio and trio."""

from __future__ import annotations

import anyio
import anyio.lowlevel
import pytest

__all__ = ["Contract", "cancel_after"]


@pytest.mark.anyio
class Contract:
    """A contract suite: subclass it in a ``test_*.py`` file as ``Test...`` and give it a
    factory fixture; every test method is a coroutine that anyio's pytest plugin runs
    once under asyncio and once under trio.

    Override :meth:`anyio_backend` in a subclass to narrow the backends (an
    implementation that only runs on asyncio, such as one driving Ray, returns
    ``["asyncio"]`` params).
    """

    @pytest.fixture(params=["asyncio", "trio"])
    def anyio_backend(self, request: pytest.FixtureRequest) -> str:
        """The async backend the test runs on."""
        return request.param


async def cancel_after(scope: anyio.CancelScope, checkpoints: int) -> None:
    """Cancel ``scope`` once this task has passed ``checkpoints`` scheduling points."""
    for _ in range(checkpoints):
        await anyio.lowlevel.checkpoint()
    scope.cancel()
