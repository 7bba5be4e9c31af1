"""TensorBoardReleaseManager, read back with TensorBoard's own event reader."""

from __future__ import annotations

import dataclasses
import json
import os
import sys
import textwrap
import threading
import types
from pathlib import Path
from typing import Any, NamedTuple

import anyio
import anyio.abc
import anyio.to_thread
import numpy as np
import pytest

from managers.release.base import ReleaseManager
from managers.release.tensorboard import TensorBoardReleaseManager
from managers.structure import flatten
from managers.testing import FakeValueReference

# TensorBoard's reader imports TensorFlow for file access when it is installed; this is
# TensorBoard's own switch to its built-in stub, so the reader behaves the same everywhere.
sys.modules.setdefault("tensorboard.compat.notf", types.ModuleType("tensorboard.compat.notf"))

from tensorboard.backend.event_processing.event_accumulator import (  # noqa: E402
    EventAccumulator,
)

pytestmark = pytest.mark.anyio

ALL_POINTS = {"scalars": 0, "histograms": 0}  # 0 keeps every point instead of a sample


def _reader(directory: Path) -> EventAccumulator:
    accumulator = EventAccumulator(str(directory), size_guidance=ALL_POINTS)
    accumulator.Reload()
    return accumulator


def _scalars(directory: Path) -> dict[str, list[tuple[int, float]]]:
    """Tag -> the (step, value) points TensorBoard shows, in the order it read them."""
    accumulator = _reader(directory)
    return {
        tag: [(event.step, event.value) for event in accumulator.Scalars(tag)]
        for tag in accumulator.Tags()["scalars"]
    }


def _histogram_tags(directory: Path) -> list[str]:
    return sorted(_reader(directory).Tags()["histograms"])


def _f32(value: float) -> float:
    """``value`` as TensorBoard stores a scalar (float32)."""
    return float(np.float32(value))


class Metrics(NamedTuple):
    loss: Any
    accuracy: Any


@dataclasses.dataclass
class Summary:
    rounds: Any


class Tensor:
    """A stand-in for a TensorFlow or JAX tensor: converted through ``__array__``."""

    def __init__(self, array: np.ndarray) -> None:
        self.array = array

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        return np.asarray(self.array, dtype=dtype)


async def test_is_a_release_manager(tmp_path):
    manager = TensorBoardReleaseManager(tmp_path / "tb")
    assert isinstance(manager, ReleaseManager)
    assert manager.summary_dir == tmp_path / "tb"


async def test_scalars_land_with_steps_and_path_tags(tmp_path):
    async with TensorBoardReleaseManager(tmp_path) as manager:
        for step in (1, 2, 3):
            metrics = {
                "client_work": {"train": {"loss": 1.0 / step, "num_examples": 10 * step}},
                "numpy_scalar": np.float32(step + 0.5),
                "zero_d": np.array(step * 2),
                "one_element": np.array([[step * 3.0]]),
            }
            await manager.release(metrics, step)
    assert _scalars(tmp_path) == {
        "client_work/train/loss": [(step, _f32(1.0 / step)) for step in (1, 2, 3)],
        "client_work/train/num_examples": [(step, 10.0 * step) for step in (1, 2, 3)],
        "numpy_scalar": [(step, step + 0.5) for step in (1, 2, 3)],
        "zero_d": [(step, 2.0 * step) for step in (1, 2, 3)],
        "one_element": [(step, 3.0 * step) for step in (1, 2, 3)],
    }
    assert _histogram_tags(tmp_path) == []


async def test_structure_containers_give_path_tags(tmp_path):
    value = {
        "metrics": Metrics(loss=0.5, accuracy=0.25),
        "summary": Summary(rounds=3),
        "per_client": [1.0, 2.0],
    }
    async with TensorBoardReleaseManager(tmp_path) as manager:
        await manager.release(value, 0)
    scalars = _scalars(tmp_path)
    # Tags are exactly the path names of managers.structure, whatever its convention.
    assert scalars == {path: [(0, float(leaf))] for path, leaf in flatten(value)}
    assert scalars["summary/rounds"] == [(0, 3.0)]
    assert scalars["per_client/1"] == [(0, 2.0)]


