"""Every release manager of the library held to the contract suite.

Each subject reads its storage back independently of the manager: the CSV and JSON
lines files are parsed here, TensorBoard's event files are read with TensorBoard's own
reader, the logging manager's records are captured by a handler.
"""

from __future__ import annotations

import csv
import dataclasses
import itertools
import logging
import re
import sys
import types
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pytest

from managers import (
    BestModelReleaseManager,
    CSVFileReleaseManager,
    DelayedReleaseManager,
    FilteringReleaseManager,
    GroupingReleaseManager,
    JSONLinesReleaseManager,
    LoggingReleaseManager,
    MemoryProgramStateManager,
    MemoryReleaseManager,
    ModelFileReleaseManager,
    PeriodicReleaseManager,
    ReleaseManager,
    TensorBoardReleaseManager,
)
from managers.release.base import ReleaseKey
from managers.serialization import dumps, loads
from managers.structure import flatten
from managers.values import materialize
from programlogic.testing import FakeClock
from programlogic.testing.contracts import Capabilities, ReleaseManagerContract, ReleaseSubject

# TensorBoard's reader imports TensorFlow for file access when it is installed; this is
# TensorBoard's own switch to its built-in stub, so the reader behaves the same everywhere.
sys.modules.setdefault("tensorboard.compat.notf", types.ModuleType("tensorboard.compat.notf"))

from tensorboard.backend.event_processing.event_accumulator import (  # noqa: E402
    EventAccumulator,
)


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


def _plain_scalar(leaf: Any) -> Any:
    return leaf.item() if isinstance(leaf, np.generic) else leaf


# Memory and its wrappers


class TestMemoryReleaseManager(ReleaseManagerContract):
    @pytest.fixture
    def subject(self) -> ReleaseSubject:
        manager = MemoryReleaseManager()
        return ReleaseSubject(manager, manager.values)


class TestBoundedMemoryReleaseManager(TestMemoryReleaseManager):
    """A bound larger than the keys the suite releases drops nothing."""

    @pytest.fixture
    def subject(self) -> ReleaseSubject:
        manager = MemoryReleaseManager(max_entries=1000)
        return ReleaseSubject(manager, manager.values)


class TestPeriodicReleaseManagerEveryKey(ReleaseManagerContract):
    @pytest.fixture
    def subject(self) -> ReleaseSubject:
        memory = MemoryReleaseManager()
        return ReleaseSubject(
            PeriodicReleaseManager(memory, 1),
            memory.values,
            reopen=lambda: PeriodicReleaseManager(memory, 1),
        )


class _Hourly:
    """A clock that moves on an hour each time it is read: every interval has passed."""

    def __init__(self) -> None:
        self.time = datetime(2026, 1, 1, tzinfo=UTC)

    def now(self) -> datetime:
        self.time += timedelta(hours=1)
        return self.time


class TestPeriodicReleaseManagerEveryThirtyMinutes(ReleaseManagerContract):
    @pytest.fixture
    def subject(self) -> ReleaseSubject:
        memory, clock = MemoryReleaseManager(), _Hourly()

        def periodic() -> PeriodicReleaseManager:
            return PeriodicReleaseManager(memory, timedelta(minutes=30), clock=clock)

        return ReleaseSubject(periodic(), memory.values, reopen=periodic)

    async def test_the_cadence_survives_a_restart(self) -> None:
        memory, clock = MemoryReleaseManager(), FakeClock()
        cadence = MemoryProgramStateManager(keep_total=1)

        def periodic() -> PeriodicReleaseManager:
            every = timedelta(minutes=5)
            return PeriodicReleaseManager(memory, every, clock=clock, state_manager=cadence)

        async with periodic() as first:
            await first.release({"loss": 1.0}, 1)
            clock.advance(timedelta(minutes=2))
        async with periodic() as restarted:
            await restarted.release({"loss": 2.0}, 2)  # 2 minutes after round 1: dropped
            clock.advance(timedelta(minutes=3))
            await restarted.release({"loss": 3.0}, 3)  # 5 minutes after round 1: passes
        assert memory.values() == {1: {"loss": 1.0}, 3: {"loss": 3.0}}


