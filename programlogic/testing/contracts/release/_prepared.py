"""Tests of the release suite: a release whose write the manager prepares for a batch."""

from __future__ import annotations

import pytest

from managers.release.base import ReleaseManager
from managers.writes import PreparedWrite, WriteBatch, preparer
from programlogic.testing.contracts.release._support import ReleaseSubject, held_by, holds

__all__ = ["PreparedWriteTests"]


def prepare_of(manager: ReleaseManager):
    """``manager``'s ``prepare_release`` as a batching caller would use it; skips the
    test for a manager that does not prepare its writes."""
    prepare = preparer(manager, "release")
    if prepare is None:
        pytest.skip("the manager does not prepare its writes (it has no prepare_release)")
    return prepare


async def prepared(manager: ReleaseManager, value: object, key: int) -> PreparedWrite | None:
    write = await prepare_of(manager)(value, key)
    assert write is None or isinstance(write, PreparedWrite), (
        f"prepare_release must return a PreparedWrite or None, got {write!r}"
    )
    return write


class PreparedWriteTests:
    """A manager that offers ``prepare_release`` (see :mod:`managers.writes`): what its
    write holds once a batch made it, and that nothing is written before."""

    async def test_a_prepared_release_is_written_by_the_flush_as_release_writes_it(
        self, subject: ReleaseSubject, manager: ReleaseManager
    ) -> None:
        await manager.release({"loss": 1.0}, 1)
        batch = WriteBatch()
        for key in (2, 3):
            write = await prepared(manager, {"loss": float(key)}, key)
            if write is not None:
                batch.add(write)
        await batch.flush()
        await holds(subject, {1: {"loss": 1.0}, 2: {"loss": 2.0}, 3: {"loss": 3.0}})

    async def test_a_prepared_release_writes_nothing_before_its_flush(
        self, subject: ReleaseSubject, manager: ReleaseManager
    ) -> None:
        """A caller that batches a round's save and releases relies on it: the release
        reaches storage only after the save made before it in the batch."""
        await manager.release({"loss": 1.0}, 1)
        write = await prepared(manager, {"loss": 2.0}, 2)
        assert write is not None, "a new key's release must prepare a write"
        held = await held_by(subject)
        assert 2 not in held, "prepare_release wrote its value before the batch made its write"
        batch = WriteBatch()
        batch.add(write)
        await batch.flush()
        await holds(subject, {1: {"loss": 1.0}, 2: {"loss": 2.0}})

    async def test_a_dropped_prepared_release_leaves_the_other_keys_and_the_manager_goes_on(
        self, subject: ReleaseSubject, manager: ReleaseManager
    ) -> None:
        await manager.release({"loss": 1.0}, 1)
        batch = WriteBatch()
        write = await prepared(manager, {"loss": 2.0}, 2)
        if write is not None:
            batch.add(write)
        batch.drop()
        held = await held_by(subject)
        assert set(held) <= {1, 2} and 1 in held
        await manager.release({"loss": 3.0}, 3)
        held = await held_by(subject)
        assert {1, 3} <= set(held), f"after a dropped batch, a release must still land: {held}"
        # A dropped write may be written by a later release (the manager kept it), but
        # only whole: the key then holds the value prepared for it.
        expected = {1: {"loss": 1.0}, 3: {"loss": 3.0}}
        if 2 in held:
            expected[2] = {"loss": 2.0}
        await holds(subject, expected)