async def test_a_leaf_released_alone_uses_the_tag_value(tmp_path):
    async with TensorBoardReleaseManager(tmp_path) as manager:
        await manager.release(0.5, 4)
    assert _scalars(tmp_path) == {"value": [(4, 0.5)]}


async def test_tags_replace_characters_tensorboard_does_not_allow(tmp_path):
    async with TensorBoardReleaseManager(tmp_path) as manager:
        await manager.release({"sparse categorical accuracy": 0.5, "a-b.c": {"d": 1.0}}, 1)
    assert _scalars(tmp_path) == {"sparse_categorical_accuracy": [(1, 0.5)], "a-b.c/d": [(1, 1.0)]}


async def test_leaves_sharing_a_tag_raise_and_write_nothing(tmp_path):
    async with TensorBoardReleaseManager(tmp_path) as manager:
        await manager.release({"a b": 1.0}, 1)
        with pytest.raises(ValueError, match=r"'a b' and 'a_b' would share the TensorBoard tag"):
            await manager.release({"a b": 2.0, "a_b": 3.0}, 2)
    assert _scalars(tmp_path) == {"a_b": [(1, 1.0)]}


async def test_arrays_become_histograms(tmp_path):
    weights = np.arange(12.0).reshape(3, 4)
    async with TensorBoardReleaseManager(tmp_path) as manager:
        await manager.release(
            {"weights": weights, "counts": np.array([1, 2, 2, 3]), "loss": 1.0}, 7
        )
    accumulator = _reader(tmp_path)
    assert accumulator.Tags()["scalars"] == ["loss"]
    assert sorted(accumulator.Tags()["histograms"]) == ["counts", "weights"]
    [event] = accumulator.Histograms("weights")
    histogram = event.histogram_value
    assert event.step == 7
    assert (histogram.num, histogram.min, histogram.max, histogram.sum) == (12, 0.0, 11.0, 66.0)
    assert histogram.sum_squares == float(np.sum(weights**2))
    assert sum(histogram.bucket) == 12
    [counts] = accumulator.Histograms("counts")
    assert (counts.histogram_value.num, counts.histogram_value.sum) == (4, 8.0)


async def test_histograms_leave_out_non_finite_values(tmp_path):
    value = {
        "some_nan": np.array([1.0, np.nan, 3.0, np.inf]),
        "all_nan": np.array([np.nan, np.nan]),
    }
    async with TensorBoardReleaseManager(tmp_path) as manager:
        await manager.release(value, 1)
    accumulator = _reader(tmp_path)
    assert accumulator.Tags()["histograms"] == ["some_nan"]
    histogram = accumulator.Histograms("some_nan")[0].histogram_value
    assert (histogram.num, histogram.min, histogram.max) == (2, 1.0, 3.0)


async def test_objects_with_array_protocol_are_converted(tmp_path):
    async with TensorBoardReleaseManager(tmp_path) as manager:
        await manager.release({"tensor": Tensor(np.ones(4)), "scalar": Tensor(np.float64(2.5))}, 3)
    accumulator = _reader(tmp_path)
    assert accumulator.Tags()["histograms"] == ["tensor"]
    assert accumulator.Histograms("tensor")[0].histogram_value.num == 4
    assert _scalars(tmp_path) == {"scalar": [(3, 2.5)]}


async def test_text_flags_none_and_empty_arrays_are_skipped(tmp_path):
    value = {
        "name": "fedavg",
        "blob": b"\x00",
        "missing": None,
        "flag": True,
        "numpy_flag": np.bool_(False),
        "mask": np.array([True, False]),
        "labels": np.array(["a", "b"]),
        "empty": np.zeros((0, 3)),
        "loss": 0.5,
    }
    async with TensorBoardReleaseManager(tmp_path) as manager:
        await manager.release(value, 1)
    assert _scalars(tmp_path) == {"loss": [(1, 0.5)]}
    assert _histogram_tags(tmp_path) == []


