"""The contract every ReleaseManager implementation fulfils.

To run the suite against another implementation, add one more ``pytest.param`` to
``RELEASE_MANAGER_FACTORIES``: a callable taking the test's ``tmp_path`` and returning
``(manager, read_back)`` or ``(manager, read_back, capabilities)``, where ``read_back()``
returns the dict key -> value the manager holds (for a file manager: what it wrote, read
back from ``tmp_path``) and ``capabilities`` (a :class:`Capabilities`) says what its
storage cannot hold, so that the tests expect what it can.
"""

from __future__ import annotations

import csv
import dataclasses
import re
from collections.abc import AsyncIterator, Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, NamedTuple

import anyio
import numpy as np
import orjson
import pytest

from managers import MemoryReleaseManager, ReleaseManager
from managers.release.csv_file import CSVFileReleaseManager
from managers.release.delayed import DelayedReleaseManager
from managers.release.filtering import FilteringReleaseManager
from managers.release.grouping import GroupingReleaseManager
from managers.release.jsonl import JSONLinesReleaseManager
from managers.release.periodic import PeriodicReleaseManager
from managers.structure import flatten

pytestmark = pytest.mark.anyio

ReadBack = Callable[[], dict[Any, Any]]


def _unchanged(value: Any) -> Any:
    return value


@dataclasses.dataclass(frozen=True)
class Capabilities:
    """What a manager's storage holds, for the tests to expect what it can."""

    str_keys: bool = True
    """Whether it takes str keys (TensorBoard steps are ints)."""
    arrays: bool = True
    """Whether it holds arrays; one that does not raises TypeError naming the path."""
    normalize: Callable[[Any], Any] = _unchanged
    """A released plain value as ``read_back`` returns it (CSV and JSON have no tuples)."""


class Subject(NamedTuple):
    manager: ReleaseManager
    read_back: ReadBack
    capabilities: Capabilities = Capabilities()


def _memory(tmp_path: Path) -> tuple[ReleaseManager, ReadBack]:
    manager = MemoryReleaseManager()
    return manager, manager.values


# CSV: the file is parsed here with the csv module, independently of the manager.

_INT = re.compile(r"0|-?[1-9][0-9]*")


def _read_csv(path: Path) -> dict[Any, Any]:
    if not path.exists():
        return {}
    with open(path, encoding="utf-8", newline="") as file:
        header, *rows = list(csv.reader(file))
    held = {}
    for key_cell, *cells in rows:
        named = zip(header[1:], cells, strict=True)  # every row has a cell per column
        pairs = [(path, _csv_number(cell)) for path, cell in named if cell]
        held[_csv_key(key_cell)] = _nest(pairs)
    return held


def _csv_key(cell: str) -> int | str:
    if cell.startswith("'"):
        return cell[1:]
    return int(cell) if _INT.fullmatch(cell) else cell


def _csv_number(cell: str) -> Any:
    if _INT.fullmatch(cell):
        return int(cell)
    try:
        return float(cell)
    except ValueError:
        return cell


def _nest(pairs: list[tuple[str, Any]]) -> Any:
    """Nested dicts from ``(path, leaf)`` pairs; the leaf itself for the path ``""``."""
    if [path for path, _ in pairs] == [""]:
        return pairs[0][1]
    nested: dict[str, Any] = {}
    for path, leaf in pairs:
        *parents, name = path.split("/")
        node = nested
        for parent in parents:
            node = node.setdefault(parent, {})
        node[name] = leaf
    return nested


def _as_csv_holds(value: Any) -> Any:
    return _nest([(path, _plain_scalar(leaf)) for path, leaf in flatten(value)])


def _plain_scalar(leaf: Any) -> Any:
    return leaf.item() if isinstance(leaf, np.generic) else leaf


def _csv(tmp_path: Path) -> tuple[ReleaseManager, ReadBack, Capabilities]:
    path = tmp_path / "releases.csv"
    capabilities = Capabilities(arrays=False, normalize=_as_csv_holds)
    return CSVFileReleaseManager(path), lambda: _read_csv(path), capabilities


def _read_jsonl(path: Path) -> dict[Any, Any]:
    if not path.exists():
        return {}
    records = [orjson.loads(line) for line in path.read_bytes().splitlines()]
    return {record["key"]: record["value"] for record in records}


