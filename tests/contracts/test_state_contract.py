"""Every program-state manager of the library held to the contract suite, at the
retention settings the docs show: each declares its retention, and the suite expects
the versions it keeps with no override."""

from __future__ import annotations

from pathlib import Path

import pytest

from managers import FileProgramStateManager, MemoryProgramStateManager, ProgramStateManager
from programlogic.testing import CrashingStateManager
from programlogic.testing.contracts import ProgramStateManagerContract, StateDamage

NEVER_SAVED = 2**62
"""A version the suite never saves: the crashing manager below never crashes."""


def damage_file(manager: ProgramStateManager, version: int) -> None:
    """Overwrite the file of ``version`` with bytes that are not a payload."""
    files = getattr(manager, "inner", manager)  # the crashing manager wraps a file manager
    (files.root_dir / f"program_state_{version}.plstate").write_bytes(b"damaged")


class TestMemoryProgramStateManager(ProgramStateManagerContract):
    @pytest.fixture
    def state_manager_factory(self):
        return MemoryProgramStateManager


class TestMemoryProgramStateManagerKeepingAll(ProgramStateManagerContract):
    """Retention that keeps more versions than the suite saves changes nothing it sees."""

    @pytest.fixture
    def state_manager_factory(self):
        return lambda: MemoryProgramStateManager(keep_total=100)


class TestMemoryProgramStateManagerKeepingThree(ProgramStateManagerContract):
    @pytest.fixture
    def state_manager_factory(self):
        return lambda: MemoryProgramStateManager(keep_total=3)


class TestMemoryProgramStateManagerKeepingOne(ProgramStateManagerContract):
    """As a periodic or best-model manager's cadence store keeps its one record."""

    @pytest.fixture
    def state_manager_factory(self):
        return lambda: MemoryProgramStateManager(keep_total=1)


class TestFileProgramStateManager(ProgramStateManagerContract):
    persistent = True

    @pytest.fixture
    def state_manager_factory(self, tmp_path: Path):
        return lambda: FileProgramStateManager(tmp_path / "state")

    @pytest.fixture
    def state_damage(self, tmp_path: Path):
        fresh = tmp_path / "fresh"
        return StateDamage(
            damage_file, lambda: FileProgramStateManager(fresh, on_all_damaged="start_fresh")
        )


class TestFileProgramStateManagerKeepingThree(TestFileProgramStateManager):
    @pytest.fixture
    def state_manager_factory(self, tmp_path: Path):
        return lambda: FileProgramStateManager(tmp_path / "state", keep_total=3)


class TestFileProgramStateManagerNotKeepingTheFirst(TestFileProgramStateManager):
    @pytest.fixture
    def state_manager_factory(self, tmp_path: Path):
        return lambda: FileProgramStateManager(tmp_path / "state", keep_first=False)


class TestFileProgramStateManagerKeepingOne(TestFileProgramStateManager):
    @pytest.fixture
    def state_manager_factory(self, tmp_path: Path):
        return lambda: FileProgramStateManager(tmp_path / "state", keep_total=1, keep_first=False)


class TestFileProgramStateManagerKeepingEvery(TestFileProgramStateManager):
    @pytest.fixture
    def state_manager_factory(self, tmp_path: Path):
        return lambda: FileProgramStateManager(
            tmp_path / "state", keep_total=2, keep_first=False, keep_every=5
        )


class TestFileProgramStateManagerKeepingAll(TestFileProgramStateManager):
    @pytest.fixture
    def state_manager_factory(self, tmp_path: Path):
        return lambda: FileProgramStateManager(tmp_path / "state", keep_total=None)


class TestCrashingStateManager(ProgramStateManagerContract):
    """The crash-injecting wrapper, set to crash at a version never saved, is transparent,
    its inner manager's retention included."""

    persistent = True

    @pytest.fixture
    def state_manager_factory(self, tmp_path: Path):
        return lambda: CrashingStateManager(
            FileProgramStateManager(tmp_path / "state", keep_total=3, keep_first=False),
            crash_on_version=NEVER_SAVED,
        )

    @pytest.fixture
    def state_damage(self, tmp_path: Path):
        return StateDamage(
            damage_file,
            lambda: CrashingStateManager(
                FileProgramStateManager(tmp_path / "fresh", on_all_damaged="start_fresh"),
                crash_on_version=NEVER_SAVED,
            ),
        )
