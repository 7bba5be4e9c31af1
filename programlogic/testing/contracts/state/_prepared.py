"""Tests of the state suite: a save whose write the manager prepares for a batch."""

from __future__ import annotations

import numpy as np
import pytest

from managers.state.base import ProgramStateManager
from managers.writes import PreparedWrite, WriteBatch, preparer

__all__ = ["PreparedSaveTests"]


async def prepared(manager: ProgramStateManager, state: object, version: int) -> PreparedWrite:
    """``manager.prepare_save(state, version)``; skips the test for a manager that does
    not prepare its writes."""
    prepare = preparer(manager, "save")
    if prepare is None:
        pytest.skip("the manager does not prepare its writes (it has no prepare_save)")
    write = await prepare(state, version)
    assert isinstance(write, PreparedWrite), (
        f"prepare_save must return a PreparedWrite, got {write!r}"
    )
    return write


class PreparedSaveTests:
    """A manager that offers ``prepare_save`` (see :mod:`managers.writes`): the version
    is saved once a batch made the write, and a dropped one is never saved."""

    async def test_a_prepared_save_is_made_by_the_flush_as_save_makes_it(
        self, manager: ProgramStateManager
    ) -> None:
        await manager.save({"w": np.zeros(3)}, 0)
        batch = WriteBatch()
        batch.add(await prepared(manager, {"w": np.ones(3)}, 1))
        await batch.flush()
        assert 1 in await manager.get_versions()
        np.testing.assert_array_equal((await manager.load(1))["w"], np.ones(3))

    async def test_a_dropped_prepared_save_is_never_saved_and_the_version_can_be_saved(
        self, manager: ProgramStateManager
    ) -> None:
        await manager.save({"w": np.zeros(3)}, 0)
        before = await manager.get_versions()
        batch = WriteBatch()
        batch.add(await prepared(manager, {"w": np.ones(3)}, 1))
        batch.drop()
        assert await manager.get_versions() == before, "a dropped prepared save was saved"
        await manager.save({"w": np.full(3, 2.0)}, 1)
        np.testing.assert_array_equal((await manager.load(1))["w"], np.full(3, 2.0))

    async def test_a_failed_prepared_save_raises_at_the_flush_and_saves_nothing(
        self, manager: ProgramStateManager
    ) -> None:
        await manager.save({"w": np.zeros(3)}, 3)
        batch = WriteBatch()
        try:
            write = await prepared(manager, {"w": np.ones(3)}, 3)  # exists already
        except Exception:
            return  # refused when prepared: as good
        batch.add(write)
        with pytest.raises(Exception, match="3"):
            await batch.flush()
        np.testing.assert_array_equal((await manager.load(3))["w"], np.zeros(3))