def _as_json_holds(value: Any) -> Any:
    if isinstance(value, dict):
        return {name: _as_json_holds(child) for name, child in value.items()}
    if isinstance(value, list | tuple):
        return [_as_json_holds(child) for child in value]
    if dataclasses.is_dataclass(value):
        return _as_json_holds(dataclasses.asdict(value))
    if isinstance(value, np.ndarray | np.generic):
        return value.tolist()
    return value


def _jsonl(tmp_path: Path) -> tuple[ReleaseManager, ReadBack, Capabilities]:
    path = tmp_path / "releases.jsonl"
    capabilities = Capabilities(normalize=_as_json_holds)
    return JSONLinesReleaseManager(path), lambda: _read_jsonl(path), capabilities


# Wrappers, with settings that pass everything on to a memory manager.


class _Hourly:
    """A clock that moves on an hour each time it is read."""

    def __init__(self) -> None:
        self.time = datetime(2026, 1, 1, tzinfo=UTC)

    def now(self) -> datetime:
        self.time += timedelta(hours=1)
        return self.time


def _periodic(tmp_path: Path) -> tuple[ReleaseManager, ReadBack]:
    memory = MemoryReleaseManager()
    return PeriodicReleaseManager(memory, 1), memory.values


def _periodic_timedelta(tmp_path: Path) -> tuple[ReleaseManager, ReadBack]:
    memory = MemoryReleaseManager()
    manager = PeriodicReleaseManager(memory, timedelta(minutes=30), clock=_Hourly())
    return manager, memory.values


def _delayed(tmp_path: Path) -> tuple[ReleaseManager, ReadBack]:
    memory = MemoryReleaseManager()
    return DelayedReleaseManager(memory, 0), memory.values


def _filtering(tmp_path: Path) -> tuple[ReleaseManager, ReadBack]:
    memory = MemoryReleaseManager()
    return FilteringReleaseManager(memory, lambda path: True), memory.values


def _grouping(tmp_path: Path) -> tuple[ReleaseManager, ReadBack]:
    memory = MemoryReleaseManager()
    return GroupingReleaseManager([memory]), memory.values


def _grouping_of_two(tmp_path: Path) -> tuple[ReleaseManager, ReadBack]:
    first, second = MemoryReleaseManager(), MemoryReleaseManager()

    def read_back() -> dict[Any, Any]:
        held = first.values()
        assert second.values() == held
        return held

    return GroupingReleaseManager([first, second]), read_back


def _stacked(tmp_path: Path) -> tuple[ReleaseManager, ReadBack]:
    memory = MemoryReleaseManager()
    manager = FilteringReleaseManager(
        GroupingReleaseManager([DelayedReleaseManager(PeriodicReleaseManager(memory, 1), 0)]),
        lambda path: True,
    )
    return manager, memory.values


RELEASE_MANAGER_FACTORIES = [
    pytest.param(_memory, id="memory"),
    pytest.param(_csv, id="csv"),
    pytest.param(_jsonl, id="jsonl"),
    pytest.param(_periodic, id="periodic"),
    pytest.param(_periodic_timedelta, id="periodic-timedelta"),
    pytest.param(_delayed, id="delayed"),
    pytest.param(_filtering, id="filtering"),
    pytest.param(_grouping, id="grouping"),
    pytest.param(_grouping_of_two, id="grouping-of-two"),
    pytest.param(_stacked, id="stacked-wrappers"),
]


ReleaseManagerFactory = Callable[[], tuple[ReleaseManager, ReadBack]]


@pytest.fixture(params=RELEASE_MANAGER_FACTORIES)
def release_subject_factory(
    request: pytest.FixtureRequest, tmp_path: Path
) -> Callable[[], Subject]:
    """A zero-argument callable returning a new :class:`Subject`."""
    factory = request.param
    return lambda: Subject(*factory(tmp_path))


@pytest.fixture
def release_manager_factory(
    release_subject_factory: Callable[[], Subject],
) -> ReleaseManagerFactory:
    """A zero-argument callable returning a new ``(manager, read_back)`` pair."""
    return lambda: release_subject_factory()[:2]


@pytest.fixture
async def release_subject(
    release_subject_factory: Callable[[], Subject],
) -> AsyncIterator[Subject]:
    subject = release_subject_factory()
    async with subject.manager:
        yield subject


