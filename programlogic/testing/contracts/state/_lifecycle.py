"""Tests of the program-state suite: cancelled saves, restarts and closing.

A cancelled call returns within the suite's ``cancel_grace`` of its cancellation (0.5 s
unless the suite says otherwise) and leaves all of its effect or none: a cancelled save
leaves the versions it found, or those plus its own with retention applied, and nothing
changes them once it returned. The suite cancels saves at each of their first scheduling
points, and once ``CANCEL_AFTER_S`` after the save began.
"""

from __future__ import annotations

import anyio
import pytest

from managers.exceptions import VersionError, VersionExistsError
from managers.state.base import ProgramStateManager
from programlogic.testing.contracts._base import assert_returned_within, call_cancelled_after
from programlogic.testing.contracts.state._support import (
    StateManagerFactory,
    kept_versions,
    make,
    state_of,
)

__all__ = ["CANCEL_AFTER_S", "LifecycleTests"]

CANCEL_AFTER_S = 0.1
"""How long after it began the suite cancels a save in flight, in one test."""


class LifecycleTests:
    """What a manager keeps when a save is cancelled, the program restarts or it closes."""

    persistent: bool
    """Whether the versions outlive their manager: see :class:`ProgramStateManagerContract`."""
    cancel_grace: float
    """How soon a cancelled call returns: see :class:`ProgramStateManagerContract`."""

    # Failures and cancellation

    async def test_a_cancelled_save_leaves_the_whole_version_or_none_of_it(
        self, manager: ProgramStateManager
    ) -> None:
        await manager.save(state_of(0), 0)
        listed = await manager.get_versions()
        for version in range(1, 25):  # cancelled after 0, 1, ... checkpoints of the saver
            late = await call_cancelled_after(
                version - 1, lambda version=version: manager.save(state_of(version), version)
            )
            assert_returned_within(self.cancel_grace, late, f"a save of version {version}")
            versions = await manager.get_versions()
            saved = kept_versions(manager.retention, [version], listed)
            assert versions in (listed, saved), (
                f"a save of version {version} cancelled after {version - 1} scheduling "
                f"points left versions {versions}: neither {listed} (not saved) nor "
                f"{saved} (saved, with retention {manager.retention})"
            )
            for kept in versions:
                assert await manager.load(kept) == state_of(kept)
            listed = versions
        state, version = await manager.load_latest()
        assert state == state_of(version)

    async def test_a_save_cancelled_in_flight_returns_within_the_grace_and_changes_nothing_later(
        self, manager: ProgramStateManager
    ) -> None:
        await manager.save(state_of(0), 0)
        listed = await manager.get_versions()
        with anyio.move_on_after(CANCEL_AFTER_S) as scope:
            await manager.save(state_of(1), 1)
        late = anyio.current_time() - scope.deadline  # < 0: it returned before its cancellation
        assert_returned_within(self.cancel_grace, max(0.0, late), "a save of version 1")
        versions = await manager.get_versions()
        assert versions in (listed, kept_versions(manager.retention, [1], listed))
        if late >= 0:
            await anyio.sleep(self.cancel_grace)  # what it left running, if anything, lands
            assert await manager.get_versions() == versions, (
                "the versions changed after a cancelled save returned"
            )
        for kept in versions:
            assert await manager.load(kept) == state_of(kept)

    # Restarts

    async def test_a_restarted_manager_resumes_from_the_saved_versions(
        self, state_manager_factory: StateManagerFactory
    ) -> None:
        if not self.persistent:
            pytest.skip("the versions do not outlive their manager")
        async with make(state_manager_factory) as first:
            for version in (0, 2):
                await first.save(state_of(version), version)
        async with make(state_manager_factory) as restarted:
            assert await restarted.get_versions() == kept_versions(restarted.retention, [0, 2])
            assert await restarted.load_latest() == (state_of(2), 2)
            with pytest.raises(VersionExistsError):
                await restarted.save(state_of(2), 2)
            with pytest.raises(VersionError, match="lower than the newest"):
                await restarted.save(state_of(1), 1)
            await restarted.save(state_of(3), 3)
        async with make(state_manager_factory) as again:
            assert await again.load_latest() == (state_of(3), 3)

    # Closing

    async def test_async_with_returns_the_manager_and_closes_it(
        self, state_manager_factory: StateManagerFactory
    ) -> None:
        created = make(state_manager_factory)
        async with created as entered:
            assert entered is created
            await entered.save(state_of(0), 0)
            assert await entered.load_latest() == (state_of(0), 0)

    async def test_async_with_propagates_errors(
        self, state_manager_factory: StateManagerFactory
    ) -> None:
        with pytest.raises(RuntimeError, match="inside"):
            async with make(state_manager_factory):
                raise RuntimeError("inside")

    async def test_aclose_may_be_called_twice(
        self, state_manager_factory: StateManagerFactory
    ) -> None:
        created = make(state_manager_factory)
        await created.save(state_of(0), 0)
        assert await created.aclose() is None
        assert await created.aclose() is None
