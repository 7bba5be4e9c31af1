"""Fakes for testing code that takes value references, such as a release manager.

Example, a test that a manager materializes what it is given::

    async def test_my_manager_releases_values():
        manager = MyReleaseManager()
        await manager.release({"loss": FakeValueReference(0.5)}, 1)
        assert my_manager_contents(manager) == {1: {"loss": 0.5}}
"""

from __future__ import annotations

from typing import Any

import anyio

from managers.validation import check_int, check_type

__all__ = ["FakeValueReference"]


class FakeValueReference:
    """A value reference whose ``get_value()`` gives ``value``, or raises ``error``.

    Each call first waits for ``gate`` to be set (when one is given), then yields to the
    scheduler ``delay`` times, so that concurrent references finish in an order a test
    chooses and a caller that awaits without yielding is noticed. ``calls`` counts the
    calls of ``get_value``.

    Example, a release that stays in flight until the test lets it finish::

        reference = FakeValueReference({"loss": 0.5}, gate=anyio.Event())
        async with anyio.create_task_group() as group:
            group.start_soon(manager.release, reference, 1)
            ...  # the release is waiting for its value here
            reference.gate.set()
    """

    def __init__(
        self,
        value: Any = None,
        *,
        error: BaseException | None = None,
        delay: int = 1,
        gate: anyio.Event | None = None,
    ) -> None:
        self.value = value
        self.error = check_type("error", error, BaseException, allow_none=True)
        self.delay = check_int("delay", delay, minimum=0)
        self.gate = check_type("gate", gate, anyio.Event, allow_none=True)
        self.calls = 0

    async def get_value(self) -> Any:
        """``value``, or raises ``error``, once ``gate`` is set and ``delay`` yields later."""
        self.calls += 1
        if self.gate is not None:
            await self.gate.wait()
        for _ in range(self.delay):
            await anyio.sleep(0)
        if self.error is not None:
            raise self.error
        return self.value
