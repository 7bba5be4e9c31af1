"""Every program-state manager of the library held to the contract suite."""

from __future__ import annotations

from pathlib import Path

import pytest

from managers import FileProgramStateManager, MemoryProgramStateManager
from programlogic.testing import CrashingStateManager
from programlogic.testing.contracts import ProgramStateManagerContract

NEVER_SAVED = 2**62
"""A version the suite never saves: the crashing manager below never crashes."""


class TestMemoryProgramStateManager(ProgramStateManagerContract):
    @pytest.fixture
    def state_manager_factory(self):
        return MemoryProgramStateManager


class TestMemoryProgramStateManagerKeepingAll(ProgramStateManagerContract):
    """Retention that keeps more versions than the suite saves changes nothing it sees."""

    @pytest.fixture
    def state_manager_factory(self):
        return lambda: MemoryProgramStateManager(keep_total=100)


class TestFileProgramStateManager(ProgramStateManagerContract):
    persistent = True

    @pytest.fixture
    def state_manager_factory(self, tmp_path: Path):
        return lambda: FileProgramStateManager(tmp_path / "state")


class TestCrashingStateManager(ProgramStateManagerContract):
    """The crash-injecting wrapper, set to crash at a version never saved, is transparent."""

    persistent = True

    @pytest.fixture
    def state_manager_factory(self, tmp_path: Path):
        return lambda: CrashingStateManager(
            FileProgramStateManager(tmp_path / "state"), crash_on_version=NEVER_SAVED
        )
