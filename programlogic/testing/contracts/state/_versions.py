"""Tests of the program-state suite: which versions a manager saves, lists and removes."""

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
from managers.state.base import ProgramStateManager
from programlogic.testing.contracts.state._support import state_of

__all__ = ["VersionTests"]


class VersionTests:
    """How versions are numbered, listed, refused and removed."""

    # Versions

    async def test_load_latest_returns_the_newest_version(
        self, manager: ProgramStateManager
    ) -> None:
        for version in (1, 4, 9):
            await manager.save(state_of(version), version)
        assert await manager.load_latest() == (state_of(9), 9)

    async def test_versions_are_listed_ascending(self, manager: ProgramStateManager) -> None:
        for version in (0, 2, 3, 10, 11):
            await manager.save(state_of(version), version)
        assert await manager.get_versions() == [0, 2, 3, 10, 11]

    async def test_saving_an_existing_version_raises_version_exists_error(
        self, manager: ProgramStateManager
    ) -> None:
        await manager.save(state_of(1), 1)
        await manager.save(state_of(3), 3)
        for version in (3, 1):
            with pytest.raises(VersionExistsError, match=f"version {version}") as raised:
                await manager.save(state_of(99), version)
            assert isinstance(raised.value, VersionError)
            assert isinstance(raised.value, ValueError)
            assert isinstance(raised.value, ManagerError)
        assert await manager.load(3) == state_of(3)
        assert await manager.get_versions() == [1, 3]

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
        await manager.remove(2)
        assert await manager.get_versions() == [1, 3]
        with pytest.raises(VersionNotFoundError):
            await manager.load(2)
        assert await manager.load(1) == state_of(1)
        assert await manager.load(3) == state_of(3)

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
        assert await manager.load_latest() == (state_of(1), 1)
        replacement = {**state_of(2), "name": "replacement"}
        await manager.save(replacement, 2)
        assert await manager.get_versions() == [1, 2]
        assert await manager.load_latest() == (replacement, 2)

    async def test_removing_an_older_version_still_rejects_lower_than_the_newest(
        self, manager: ProgramStateManager
    ) -> None:
        await manager.save(state_of(1), 1)
        await manager.save(state_of(3), 3)
        await manager.remove(1)
        with pytest.raises(VersionError, match="lower than the newest"):
            await manager.save(state_of(2), 2)
        assert await manager.get_versions() == [3]
