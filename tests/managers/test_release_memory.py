"""MemoryReleaseManager beyond the shared contract: ordering, max_entries, values()."""

from __future__ import annotations

from typing import Any

import anyio
import pytest

from managers import MemoryReleaseManager
from managers.testing import FakeValueReference

pytestmark = pytest.mark.anyio


async def test_values_empty():
    assert MemoryReleaseManager().values() == {}


async def test_values_ordered_by_first_release():
    manager = MemoryReleaseManager()
    for key in (3, "final", 1, 2):
        await manager.release(f"v{key}", key)
    assert list(manager.values()) == [3, "final", 1, 2]


async def test_re_release_keeps_position():
    manager = MemoryReleaseManager()
    for key in (1, 2, 3):
        await manager.release(f"v{key}", key)
    await manager.release("new", 1)
    assert list(manager.values().items()) == [(1, "new"), (2, "v2"), (3, "v3")]


async def test_values_are_stored_materialized():
    manager = MemoryReleaseManager()
    await manager.release({"loss": FakeValueReference(0.5)}, 1)
    assert manager.values() == {1: {"loss": 0.5}}


async def test_value_without_references_is_stored_without_copying():
    manager = MemoryReleaseManager()
    value = {"loss": 0.5}
    await manager.release(value, 1)
    assert manager.values()[1] is value


async def test_max_entries_drops_earliest_keys():
    manager = MemoryReleaseManager(max_entries=3)
    for key in range(1, 6):
        await manager.release(f"v{key}", key)
    assert list(manager.values().items()) == [(3, "v3"), (4, "v4"), (5, "v5")]


async def test_max_entries_re_release_does_not_drop():
    manager = MemoryReleaseManager(max_entries=2)
    await manager.release("a", 1)
    await manager.release("b", 2)
    await manager.release("b2", 2)
    await manager.release("a2", 1)
    assert list(manager.values().items()) == [(1, "a2"), (2, "b2")]


async def test_max_entries_drops_by_first_release_even_after_re_release():
    manager = MemoryReleaseManager(max_entries=2)
    await manager.release("a", 1)
    await manager.release("b", 2)
    await manager.release("a2", 1)  # keeps its first position
    await manager.release("c", 3)
    assert list(manager.values().items()) == [(2, "b"), (3, "c")]


async def test_max_entries_one_keeps_the_key_just_released():
    manager = MemoryReleaseManager(max_entries=1)
    for key in (5, 1, "final", 9):
        await manager.release(f"v{key}", key)
        assert manager.values() == {key: f"v{key}"}


async def test_max_entries_never_drops_key_just_released_out_of_order():
    manager = MemoryReleaseManager(max_entries=2)
    await manager.release("v9", 9)
    await manager.release("v8", 8)
    await manager.release("v1", 1)
    assert list(manager.values()) == [8, 1]


async def test_values_returns_a_copy():
    manager = MemoryReleaseManager()
    await manager.release("v1", 1)
    snapshot = manager.values()
    snapshot[2] = "injected"
    del snapshot[1]
    assert manager.values() == {1: "v1"}
    assert manager.values() is not manager.values()


async def test_failing_release_keeps_previous_value():
    manager = MemoryReleaseManager(max_entries=1)
    await manager.release("kept", 1)
    with pytest.raises(RuntimeError, match="no value"):
        await manager.release(FakeValueReference(error=RuntimeError("no value")), 2)
    assert manager.values() == {1: "kept"}


@pytest.mark.parametrize(
    ("max_entries", "error", "found"),
    [
        (0, ValueError, "0"),
        (-1, ValueError, "-1"),
        (True, TypeError, "bool True"),
        (1.5, TypeError, "float 1.5"),
        ("2", TypeError, "str '2'"),
    ],
)
async def test_invalid_max_entries(max_entries, error, found):
    with pytest.raises(error, match=rf"^max_entries must be an int >= 1 or None, got {found}$"):
        MemoryReleaseManager(max_entries=max_entries)


def gated(value: Any = None, *, error: Exception | None = None) -> FakeValueReference:
    """A reference that gives ``value``, or raises ``error``, once its gate is set."""
    return FakeValueReference(value, error=error, delay=0, gate=anyio.Event())


async def overlapping_releases(
    manager: MemoryReleaseManager,
    first: FakeValueReference,
    second: FakeValueReference,
    opening: tuple[FakeValueReference, ...],
) -> list[Exception]:
    """Release ``first`` then ``second`` under key 1, open their gates in ``opening`` order."""
    failures: list[Exception] = []

    async def release(reference: FakeValueReference) -> None:
        try:
            await manager.release(reference, 1)
        except RuntimeError as error:
            failures.append(error)

    async with anyio.create_task_group() as group:
        group.start_soon(release, first)
        await anyio.wait_all_tasks_blocked()
        group.start_soon(release, second)
        await anyio.wait_all_tasks_blocked()
        for reference in opening:
            reference.gate.set()
            await anyio.wait_all_tasks_blocked()
    return failures


@pytest.mark.parametrize("first_finishes_first", [True, False])
async def test_a_failed_later_release_leaves_the_earlier_success(first_finishes_first):
    manager = MemoryReleaseManager()
    await manager.release("before", 1)
    first, second = gated("first"), gated(error=RuntimeError("second failed"))
    opening = (first, second) if first_finishes_first else (second, first)
    failures = await overlapping_releases(manager, first, second, opening)
    assert [str(error) for error in failures] == ["second failed"]
    assert manager.values() == {1: "first"}


@pytest.mark.parametrize("first_finishes_first", [True, False])
async def test_overlapping_successes_keep_the_one_called_last(first_finishes_first):
    manager = MemoryReleaseManager()
    first, second = gated("first"), gated("second")
    opening = (first, second) if first_finishes_first else (second, first)
    assert await overlapping_releases(manager, first, second, opening) == []
    assert manager.values() == {1: "second"}


async def test_a_failed_release_leaves_what_the_key_held():
    manager = MemoryReleaseManager()
    await manager.release("before", 1)
    first = gated(error=RuntimeError("first failed"))
    second = gated(error=RuntimeError("second failed"))
    failures = await overlapping_releases(manager, first, second, (second, first))
    assert sorted(str(error) for error in failures) == ["first failed", "second failed"]
    assert manager.values() == {1: "before"}
