"""Tests of the program-state suite: cancelled saves, restarts and closing."""

from __future__ import annotations

import anyio
import pytest

from managers.exceptions import VersionError, VersionExistsError
from managers.state.base import ProgramStateManager
from programlogic.testing.contracts._base import cancel_after
from programlogic.testing.contracts.state._support import StateManagerFactory, state_of

__all__ = ["LifecycleTests"]


class LifecycleTests:
    """What a manager keeps when a save is cancelled, the program restarts or it closes."""

    persistent: bool
    """Whether the versions outlive their manager: see :class:`ProgramStateManagerContract`."""

    # Failures and cancellation

    async def test_a_cancelled_save_leaves_the_whole_version_or_none_of_it(
        self, manager: ProgramStateManager
    ) -> None:
        await manager.save(state_of(0), 0)
        for version in range(1, 25):  # cancelled after 0, 1, ... checkpoints of the saver
            with anyio.CancelScope() as scope:
                async with anyio.create_task_group() as group:
                    group.start_soon(cancel_after, scope, version - 1)
                    await manager.save(state_of(version), version)
            versions = await manager.get_versions()
            assert versions[0] == 0 and versions == sorted(versions)
            assert set(versions) <= set(range(version + 1))
            for saved in versions:
                assert await manager.load(saved) == state_of(saved)
        state, version = await manager.load_latest()
        assert state == state_of(version)

    # Restarts

    async def test_a_restarted_manager_resumes_from_the_saved_versions(
        self, state_manager_factory: StateManagerFactory
    ) -> None:
        if not self.persistent:
            pytest.skip("the versions do not outlive their manager")
        async with state_manager_factory() as first:
            for version in (0, 2):
                await first.save(state_of(version), version)
        async with state_manager_factory() as restarted:
            assert await restarted.get_versions() == [0, 2]
            assert await restarted.load_latest() == (state_of(2), 2)
            with pytest.raises(VersionExistsError):
                await restarted.save(state_of(2), 2)
            with pytest.raises(VersionError, match="lower than the newest"):
                await restarted.save(state_of(1), 1)
            await restarted.save(state_of(3), 3)
        async with state_manager_factory() as again:
            assert await again.load_latest() == (state_of(3), 3)

    # Closing

    async def test_async_with_returns_the_manager_and_closes_it(
        self, state_manager_factory: StateManagerFactory
    ) -> None:
        created = state_manager_factory()
        async with created as entered:
            assert entered is created
            await entered.save(state_of(0), 0)
            assert await entered.load_latest() == (state_of(0), 0)

    async def test_async_with_propagates_errors(
        self, state_manager_factory: StateManagerFactory
    ) -> None:
        with pytest.raises(RuntimeError, match="inside"):
            async with state_manager_factory():
                raise RuntimeError("inside")

    async def test_aclose_may_be_called_twice(
        self, state_manager_factory: StateManagerFactory
    ) -> None:
        created = state_manager_factory()
        await created.save(state_of(0), 0)
        assert await created.aclose() is None
        assert await created.aclose() is None
