"""Tests of the program-state suite: which versions a manager saves, lists, keeps and
removes.

A manager that deletes old versions after a save declares how, as its ``retention``
(:class:`~managers.state.base.Retention`); every test here expects the versions that
policy keeps (:func:`~programlogic.testing.contracts.state._support.kept_versions`), so
the library's managers pass at any retention, and one that keeps or deletes other
versions than it declares fails.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from managers.exceptions import (
    ManagerError,
    VersionError,
    VersionExistsError,
    VersionNotFoundError,
)
from managers.state.base import ProgramStateManager, Retention
from programlogic.testing.contracts.state._support import kept_versions, state_of

__all__ = ["VersionTests"]


RETENTION_RUN = (0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 15, 16, 18, 20, 21, 24, 25, 30)
"""Versions saved one after the other to check retention: gaps, and multiples of small
numbers for a ``keep_every``."""


class VersionTests:
    """How versions are numbered, listed, kept, refused and removed."""

    # Versions

    async def test_load_latest_returns_the_newest_version(
        self, manager: ProgramStateManager
    ) -> None:
        for version in (1, 4, 9):
            await manager.save(state_of(version), version)
        assert await manager.load_latest() == (state_of(9), 9)

    async def test_versions_are_listed_ascending(self, manager: ProgramStateManager) -> None:
        saved = [0, 2, 3, 10, 11]
        for version in saved:
            await manager.save(state_of(version), version)
        expected = kept_versions(manager.retention, saved)
        assert await manager.get_versions() == expected, (
            f"after saving versions {saved}, a manager of retention {manager.retention} "
            f"must list {expected}"
        )

    async def test_saving_an_existing_version_raises_version_exists_error(
        self, manager: ProgramStateManager
    ) -> None:
        await manager.save(state_of(1), 1)
        await manager.save(state_of(3), 3)
        kept = kept_versions(manager.retention, [1, 3])
        for version in kept[::-1]:
            with pytest.raises(VersionExistsError, match=f"version {version}") as raised:
                await manager.save(state_of(99), version)
            assert isinstance(raised.value, VersionError)
            assert isinstance(raised.value, ValueError)
            assert isinstance(raised.value, ManagerError)
        assert await manager.load(3) == state_of(3)
        assert await manager.get_versions() == kept

    async def test_saving_a_version_lower_than_the_newest_raises_version_error(
        self, manager: ProgramStateManager
    ) -> None:
        await manager.save(state_of(5), 5)
        with pytest.raises(VersionError, match="version 4 is lower than the newest") as raised:
            await manager.save(state_of(4), 4)
        assert not isinstance(raised.value, VersionExistsError)
        assert await manager.get_versions() == [5]

    @pytest.mark.parametrize(
        ("version", "message"),
        [
            (True, "must be an int, got bool True"),
            (False, "must be an int, got bool False"),
            (-1, "must be >= 0, got -1"),
            (1.0, "must be an int, got float 1.0"),
            ("1", "must be an int, got str '1'"),
            (None, "must be an int, got NoneType None"),
            (np.int64(1), "must be an int, got int64"),
        ],
        ids=["true", "false", "negative", "float", "str", "none", "numpy-int"],
    )
    async def test_an_invalid_version_raises_version_error_naming_it(
        self, manager: ProgramStateManager, version: Any, message: str
    ) -> None:
        await manager.save(state_of(0), 0)
        with pytest.raises(VersionError, match=f"^version {message}"):
            await manager.save(state_of(1), version)
        assert await manager.get_versions() == [0]
        assert await manager.load(0) == state_of(0)

    async def test_loading_a_missing_version_raises_version_not_found_error(
        self, manager: ProgramStateManager
    ) -> None:
        with pytest.raises(VersionNotFoundError):
            await manager.load(0)
        await manager.save(state_of(1), 1)
        with pytest.raises(VersionNotFoundError, match="2") as raised:
            await manager.load(2)
        assert isinstance(raised.value, LookupError)
        assert isinstance(raised.value, ManagerError)

    @pytest.mark.parametrize("version", [True, 1.0, "1", [1]])
    async def test_load_and_remove_of_a_non_int_raise_version_not_found_error(
        self, manager: ProgramStateManager, version: Any
    ) -> None:
        await manager.save({"a": 1}, 1)
        with pytest.raises(VersionNotFoundError):
            await manager.load(version)
        with pytest.raises(VersionNotFoundError):
            await manager.remove(version)
        assert await manager.get_versions() == [1]

    # Removing

    async def test_remove_deletes_one_version(self, manager: ProgramStateManager) -> None:
        for version in (1, 2, 3):
            await manager.save(state_of(version), version)
        kept = kept_versions(manager.retention, [1, 2, 3])
        removed = kept[-2] if len(kept) > 1 else kept[-1]  # one before the newest, if kept
        await manager.remove(removed)
        left = [version for version in kept if version != removed]
        assert await manager.get_versions() == left
        with pytest.raises(VersionNotFoundError):
            await manager.load(removed)
        for version in left:
            assert await manager.load(version) == state_of(version)

    async def test_removing_a_missing_version_raises_version_not_found_error(
        self, manager: ProgramStateManager
    ) -> None:
        with pytest.raises(VersionNotFoundError):
            await manager.remove(0)
        await manager.save(state_of(1), 1)
        with pytest.raises(VersionNotFoundError, match="5"):
            await manager.remove(5)
        assert await manager.get_versions() == [1]

    async def test_remove_all_deletes_every_version(self, manager: ProgramStateManager) -> None:
        await manager.remove_all()
        for version in (0, 1, 2):
            await manager.save(state_of(version), version)
        await manager.remove_all()
        assert await manager.get_versions() == []
        assert await manager.load_latest() == (None, 0)
        with pytest.raises(VersionNotFoundError):
            await manager.load(2)
        await manager.save(state_of(0), 0)
        assert await manager.load_latest() == (state_of(0), 0)

    async def test_removing_the_newest_version_lets_it_be_saved_again(
        self, manager: ProgramStateManager
    ) -> None:
        await manager.save(state_of(1), 1)
        await manager.save(state_of(2), 2)
        await manager.remove(2)
        left = kept_versions(manager.retention, [1, 2])[:-1]
        assert await manager.load_latest() == ((state_of(1), 1) if left else (None, 0))
        replacement = {**state_of(2), "name": "replacement"}
        await manager.save(replacement, 2)
        assert await manager.get_versions() == kept_versions(manager.retention, [2], left)
        assert await manager.load_latest() == (replacement, 2)

    async def test_removing_an_older_version_still_rejects_lower_than_the_newest(
        self, manager: ProgramStateManager
    ) -> None:
        await manager.save(state_of(1), 1)
        await manager.save(state_of(3), 3)
        if 1 in kept_versions(manager.retention, [1, 3]):  # else retention removed it
            await manager.remove(1)
        with pytest.raises(VersionError, match="lower than the newest"):
            await manager.save(state_of(2), 2)
        assert await manager.get_versions() == [3]

    # Retention

    async def test_retention_is_declared_as_a_retention_or_none(
        self, manager: ProgramStateManager
    ) -> None:
        assert manager.retention is None or isinstance(manager.retention, Retention)

    async def test_retention_keeps_exactly_the_versions_it_declares(
        self, manager: ProgramStateManager
    ) -> None:
        retention = manager.retention
        for count, version in enumerate(RETENTION_RUN, start=1):
            await manager.save(state_of(version), version)
            expected = kept_versions(retention, RETENTION_RUN[:count])
            assert await manager.get_versions() == expected, (
                f"after saving versions {list(RETENTION_RUN[:count])}, a manager of "
                f"retention {retention} must list {expected}"
            )
        for version in await manager.get_versions():
            assert await manager.load(version) == state_of(version)

    async def test_the_version_just_saved_is_never_removed(
        self, manager: ProgramStateManager
    ) -> None:
        for version in RETENTION_RUN:
            await manager.save(state_of(version), version)
            assert (await manager.get_versions())[-1:] == [version], (
                f"version {version} is not listed right after its save"
            )
            assert await manager.load_latest() == (state_of(version), version)
