"""MemoryProgramStateManager beyond the shared contract: retention and arguments."""

from __future__ import annotations

import dataclasses
from typing import NamedTuple

import pytest

from managers import MemoryProgramStateManager, VersionNotFoundError

pytestmark = pytest.mark.anyio


class Point(NamedTuple):
    x: int
    y: int


@dataclasses.dataclass
class Box:
    items: list


async def test_keep_total_none_keeps_every_version():
    manager = MemoryProgramStateManager()
    for version in range(20):
        await manager.save({"v": version}, version)
    assert await manager.get_versions() == list(range(20))


async def test_keep_total_keeps_newest_versions():
    manager = MemoryProgramStateManager(keep_total=3)
    for version in (0, 1, 2, 5, 8):
        await manager.save({"v": version}, version)
    assert await manager.get_versions() == [2, 5, 8]
    with pytest.raises(VersionNotFoundError):
        await manager.load(1)
    assert await manager.load(2) == {"v": 2}
    assert await manager.load_latest() == ({"v": 8}, 8)


async def test_keep_total_not_reached_keeps_all():
    manager = MemoryProgramStateManager(keep_total=3)
    await manager.save({"v": 0}, 0)
    await manager.save({"v": 1}, 1)
    assert await manager.get_versions() == [0, 1]


async def test_keep_total_one_keeps_the_version_just_written():
    manager = MemoryProgramStateManager(keep_total=1)
    for version in (0, 1, 2):
        await manager.save({"v": version}, version)
        assert await manager.get_versions() == [version]
        assert await manager.load_latest() == ({"v": version}, version)


async def test_keep_total_counts_after_removal():
    manager = MemoryProgramStateManager(keep_total=2)
    await manager.save({"v": 0}, 0)
    await manager.save({"v": 1}, 1)
    await manager.remove(1)
    await manager.save({"v": 2}, 2)
    assert await manager.get_versions() == [0, 2]
    await manager.save({"v": 3}, 3)
    assert await manager.get_versions() == [2, 3]


@pytest.mark.parametrize(
    ("keep_total", "error", "found"),
    [
        (0, ValueError, "0"),
        (-1, ValueError, "-1"),
        (True, TypeError, "bool True"),
        (1.5, TypeError, "float 1.5"),
        ("3", TypeError, "str '3'"),
    ],
)
async def test_invalid_keep_total(keep_total, error, found):
    with pytest.raises(error, match=rf"^keep_total must be an int >= 1 or None, got {found}$"):
        MemoryProgramStateManager(keep_total=keep_total)


async def test_load_without_structure_keeps_saved_container_types():
    manager = MemoryProgramStateManager()
    state = {"p": Point(1, 2), "box": Box(items=[3]), "t": (4, 5)}
    await manager.save(state, 0)
    loaded = await manager.load(0)
    assert loaded == state
    assert type(loaded["p"]) is Point
    assert type(loaded["box"]) is Box
    assert type(loaded["t"]) is tuple
    assert loaded["box"] is not state["box"]
    assert loaded["box"].items is not state["box"].items


async def test_saved_dataclass_is_a_snapshot():
    manager = MemoryProgramStateManager()
    box = Box(items=[1])
    await manager.save(box, 0)
    box.items.append(2)
    assert await manager.load(0) == Box(items=[1])


async def test_load_missing_version_lists_saved_versions():
    manager = MemoryProgramStateManager()
    await manager.save({}, 3)
    await manager.save({}, 7)
    with pytest.raises(VersionNotFoundError, match=r"version 5; saved: \[3, 7\]"):
        await manager.load(5)
