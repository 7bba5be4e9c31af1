"""programlogic.managers is the managers package under another name: same objects."""

from __future__ import annotations

import importlib
import sys

import pytest

import managers
import managers.release.base
import managers.state.memory
import programlogic.managers

pytestmark = pytest.mark.anyio


async def test_classes_are_the_same_objects():
    assert programlogic.managers.MemoryReleaseManager is managers.MemoryReleaseManager
    assert programlogic.managers.MemoryProgramStateManager is managers.MemoryProgramStateManager
    assert programlogic.managers.VersionNotFoundError is managers.VersionNotFoundError


async def test_all_is_the_same():
    assert programlogic.managers.__all__ == managers.__all__
    for name in managers.__all__:
        assert getattr(programlogic.managers, name) is getattr(managers, name)


async def test_import_submodule_gives_the_same_module_object():
    import programlogic.managers.state.memory

    assert programlogic.managers.state.memory is managers.state.memory
    assert sys.modules["programlogic.managers.state.memory"] is managers.state.memory


async def test_import_module_gives_the_same_module_objects():
    assert importlib.import_module("programlogic.managers.state.memory") is managers.state.memory
    assert importlib.import_module("programlogic.managers.state") is managers.state
    release_base = importlib.import_module("programlogic.managers.release.base")
    assert release_base is managers.release.base
    assert programlogic.managers.structure is importlib.import_module("managers.structure")


async def test_from_import_submodule():
    from programlogic.managers.release import memory

    assert memory is importlib.import_module("managers.release.memory")
    assert memory.MemoryReleaseManager is managers.MemoryReleaseManager