class TestDelayedReleaseManager(ReleaseManagerContract):
    @pytest.fixture
    def subject(self) -> ReleaseSubject:
        memory = MemoryReleaseManager()
        return ReleaseSubject(
            DelayedReleaseManager(memory, 0),
            memory.values,
            reopen=lambda: DelayedReleaseManager(memory, 0),
        )


class TestFilteringReleaseManager(ReleaseManagerContract):
    @pytest.fixture
    def subject(self) -> ReleaseSubject:
        memory = MemoryReleaseManager()
        return ReleaseSubject(FilteringReleaseManager(memory, lambda path: True), memory.values)


class TestGroupingReleaseManager(ReleaseManagerContract):
    @pytest.fixture
    def subject(self) -> ReleaseSubject:
        memory = MemoryReleaseManager()
        return ReleaseSubject(GroupingReleaseManager([memory]), memory.values)


class TestGroupingReleaseManagerOfTwo(ReleaseManagerContract):
    """Both managers of the group hold the same."""

    @pytest.fixture
    def subject(self) -> ReleaseSubject:
        first, second = MemoryReleaseManager(), MemoryReleaseManager()

        def read_back() -> dict[Any, Any]:
            held = first.values()
            assert second.values() == held
            return held

        return ReleaseSubject(GroupingReleaseManager([first, second]), read_back)


class TestStackedWrappers(ReleaseManagerContract):
    @pytest.fixture
    def subject(self) -> ReleaseSubject:
        memory = MemoryReleaseManager()
        manager = FilteringReleaseManager(
            GroupingReleaseManager([DelayedReleaseManager(PeriodicReleaseManager(memory, 1), 0)]),
            lambda path: True,
        )
        return ReleaseSubject(manager, memory.values)


# Logging: read back from the records a handler captured


class _Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)

    def released(self) -> dict[Any, Any]:
        """Key -> the value last logged for it."""
        held = {}
        for record in self.records:
            assert record.msg == "released key %r: %r"
            key, value = record.args
            held[key] = value
        return held


class TestLoggingReleaseManager(ReleaseManagerContract):
    @pytest.fixture
    def subject(self, request: pytest.FixtureRequest) -> Iterator[ReleaseSubject]:
        logger = logging.getLogger(f"tests.contracts.{request.node.nodeid}")
        records = _Records()
        logger.addHandler(records)
        logger.setLevel(logging.INFO)
        try:
            yield ReleaseSubject(
                LoggingReleaseManager(logger),
                records.released,
                Capabilities(idempotent=False),
            )
        finally:
            logger.removeHandler(records)


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
        assert _csv_key(key_cell) not in held, f"key {key_cell} has two rows"
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


def _as_csv_holds(value: Any) -> Any:
    return _nest([(path, _plain_scalar(leaf)) for path, leaf in flatten(value)])


class TestCSVFileReleaseManager(ReleaseManagerContract):
    @pytest.fixture
    def subject(self, tmp_path: Path) -> ReleaseSubject:
        path = tmp_path / "releases.csv"
        return ReleaseSubject(
            CSVFileReleaseManager(path),
            lambda: _read_csv(path),
            Capabilities(arrays=False, normalize=_as_csv_holds),
            reopen=lambda: CSVFileReleaseManager(path),
        )


# JSON lines: parsed here with orjson.


def _read_jsonl(path: Path) -> dict[Any, Any]:
    if not path.exists():
        return {}
    held = {}
    for line in path.read_bytes().splitlines():
        record = orjson.loads(line)
        assert record["key"] not in held, f"key {record['key']!r} has two lines"
        held[record["key"]] = record["value"]
    return held


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


class TestJSONLinesReleaseManager(ReleaseManagerContract):
    @pytest.fixture
    def subject(self, tmp_path: Path) -> ReleaseSubject:
        path = tmp_path / "releases.jsonl"
        return ReleaseSubject(
            JSONLinesReleaseManager(path),
            lambda: _read_jsonl(path),
            Capabilities(normalize=_as_json_holds),
            reopen=lambda: JSONLinesReleaseManager(path),
        )