@pytest.mark.parametrize(
    ("leaf", "match"),
    [
        (1 + 2j, r"complex leaf at 'bad'"),
        (object(), r"object leaf at 'bad'"),
        (np.array([1 + 1j, 2]), r"leaf at 'bad'.*dtype complex128"),
        (np.array([1, "x"], dtype=object), r"leaf at 'bad'.*dtype object"),
    ],
    ids=["complex", "object", "complex-array", "object-array"],
)
async def test_unsupported_leaf_raises_type_error_and_writes_nothing(tmp_path, leaf, match):
    async with TensorBoardReleaseManager(tmp_path) as manager:
        await manager.release({"loss": 1.0}, 1)
        with pytest.raises(TypeError, match=match):
            await manager.release({"loss": 2.0, "bad": leaf}, 2)
        await manager.release({"loss": 3.0}, 3)
    assert _scalars(tmp_path) == {"loss": [(1, 1.0), (3, 3.0)]}


async def test_str_key_raises_type_error(tmp_path):
    async with TensorBoardReleaseManager(tmp_path / "tb") as manager:
        with pytest.raises(TypeError, match=r"TensorBoard steps are ints.*got str 'final'"):
            await manager.release({"loss": 1.0}, "final")
    assert not (tmp_path / "tb").exists()


@pytest.mark.parametrize(
    ("key", "type_name"),
    [(True, "bool"), (1.0, "float"), (None, "NoneType")],
    ids=["bool", "float", "none"],
)
async def test_invalid_key_raises_type_error(tmp_path, key, type_name):
    async with TensorBoardReleaseManager(tmp_path) as manager:
        with pytest.raises(
            TypeError, match=rf"release key must be an int or a str, got {type_name}"
        ):
            await manager.release({"loss": 1.0}, key)


@pytest.mark.parametrize("key", [2**63, -(2**63) - 1], ids=["too-high", "too-low"])
async def test_key_outside_int64_raises_value_error(tmp_path, key):
    async with TensorBoardReleaseManager(tmp_path) as manager:
        with pytest.raises(ValueError, match=rf"TensorBoard steps are int64, got key {key}"):
            await manager.release({"loss": 1.0}, key)


async def test_value_references_are_materialized(tmp_path):
    value = {
        "loss": FakeValueReference(0.25),
        "nested": {"accuracy": FakeValueReference(0.75, delay=3), "count": 3},
        "weights": FakeValueReference(np.arange(5.0)),
    }
    async with TensorBoardReleaseManager(tmp_path) as manager:
        await manager.release(value, 4)
    assert _scalars(tmp_path) == {
        "loss": [(4, 0.25)],
        "nested/accuracy": [(4, 0.75)],
        "nested/count": [(4, 3.0)],
    }
    assert _histogram_tags(tmp_path) == ["weights"]


async def test_failing_reference_raises_and_writes_nothing(tmp_path):
    async with TensorBoardReleaseManager(tmp_path) as manager:
        await manager.release({"loss": 1.0}, 1)
        with pytest.raises(OSError, match="disk full"):
            await manager.release(
                {"loss": FakeValueReference(error=OSError("disk full")), "other": 5.0}, 2
            )
    assert _scalars(tmp_path) == {"loss": [(1, 1.0)]}


async def test_each_release_is_on_disk_when_release_returns(tmp_path):
    manager = TensorBoardReleaseManager(tmp_path)
    for step in range(1, 26):
        await manager.release({"loss": float(step), "weights": np.arange(3.0) * step}, step)
        assert _scalars(tmp_path)["loss"][-1] == (step, float(step))
        assert _reader(tmp_path).Histograms("weights")[-1].step == step
    await manager.aclose()


async def test_resume_shows_every_step_once_with_the_new_values(tmp_path):
    async with TensorBoardReleaseManager(tmp_path) as before_crash:
        for step in range(1, 11):
            await before_crash.release({"loss": float(step), "weights": np.full(3, step)}, step)
        await before_crash.release({"evaluation": {"accuracy": 0.5}}, 9)
    async with TensorBoardReleaseManager(tmp_path) as resumed:
        for step in range(6, 13):
            await resumed.release({"loss": 100.0 + step, "weights": np.full(3, 100 + step)}, step)

    scalars = _scalars(tmp_path)
    assert sorted(scalars["loss"]) == [
        *[(step, float(step)) for step in range(1, 6)],
        *[(step, 100.0 + step) for step in range(6, 13)],
    ]
    assert scalars["evaluation/accuracy"] == []  # step 9 >= 6 is purged in every tag
    histograms = _reader(tmp_path).Histograms("weights")
    assert [(event.step, event.histogram_value.min) for event in histograms] == [
        *[(step, float(step)) for step in range(1, 6)],
        *[(step, 100.0 + step) for step in range(6, 13)],
    ]