@pytest.fixture
def release_manager(release_subject: Subject) -> tuple[ReleaseManager, ReadBack]:
    return release_subject.manager, release_subject.read_back


@pytest.fixture
def capabilities(release_subject: Subject) -> Capabilities:
    return release_subject.capabilities


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


async def test_int_and_str_keys(release_manager, capabilities):
    if not capabilities.str_keys:
        pytest.skip("the manager takes int keys only")
    manager, read_back = release_manager
    await manager.release({"loss": 0.1}, 0)
    await manager.release({"weights": [1.0, 2.0]}, "final_training_checkpoint_round_100")
    assert read_back() == {
        0: {"loss": 0.1},
        "final_training_checkpoint_round_100": capabilities.normalize({"weights": [1.0, 2.0]}),
    }


async def test_int_and_str_keys_are_distinct(release_manager, capabilities):
    if not capabilities.str_keys:
        pytest.skip("the manager takes int keys only")
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


async def test_value_references_are_materialized(release_manager, capabilities):
    manager, read_back = release_manager
    await manager.release(
        {"loss": Later(0.25), "nested": {"accuracy": Later(0.9), "count": 3}, "ids": [Later(1)]},
        4,
    )
    expected = {"loss": 0.25, "nested": {"accuracy": 0.9, "count": 3}, "ids": [1]}
    assert read_back() == {4: capabilities.normalize(expected)}


async def test_root_value_reference_is_materialized(release_manager, capabilities):
    manager, read_back = release_manager
    key = "final" if capabilities.str_keys else 100
    await manager.release(Later("model"), key)
    assert read_back() == {key: "model"}


async def test_structured_values_with_references(release_manager, capabilities):
    manager, read_back = release_manager
    await manager.release(
        {"metrics": Metrics(loss=Later(0.5), accuracy=0.5), "summary": Summary(rounds=Later(3))},
        1,
    )
    held = read_back()[1]
    assert held["metrics"] == capabilities.normalize(Metrics(loss=0.5, accuracy=0.5))
    assert held["summary"] == capabilities.normalize(Summary(rounds=3))


async def test_numpy_values(release_manager, capabilities):
    manager, read_back = release_manager
    if not capabilities.arrays:
        with pytest.raises(TypeError, match=r"path 'weights'.* array of shape \(3,\)"):
            await manager.release({"weights": Later(np.arange(3.0)), "bias": np.ones(2)}, 1)
        assert read_back() == {}
        return
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


async def test_concurrent_releases_all_land(release_manager, capabilities):
    manager, read_back = release_manager
    count = 50
    str_keys = [f"s{key}" for key in range(count)] if capabilities.str_keys else []
    with anyio.fail_after(10):
        async with anyio.create_task_group() as group:
            for key in range(count):
                value = {"round": Later(key, delay=(key * 7) % 5), "name": f"r{key}"}
                group.start_soon(manager.release, value, key)
            for index, key in enumerate(str_keys):
                group.start_soon(manager.release, Later(key, delay=index % 3), key)
    held = read_back()
    expected = {key: {"round": key, "name": f"r{key}"} for key in range(count)}
    expected.update({key: key for key in str_keys})
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


def _open_files_under(directory: Path) -> list[str]:
    """The files under ``directory`` this process holds open (Linux's /proc/self/fd)."""
    held = []
    for descriptor in Path("/proc/self/fd").iterdir():
        try:
            target = descriptor.readlink()
        except OSError:
            continue  # closed since the listing
        if target.is_relative_to(directory):
            held.append(str(target))
    return held


@pytest.mark.skipif(not Path("/proc/self/fd").is_dir(), reason="needs Linux's /proc/self/fd")
async def test_leaving_on_cancellation_closes_the_files(release_manager_factory, tmp_path):
    manager, read_back = release_manager_factory()
    with anyio.CancelScope() as scope:
        async with manager:
            await manager.release({"loss": 0.5}, 1)
            scope.cancel()
            await anyio.sleep(1)  # cancelled here; leaving closes the manager all the same
    assert scope.cancelled_caught
    assert _open_files_under(tmp_path) == []
    assert read_back() == {1: {"loss": 0.5}}
