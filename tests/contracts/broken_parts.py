"""Broken implementations, one per promise, that the contract kit must fail.

Not a test module of the suite (pytest does not collect it by its name):
``test_kit_catches_broken_parts.py`` runs chosen tests of each class below in a fresh
pytest process, as a user's test file, and checks that each broken part fails them and
that the correct parts beside them pass the same tests. Each break is one line away
from a correct manager, so that what fails is the promise, not something else.
"""

from __future__ import annotations

import time
from typing import Any

import anyio
import anyio.from_thread
import anyio.to_thread
import pytest

from managers import (
    FileProgramStateManager,
    MemoryProgramStateManager,
    PreparedWrite,
    ReleaseManager,
    Retention,
    WriteQueue,
    materialize,
)
from managers.release.base import ReleaseKey, check_key
from programlogic.testing.contracts import (
    ProgramStateManagerContract,
    ReleaseManagerContract,
    ReleaseSubject,
)

BLOCKS_S = 0.4
"""How long a blocking part holds the event loop: over the suites' loop_stall_limit."""

SHIELDED_S = 1.0
"""How long a part that ignores its cancellation goes on: over the suites' cancel_grace."""


# Release managers


class LatestReleaseManager(ReleaseManager):
    """Correct: keeps the latest value released under each key."""

    def __init__(self) -> None:
        self.latest: dict[ReleaseKey, Any] = {}
        self._lock = anyio.Lock()

    async def release(self, value: Any, key: ReleaseKey) -> None:
        check_key(key)
        async with self._lock:
            self.latest[key] = await self.store(await materialize(value))

    async def store(self, value: Any) -> Any:
        """What is stored for ``value``, once it is."""
        return value


class BlockingReleaseManager(LatestReleaseManager):
    """Writes on the event loop: a synchronous sleep stands for a blocking write."""

    async def store(self, value: Any) -> Any:
        time.sleep(BLOCKS_S)
        return value


class ShieldedReleaseManager(LatestReleaseManager):
    """Shields its write from cancellation: cancelled, it returns a second later, written."""

    async def release(self, value: Any, key: ReleaseKey) -> None:
        check_key(key)
        with anyio.CancelScope(shield=True):
            materialized = await materialize(value)
            await anyio.sleep(SHIELDED_S)
            self.latest[key] = materialized


class AbandoningReleaseManager(LatestReleaseManager):
    """Returns at once when cancelled, but abandons its write to a thread that lands later."""

    async def release(self, value: Any, key: ReleaseKey) -> None:
        check_key(key)
        materialized = await materialize(value)

        def slow_write() -> None:
            time.sleep(0.3)
            self.latest[key] = materialized

        await anyio.to_thread.run_sync(slow_write, abandon_on_cancel=True)


class PreparingReleaseManager(LatestReleaseManager):
    """Correct: prepares its writes for a batch (and makes them itself in ``release``)."""

    def __init__(self) -> None:
        super().__init__()
        self._writes = WriteQueue()

    async def release(self, value: Any, key: ReleaseKey) -> None:
        await (await self.prepare_release(value, key)).make()

    async def prepare_release(self, value: Any, key: ReleaseKey) -> PreparedWrite:
        check_key(key)
        return self._writes.prepare(self.latest.__setitem__, key, await materialize(value))


class EagerPreparingReleaseManager(PreparingReleaseManager):
    """Writes when it prepares, before the batch makes anything: a release that lands
    before the save a batch makes first."""

    async def prepare_release(self, value: Any, key: ReleaseKey) -> PreparedWrite:
        check_key(key)
        self.latest[key] = await materialize(value)
        return self._writes.prepare(lambda: None)


class _ReleaseSuite(ReleaseManagerContract):
    manager_class: type[LatestReleaseManager] = LatestReleaseManager

    @pytest.fixture
    def subject(self) -> ReleaseSubject:
        manager = self.manager_class()
        return ReleaseSubject(manager, read_back=lambda: dict(manager.latest))


class TestLatestReleaseManager(_ReleaseSuite):
    pass


class TestBlockingReleaseManager(_ReleaseSuite):
    manager_class = BlockingReleaseManager


class TestShieldedReleaseManager(_ReleaseSuite):
    manager_class = ShieldedReleaseManager


class TestAbandoningReleaseManager(_ReleaseSuite):
    manager_class = AbandoningReleaseManager


class TestPreparingReleaseManager(_ReleaseSuite):
    manager_class = PreparingReleaseManager