async def test_every_manager_writes_its_own_file_in_creation_order(tmp_path):
    for step in range(1, 5):
        async with TensorBoardReleaseManager(tmp_path) as manager:
            await manager.release({"loss": float(step)}, step)
    names = sorted(os.listdir(tmp_path))
    assert len(names) == 4
    assert all(name.startswith("events.out.tfevents.") for name in names)
    assert [_scalars(tmp_path / name)["loss"] for name in names] == [
        [(step, float(step))] for step in range(1, 5)
    ]


async def _release_in_call_order(
    manager: TensorBoardReleaseManager,
    value: Any,
    key: int,
    *,
    task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED,
) -> None:
    """Release once the caller can go on: this call is then queued before the next one."""
    task_status.started()
    await manager.release(value, key)


async def test_purge_step_is_the_key_of_the_first_call(tmp_path):
    async with TensorBoardReleaseManager(tmp_path) as before_crash:
        for step in range(1, 11):
            await before_crash.release({"loss": float(step)}, step)
    async with TensorBoardReleaseManager(tmp_path) as resumed, anyio.create_task_group() as group:
        # The first call materializes last: it must still be written first and set the purge.
        await group.start(
            _release_in_call_order, resumed, {"loss": FakeValueReference(106.0, delay=20)}, 6
        )
        await group.start(_release_in_call_order, resumed, {"loss": 107.0}, 7)
    assert _scalars(tmp_path)["loss"] == [
        *[(step, float(step)) for step in range(1, 6)],
        (6, 106.0),
        (7, 107.0),
    ]


async def test_concurrent_releases_are_written_in_call_order(tmp_path):
    async with TensorBoardReleaseManager(tmp_path) as manager, anyio.create_task_group() as group:
        for step in range(1, 9):
            value = {"loss": FakeValueReference(float(step), delay=20 * (9 - step))}
            await group.start(_release_in_call_order, manager, value, step)
    assert _scalars(tmp_path)["loss"] == [(step, float(step)) for step in range(1, 9)]


async def test_out_of_order_keys_add_points_within_one_manager(tmp_path):
    async with TensorBoardReleaseManager(tmp_path) as manager:
        for step in (1, 2, 3):
            await manager.release({"loss": float(step)}, step)
        await manager.release({"loss": 20.0}, 2)
    # No purge after the first release: TensorBoard's Python reader shows both points at 2.
    assert _scalars(tmp_path)["loss"] == [(1, 1.0), (2, 2.0), (3, 3.0), (2, 20.0)]


async def test_writing_runs_off_the_event_loop(tmp_path):
    converting = threading.Event()
    may_finish = threading.Event()

    class SlowTensor:
        def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
            converting.set()
            if not may_finish.wait(timeout=10):
                raise TimeoutError("the event loop was blocked while the release was written")
            return np.ones(3)

    async with TensorBoardReleaseManager(tmp_path) as manager, anyio.create_task_group() as group:
        group.start_soon(manager.release, {"weights": SlowTensor()}, 1)
        # Waits in a thread of its own (a hang guard of 10 s); False if never converted.
        assert await anyio.to_thread.run_sync(converting.wait, 10)
        may_finish.set()  # reached only while the release is still in its worker thread
    assert _histogram_tags(tmp_path) == ["weights"]


async def test_aclose_closes_and_later_releases_raise(tmp_path):
    manager = TensorBoardReleaseManager(tmp_path)
    await manager.release({"loss": 1.0}, 1)
    await manager.aclose()
    await manager.aclose()
    with pytest.raises(RuntimeError, match=r"TensorBoardReleaseManager of .* is closed"):
        await manager.release({"loss": 2.0}, 2)
    assert _scalars(tmp_path) == {"loss": [(1, 1.0)]}