# TensorBoard: read back with TensorBoard's own event reader.


def _read_tensorboard(directory: Path) -> dict[int, Any]:
    """Step -> the points TensorBoard shows at that step, nested by tag."""
    reader = EventAccumulator(str(directory), size_guidance={"scalars": 0, "histograms": 0})
    reader.Reload()
    points: dict[int, list[tuple[str, Any]]] = {}
    for tag in reader.Tags()["scalars"]:
        for event in reader.Scalars(tag):
            points.setdefault(event.step, []).append((tag, event.value))
    for tag in reader.Tags()["histograms"]:
        for event in reader.Histograms(tag):
            histogram = event.histogram_value
            summary = ("histogram", histogram.num, histogram.min, histogram.max)
            points.setdefault(event.step, []).append((tag, summary))
    for step, pairs in points.items():
        tags = [tag for tag, _ in pairs]
        assert len(set(tags)) == len(tags), f"TensorBoard shows step {step} twice in {tags}"
    return {step: _nest(sorted(pairs)) for step, pairs in points.items()}


def _as_tensorboard_holds(value: Any) -> Any:
    pairs = []
    for path, leaf in flatten(value):
        if isinstance(leaf, str | bytes | bool) or leaf is None:
            continue
        array = np.asarray(leaf, dtype=np.float64)
        if array.size == 1:
            point: Any = float(np.float32(array.reshape(())))
        else:
            point = ("histogram", float(array.size), float(array.min()), float(array.max()))
        pairs.append((path or "value", point))
    return _nest(sorted(pairs))


class TestTensorBoardReleaseManager(ReleaseManagerContract):
    @pytest.fixture
    def subject(self, tmp_path: Path) -> ReleaseSubject:
        directory = tmp_path / "tensorboard"
        return ReleaseSubject(
            TensorBoardReleaseManager(directory),
            lambda: _read_tensorboard(directory) if directory.exists() else {},
            Capabilities(str_keys=False, idempotent=False, normalize=_as_tensorboard_holds),
            reopen=lambda: TensorBoardReleaseManager(directory),
        )


# Model files: read back by a second manager over the same directory.


def _as_model_file_holds(value: Any) -> Any:
    """What the codec loads without a template: NamedTuples as tuples, dataclasses as dicts."""
    if isinstance(value, dict):
        return {name: _as_model_file_holds(child) for name, child in value.items()}
    if isinstance(value, list):
        return [_as_model_file_holds(child) for child in value]
    if isinstance(value, tuple):
        return tuple(_as_model_file_holds(child) for child in value)
    if dataclasses.is_dataclass(value):
        return {
            field.name: _as_model_file_holds(getattr(value, field.name))
            for field in dataclasses.fields(value)
        }
    return value


class TestModelFileReleaseManager(ReleaseManagerContract):
    @pytest.fixture
    def subject(self, tmp_path: Path) -> ReleaseSubject:
        root = tmp_path / "models"

        async def read_back() -> dict[Any, Any]:
            reader = ModelFileReleaseManager(root)
            return {key: await reader.load(key) for key in await reader.keys()}

        return ReleaseSubject(
            ModelFileReleaseManager(root),
            read_back,
            Capabilities(normalize=_as_model_file_holds),
            reopen=lambda: ModelFileReleaseManager(root),
        )


# Keras models: each released value is encoded as the weights of a small Keras model (its
# codec bytes in the kernel of a dense layer), when the manager materializes it; the
# weights are read back from the .keras files with Keras and from the SavedModels'
# variables with TensorFlow's checkpoint reader, and must agree.

_CODE_SIZE = 2048


def _code_model() -> Any:
    from programlogic.learning._tensorflow import keras

    return keras.Sequential(
        [keras.Input((_CODE_SIZE,)), keras.layers.Dense(1, use_bias=False, name="code")]
    )


class _AsWeights:
    """A value reference: ``value``, materialized, as the weights of the code model."""

    def __init__(self, value: Any) -> None:
        self.value = value

    async def get_value(self) -> Any:
        code = np.frombuffer(dumps(await materialize(self.value)), dtype=np.uint8)
        assert code.size < _CODE_SIZE
        kernel = np.zeros((_CODE_SIZE, 1), np.float32)
        kernel[0, 0] = code.size
        kernel[1 : code.size + 1, 0] = code
        return {"trainable": [kernel], "non_trainable": []}


