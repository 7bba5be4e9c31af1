"""GroupingReleaseManager beyond the shared contract: fan-out and how failures surface."""

from __future__ import annotations

from typing import Any

import anyio
import pytest

from managers import MemoryReleaseManager, ReleaseManager
from managers.release.grouping import GroupingReleaseManager
from managers.testing import FakeValueReference

pytestmark = pytest.mark.anyio


class FailingReleaseManager(ReleaseManager):
    """Fails every release (and close) with ``error``, after a pause."""

    def __init__(self, error: Exception) -> None:
        self.error = error

    async def release(self, value: Any, key: Any) -> None:
        await anyio.sleep(0)
        raise self.error

    async def aclose(self) -> None:
        raise self.error


class SlowReleaseManager(MemoryReleaseManager):
    """A memory manager that takes a few scheduling steps to store a value."""

    async def release(self, value: Any, key: Any) -> None:
        for _ in range(5):
            await anyio.sleep(0)
        await super().release(value, key)


class ClosingReleaseManager(MemoryReleaseManager):
    def __init__(self) -> None:
        super().__init__()
        self.closed = 0

    async def aclose(self) -> None:
        self.closed += 1


async def test_releases_to_every_manager():
    first, second, third = MemoryReleaseManager(), MemoryReleaseManager(), MemoryReleaseManager()
    group = GroupingReleaseManager([first, second, third])
    assert group.managers == (first, second, third)
    await group.release({"loss": 0.5}, 1)
    await group.release({"loss": 0.25}, "final")
    for manager in (first, second, third):
        assert manager.values() == {1: {"loss": 0.5}, "final": {"loss": 0.25}}


async def test_value_is_materialized_once_and_shared():
    first, second = MemoryReleaseManager(), MemoryReleaseManager()
    reference = FakeValueReference({"weights": [1.0, 2.0]})
    await GroupingReleaseManager([first, second]).release({"model": reference}, 3)
    assert reference.calls == 1
    assert first.values() == {3: {"model": {"weights": [1.0, 2.0]}}}
    assert first.values()[3] is second.values()[3]


async def test_one_failure_is_raised_as_itself_and_the_healthy_managers_hold_the_value():
    healthy, slow = MemoryReleaseManager(), SlowReleaseManager()
    error = OSError("disk full")
    group = GroupingReleaseManager([healthy, FailingReleaseManager(error), slow])
    with pytest.raises(OSError, match="disk full") as raised:
        await group.release({"loss": 0.5}, 1)
    assert raised.value is error
    assert healthy.values() == {1: {"loss": 0.5}}
    assert slow.values() == {1: {"loss": 0.5}}  # not cancelled by its sibling's failure


async def test_several_failures_are_raised_together_in_an_exception_group():
    healthy = SlowReleaseManager()
    first, second = OSError("disk full"), ValueError("bad value")
    group = GroupingReleaseManager(
        [FailingReleaseManager(first), healthy, FailingReleaseManager(second)]
    )
    with pytest.raises(ExceptionGroup, match=r"2 of 3 release managers failed to release key 7"):
        await group.release({"loss": 0.5}, 7)
    try:
        await group.release({"loss": 0.25}, 7)
    except ExceptionGroup as raised:
        assert raised.exceptions == (first, second)
    assert healthy.values() == {7: {"loss": 0.25}}


async def test_calls_of_one_key_are_handed_on_in_call_order():
    class NaiveReleaseManager(MemoryReleaseManager):
        """Stores a value after a pause as long as the value says: the last to finish wins."""

        async def release(self, value: Any, key: Any) -> None:
            for _ in range(value["pause"]):
                await anyio.sleep(0)
            await super().release(value, key)

    naive = NaiveReleaseManager()
    group = GroupingReleaseManager([naive])
    async with anyio.create_task_group() as tasks:
        tasks.start_soon(group.release, {"pause": 20, "call": "first"}, 1)
        await anyio.sleep(0)
        tasks.start_soon(group.release, {"pause": 1, "call": "second"}, 1)
    assert naive.values() == {1: {"pause": 1, "call": "second"}}


async def test_failing_reference_reaches_no_manager():
    memory = MemoryReleaseManager()

    with pytest.raises(RuntimeError, match="no value"):
        await GroupingReleaseManager([memory]).release(
            {"loss": FakeValueReference(error=RuntimeError("no value"))}, 1
        )
    assert memory.values() == {}


async def test_empty_group_checks_keys_and_materializes():
    group = GroupingReleaseManager([])
    reference = FakeValueReference(1)
    await group.release(reference, 1)
    assert reference.calls == 1
    with pytest.raises(TypeError, match="release key must be an int or a str, got float"):
        await group.release(1, 1.0)


async def test_aclose_closes_every_manager():
    first, second = ClosingReleaseManager(), ClosingReleaseManager()
    async with GroupingReleaseManager([first, second]):
        pass
    assert (first.closed, second.closed) == (1, 1)


async def test_aclose_closes_the_healthy_managers_and_raises_every_failure():
    healthy = ClosingReleaseManager()
    group = GroupingReleaseManager(
        [FailingReleaseManager(OSError("a")), healthy, FailingReleaseManager(OSError("b"))]
    )
    with pytest.raises(ExceptionGroup, match=r"2 of 3 release managers failed to close"):
        await group.aclose()
    assert healthy.closed == 1


async def test_managers_from_any_iterable():
    memory = MemoryReleaseManager()
    group = GroupingReleaseManager(manager for manager in [memory])
    await group.release(1, 1)
    assert memory.values() == {1: 1}


@pytest.mark.parametrize(
    ("managers", "message"),
    [
        (MemoryReleaseManager(), r"managers must be an iterable of ReleaseManager, got Memory"),
        (None, r"managers must be an iterable of ReleaseManager, got NoneType"),
        ([MemoryReleaseManager(), "csv"], r"managers\[1\] must be a ReleaseManager, got str 'csv'"),
    ],
    ids=["one-manager", "none", "not-a-manager"],
)
async def test_invalid_managers_raise_type_error(managers, message):
    with pytest.raises(TypeError, match=message):
        GroupingReleaseManager(managers)