async def test_aclose_without_releases_writes_no_file(tmp_path):
    async with TensorBoardReleaseManager(tmp_path / "tb"):
        pass
    assert not (tmp_path / "tb").exists()


_NO_TENSORFLOW_SCRIPT = textwrap.dedent(
    """
    import json, sys

    import anyio
    import numpy as np

    from managers.release.tensorboard import TensorBoardReleaseManager

    async def main():
        async with TensorBoardReleaseManager(sys.argv[1]) as manager:
            await manager.release({"loss": 0.5, "weights": np.arange(4.0)}, 1)

    anyio.run(main)
    print(json.dumps(sorted(
        name for name in sys.modules
        if name.split(".")[0] in ("tensorflow", "tensorboard")
    )))
    """
)


async def test_writing_imports_neither_tensorflow_nor_tensorboard(tmp_path):
    # An importable stand-in for TensorFlow, ahead of any real one: an import of it,
    # guarded or not, would leave "tensorflow" in sys.modules.
    stub = tmp_path / "stub" / "tensorflow"
    stub.mkdir(parents=True)
    (stub / "__init__.py").write_text("")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(stub.parent), *sys.path])}
    result = await anyio.run_process(
        [sys.executable, "-W", "error", "-c", _NO_TENSORFLOW_SCRIPT, str(tmp_path / "tb")],
        env=env,
        check=False,
    )
    assert result.returncode == 0, result.stderr.decode()
    assert json.loads(result.stdout) == []
    assert _scalars(tmp_path / "tb") == {"loss": [(1, 0.5)]}


def _records(directory: Path) -> list[bytes]:
    """Every record of the one event file in ``directory``, checksums verified."""
    from tensorboard.compat.tensorflow_stub import errors
    from tensorboard.compat.tensorflow_stub.pywrap_tensorflow import PyRecordReader_New

    (path,) = directory.iterdir()
    reader = PyRecordReader_New(str(path))
    records = []
    while True:
        try:
            reader.GetNext()
        except errors.OutOfRangeError:
            return records
        records.append(reader.record())


async def test_event_file_records_pass_tensorboards_checksums(tmp_path):
    from tensorboardX.proto.event_pb2 import Event

    async with TensorBoardReleaseManager(tmp_path) as manager:
        for step in range(3):
            await manager.release({"loss": step / 3, "weights": np.arange(100.0) * step}, step)
    events = [Event.FromString(record) for record in _records(tmp_path)]
    assert events[0].file_version == "brain.Event:2"
    assert events[1].HasField("session_log")
    assert [event.step for event in events[2:]] == [0, 1, 2]


_KILLED_SCRIPT = textwrap.dedent(
    """
    import os, signal, sys

    import anyio

    from managers.release.tensorboard import TensorBoardReleaseManager

    async def main():
        manager = TensorBoardReleaseManager(sys.argv[1])
        for step in range(1, 4):
            await manager.release({"loss": float(step)}, step)
        os.kill(os.getpid(), signal.SIGKILL)  # never closed: no fsync, no flush at exit

    anyio.run(main)
    """
)


async def test_released_points_survive_the_program_being_killed(tmp_path):
    result = await anyio.run_process(
        [sys.executable, "-c", _KILLED_SCRIPT, str(tmp_path / "tb")], check=False
    )
    assert result.returncode == -9, result.stderr.decode()
    assert _scalars(tmp_path / "tb") == {"loss": [(1, 1.0), (2, 2.0), (3, 3.0)]}


async def test_leaving_on_cancellation_closes_the_event_file(tmp_path):
    with anyio.CancelScope() as scope:
        async with TensorBoardReleaseManager(tmp_path) as manager:
            await manager.release({"loss": 0.5}, 1)
            scope.cancel()
            await anyio.sleep(1)
    assert scope.cancelled_caught
    (event_file,) = tmp_path.iterdir()
    held = [path.readlink() for path in Path("/proc/self/fd").iterdir() if path.is_symlink()]
    assert event_file not in held
    with pytest.raises(RuntimeError, match="is closed"):
        await manager.release({"loss": 0.25}, 2)