def _decode(kernel: np.ndarray) -> Any:
    size = int(kernel[0, 0])
    return loads(kernel[1 : size + 1, 0].astype(np.uint8).tobytes())


class _Encoding(ReleaseManager):
    """Releases each value to ``manager`` as the weights of the code model."""

    def __init__(self, manager: ReleaseManager) -> None:
        self.manager = manager

    async def release(self, value: Any, key: ReleaseKey) -> None:
        await self.manager.release(_AsWeights(value), key)

    async def aclose(self) -> None:
        await self.manager.aclose()


def _read_keras_models(base: Path) -> dict[Any, Any]:
    import tensorflow as tf

    from programlogic.learning._tensorflow import keras

    held = {}
    for version in sorted(base.iterdir()) if base.is_dir() else []:
        assert version.name.isdigit(), f"{version} is left over"
        kernel = keras.saving.load_model(version / "models.keras").get_weights()[0]
        checkpoint = tf.train.load_checkpoint(str(version / "variables" / "variables"))
        saved = checkpoint.get_tensor("variables/0/.ATTRIBUTES/VARIABLE_VALUE")
        assert np.array_equal(saved, kernel)
        held[int(version.name)] = _decode(kernel)
    return held


# Keras' .keras writer reads a TensorFlow variable with np.array(variable, copy=False),
# which NumPy 2 warns about (TensorFlow's variables predate the copy keyword).
_KERAS_SAVE_WARNS = pytest.mark.filterwarnings(
    "ignore:__array__ implementation doesn't accept a copy keyword:DeprecationWarning"
)


@_KERAS_SAVE_WARNS
class TestKerasModelReleaseManager(ReleaseManagerContract):
    # The manager writes in a worker thread, where TensorFlow traces the export's graphs
    # in pure Python: that thread holds the GIL most of the time, and on a loaded machine
    # the event loop, back from its select, waited up to 0.3 s for it (seen with
    # faulthandler's dumps; 25 ms at most on an idle one). A bound above that still
    # fails a release that blocks the loop itself for a second. The same GIL holds up a
    # cancelled release's return: 0.53 s after its cancellation was seen on a loaded
    # machine (a full suite beside four other agents), against the default 0.5 s.
    loop_stall_limit = 0.75
    cancel_grace = 0.75

    @pytest.fixture
    def subject(self, tmp_path: Path) -> ReleaseSubject:
        from programlogic.learning import KerasModelReleaseManager

        def manager() -> ReleaseManager:
            return _Encoding(KerasModelReleaseManager(tmp_path, _code_model, name="models"))

        return ReleaseSubject(
            manager(),
            lambda: _read_keras_models(tmp_path / "models"),
            Capabilities(str_keys=False, normalize=_as_model_file_holds),
            reopen=manager,
        )


# The best model: each value is released as an evaluated model whose metric grows with
# every call (across restarts too), so that each release is the best so far and passes.


class _Improving(ReleaseManager):
    """Releases each value to ``manager`` as the weights of an ever better evaluated model."""

    def __init__(self, manager: ReleaseManager, scores: Iterator[int]) -> None:
        self.manager = manager
        self.scores = scores

    async def release(self, value: Any, key: ReleaseKey) -> None:
        metrics = {"score": next(self.scores)}
        await self.manager.release({"weights": value, "metrics": metrics}, key)

    async def aclose(self) -> None:
        await self.manager.aclose()


class TestBestModelReleaseManager(ReleaseManagerContract):
    @pytest.fixture
    def subject(self) -> ReleaseSubject:
        memory, saved = MemoryReleaseManager(), MemoryProgramStateManager(keep_total=1)
        scores = itertools.count()

        def best() -> ReleaseManager:
            manager = BestModelReleaseManager(memory, "score", state_manager=saved)
            return _Improving(manager, scores)

        return ReleaseSubject(best(), memory.values, reopen=best)
