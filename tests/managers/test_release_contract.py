"""The contract every ReleaseManager implementation fulfils.

To run the suite against another implementation, add one more ``pytest.param`` to
``RELEASE_MANAGER_FACTORIES``: a callable taking the test's ``tmp_path`` and returning
``(manager, read_back)``, where ``read_back()`` returns the dict key -> value the manager
holds (for a file manager: what it wrote, read back from ``tmp_path``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any, NamedTuple

import anyio
import numpy as np
import pytest

from managers import MemoryReleaseManager, ReleaseManager

pytestmark = pytest.mark.anyio

ReadBack = Callable[[], dict[Any, Any]]


def _memory(tmp_path: Path) -> tuple[ReleaseManager, ReadBack]:
    manager = MemoryReleaseManager()
    return manager, manager.values


RELEASE_MANAGER_FACTORIES = [
    pytest.param(_memory, id="memory"),
]


ReleaseManagerFactory = Callable[[], tuple[ReleaseManager, ReadBack]]


@pytest.fixture(params=RELEASE_MANAGER_FACTORIES)
def release_manager_factory(
    request: pytest.FixtureRequest, tmp_path: Path
) -> ReleaseManagerFactory:
    """A zero-argument callable returning a new ``(manager, read_back)`` pair."""
    factory = request.param
    return lambda: factory(tmp_path)


@pytest.fixture
async def release_manager(
    release_manager_factory: ReleaseManagerFactory,
) -> AsyncIterator[tuple[ReleaseManager, ReadBack]]:
    manager, read_back = release_manager_factory()
    async with manager:
        yield manager, read_back


class Later:
    def __init__(self, value: Any, delay: int = 1) -> None:
        self.value = value
        self.delay = delay

    async def get_value(self) -> Any:
        for _ in range(self.delay):
            await anyio.sleep(0)
        return self.value


class Metrics(NamedTuple):
    loss: Any
    accuracy: Any


@dataclasses.dataclass
class Summary:
    rounds: Any


async def test_is_a_release_manager(release_manager):
    manager, read_back = release_manager
    assert isinstance(manager, ReleaseManager)
    assert read_back() == {}


async def test_release_is_read_back(release_manager):
    manager, read_back = release_manager
    await manager.release({"loss": 0.5, "accuracy": 0.75}, 1)
    assert read_back() == {1: {"loss": 0.5, "accuracy": 0.75}}


async def test_re_release_replaces_value_and_leaves_other_keys_alone(release_manager):
    manager, read_back = release_manager
    await manager.release({"loss": 1.0}, 1)
    await manager.release({"loss": 2.0}, 2)
    await manager.release({"loss": 3.0}, 3)
    await manager.release({"loss": 2.5}, 2)
    assert read_back() == {1: {"loss": 1.0}, 2: {"loss": 2.5}, 3: {"loss": 3.0}}


async def test_re_release_same_value_does_not_duplicate(release_manager):
    manager, read_back = release_manager
    for _ in range(3):
        await manager.release({"loss": 1.0}, 7)
    assert read_back() == {7: {"loss": 1.0}}


async def test_out_of_order_keys(release_manager):
    manager, read_back = release_manager
    for key in (5, 2, 9, 1):
        await manager.release({"round": key}, key)
    assert read_back() == {key: {"round": key} for key in (1, 2, 5, 9)}


async def test_int_and_str_keys(release_manager):
    manager, read_back = release_manager
    await manager.release({"loss": 0.1}, 0)
    await manager.release({"weights": [1.0, 2.0]}, "final_training_checkpoint_round_100")
    assert read_back() == {
        0: {"loss": 0.1},
        "final_training_checkpoint_round_100": {"weights": [1.0, 2.0]},
    }


async def test_int_and_str_keys_are_distinct(release_manager):
    manager, read_back = release_manager
    await manager.release("int", 1)
    await manager.release("str", "1")
    assert read_back() == {1: "int", "1": "str"}


@pytest.mark.parametrize(
    ("key", "type_name"),
    [(True, "bool"), (False, "bool"), (1.0, "float"), (None, "NoneType"), ((1,), "tuple")],
    ids=["true", "false", "float", "none", "tuple"],
)
async def test_invalid_key_raises_type_error(release_manager, key, type_name):
    manager, read_back = release_manager
    await manager.release({"loss": 0.5}, 1)
    with pytest.raises(TypeError, match=rf"release key must be an int or a str, got {type_name}"):
        await manager.release({"loss": 9.0}, key)
    assert read_back() == {1: {"loss": 0.5}}


async def test_value_references_are_materialized(release_manager):
    manager, read_back = release_manager
    await manager.release(
        {"loss": Later(0.25), "nested": {"accuracy": Later(0.9), "count": 3}, "ids": [Later(1)]},
        4,
    )
    assert read_back() == {4: {"loss": 0.25, "nested": {"accuracy": 0.9, "count": 3}, "ids": [1]}}


async def test_root_value_reference_is_materialized(release_manager):
    manager, read_back = release_manager
    await manager.release(Later("model"), "final")
    assert read_back() == {"final": "model"}


async def test_structured_values_with_references(release_manager):
    manager, read_back = release_manager
    await manager.release(
        {"metrics": Metrics(loss=Later(0.5), accuracy=0.5), "summary": Summary(rounds=Later(3))},
        1,
    )
    held = read_back()[1]
    assert held["metrics"] == Metrics(loss=0.5, accuracy=0.5)
    assert held["summary"] == Summary(rounds=3)


async def test_numpy_values(release_manager):
    manager, read_back = release_manager
    await manager.release({"weights": Later(np.arange(3.0)), "bias": np.ones(2)}, 1)
    held = read_back()[1]
    np.testing.assert_array_equal(held["weights"], [0.0, 1.0, 2.0])
    np.testing.assert_array_equal(held["bias"], [1.0, 1.0])


async def test_failing_reference_raises_and_keeps_other_keys(release_manager):
    manager, read_back = release_manager

    class Failing:
        async def get_value(self) -> Any:
            await anyio.sleep(0)
            raise OSError("disk full")

    await manager.release({"loss": 1.0}, 1)
    with pytest.raises(OSError, match="disk full"):
        await manager.release({"loss": Failing()}, 2)
    with pytest.raises(OSError, match="disk full"):
        await manager.release({"loss": Failing()}, 1)
    assert read_back() == {1: {"loss": 1.0}}


async def test_concurrent_releases_all_land(release_manager):
    manager, read_back = release_manager
    count = 50
    with anyio.fail_after(10):
        async with anyio.create_task_group() as group:
            for key in range(count):
                value = {"round": Later(key, delay=(key * 7) % 5), "name": f"r{key}"}
                group.start_soon(manager.release, value, key)
            for key in range(count):
                group.start_soon(manager.release, Later(f"s{key}", delay=key % 3), f"s{key}")
    held = read_back()
    expected = {key: {"round": key, "name": f"r{key}"} for key in range(count)}
    expected.update({f"s{key}": f"s{key}" for key in range(count)})
    assert held == expected


async def test_async_context_manager(release_manager_factory):
    manager, read_back = release_manager_factory()
    async with manager as entered:
        assert entered is manager
        await entered.release({"loss": 0.5}, 1)
    assert read_back() == {1: {"loss": 0.5}}


async def test_async_context_manager_propagates_errors(release_manager_factory):
    manager, _ = release_manager_factory()
    with pytest.raises(RuntimeError, match="inside"):
        async with manager:
            raise RuntimeError("inside")


async def test_overlapping_releases_of_one_key_keep_the_last_call(release_manager):
    manager, read_back = release_manager
    async with anyio.create_task_group() as group:
        group.start_soon(manager.release, Later("first, slow", delay=20), 1)
        await anyio.sleep(0)
        group.start_soon(manager.release, Later("second, fast", delay=1), 1)
    assert read_back() == {1: "second, fast"}