class TestEagerPreparingReleaseManager(_ReleaseSuite):
    manager_class = EagerPreparingReleaseManager


# Program-state managers


class BlockingSaveStateManager(MemoryProgramStateManager):
    """Saves on the event loop: a synchronous sleep stands for a blocking write."""

    async def save(self, state: Any, version: int) -> None:
        time.sleep(BLOCKS_S)
        await super().save(state, version)


class BlockingLoadStateManager(MemoryProgramStateManager):
    """Loads on the event loop: the watchdog watches every call, not only saves."""

    async def load(self, version: int, structure: Any = None) -> Any:
        time.sleep(BLOCKS_S)
        return await super().load(version, structure)


class ShieldedSaveStateManager(MemoryProgramStateManager):
    """Shields its save from cancellation: cancelled, it returns a second later, saved."""

    async def save(self, state: Any, version: int) -> None:
        with anyio.CancelScope(shield=True):
            await anyio.sleep(SHIELDED_S)
            await super().save(state, version)


class AbandoningSaveStateManager(MemoryProgramStateManager):
    """Returns at once when cancelled, but abandons its save to a thread that lands later."""

    async def save(self, state: Any, version: int) -> None:
        save = super().save

        def slow_save() -> None:
            time.sleep(0.3)
            anyio.from_thread.run(save, state, version)

        await anyio.to_thread.run_sync(slow_save, abandon_on_cancel=True)


class IgnoresKeepTotalStateManager(MemoryProgramStateManager):
    """Declares that it keeps the newest two versions, and keeps every one."""

    @property
    def retention(self) -> Retention | None:
        return Retention(keep_total=2)


class DeletesTheVersionJustSavedStateManager(MemoryProgramStateManager):
    """Declares keep_total=2, and its retention keeps the oldest two instead."""

    @property
    def retention(self) -> Retention | None:
        return Retention(keep_total=2)

    async def save(self, state: Any, version: int) -> None:
        await super().save(state, version)
        for old in (await self.get_versions())[2:]:
            await self.remove(old)


class DeletesUndeclaredStateManager(MemoryProgramStateManager):
    """Keeps the newest three versions, and declares that it keeps every one."""

    def __init__(self) -> None:
        super().__init__(keep_total=3)

    @property
    def retention(self) -> Retention | None:
        return None


class _StateSuite(ProgramStateManagerContract):
    manager_class: type[MemoryProgramStateManager] = MemoryProgramStateManager

    @pytest.fixture
    def state_manager_factory(self) -> type[MemoryProgramStateManager]:
        return self.manager_class


class TestMemoryProgramStateManager(_StateSuite):
    pass


class TestKeepingTwoStateManager(_StateSuite):
    """Correct, at the retention the retention parts declare."""

    @pytest.fixture
    def state_manager_factory(self) -> Any:
        return lambda: MemoryProgramStateManager(keep_total=2)


class TestBlockingSaveStateManager(_StateSuite):
    manager_class = BlockingSaveStateManager


class TestBlockingLoadStateManager(_StateSuite):
    manager_class = BlockingLoadStateManager


class TestShieldedSaveStateManager(_StateSuite):
    manager_class = ShieldedSaveStateManager


class TestAbandoningSaveStateManager(_StateSuite):
    manager_class = AbandoningSaveStateManager


class TestIgnoresKeepTotalStateManager(_StateSuite):
    manager_class = IgnoresKeepTotalStateManager


class TestDeletesTheVersionJustSavedStateManager(_StateSuite):
    manager_class = DeletesTheVersionJustSavedStateManager


class TestDeletesUndeclaredStateManager(_StateSuite):
    manager_class = DeletesUndeclaredStateManager


class ForgetfulPreparingStateManager(FileProgramStateManager):
    """Prepares a write that saves nothing: a batch flushed, the version is not there."""

    async def prepare_save(self, state: Any, version: int) -> PreparedWrite:
        return WriteQueue().prepare(lambda: None)


class TestFileProgramStateManager(ProgramStateManagerContract):
    """Correct: prepares its saves for a batch."""

    @pytest.fixture
    def state_manager_factory(self, tmp_path: Any) -> Any:
        return lambda: FileProgramStateManager(tmp_path / "state", keep_total=None)


class TestForgetfulPreparingStateManager(ProgramStateManagerContract):
    @pytest.fixture
    def state_manager_factory(self, tmp_path: Any) -> Any:
        return lambda: ForgetfulPreparingStateManager(tmp_path / "state", keep_total=None)
