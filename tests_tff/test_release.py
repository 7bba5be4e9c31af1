"""Release managers across the TFF boundary: TFF's used as ours, ours handed to TFF."""

from __future__ import annotations

import asyncio
import collections
import csv
import dataclasses
import math
import threading
from pathlib import Path

import anyio
import anyio.to_thread
import attrs
import numpy as np
import pytest
import tensorflow as tf
import tensorflow_federated as tff
from _small_tff import FixedCohort, native_context, tiny_tff_fed_avg

from managers import (
    CSVFileReleaseManager,
    GroupingReleaseManager,
    MemoryProgramStateManager,
    MemoryReleaseManager,
)
from managers.structure import flatten
from programlogic import LocalContext, train_model
from programlogic.contexts.tff import (
    ReleaseManagerForTFF,
    ReleaseManagerFromTFF,
    TFFContext,
    TFFLearningProcess,
    from_tff_structure,
    to_tff_structure,
)
from programlogic.testing import FakeDataSource, FakeLearningProcess
from programlogic.training import final_model_key

pytestmark = pytest.mark.anyio


def read_tff_csv(path: Path) -> list[dict[str, str]]:
    with open(path, newline="") as file:
        return list(csv.DictReader(file))


async def test_tff_managers_inside_our_grouping_receive_what_train_model_releases(
    tmp_path: Path,
) -> None:
    ours = MemoryReleaseManager()
    tff_memory = tff.program.MemoryReleaseManager()
    tff_csv = tff.program.CSVFileReleaseManager(str(tmp_path / "tff_metrics.csv"))
    metrics = GroupingReleaseManager(
        [ours, ReleaseManagerFromTFF(tff_memory), ReleaseManagerFromTFF(tff_csv)]
    )
    tff_models = tff.program.MemoryReleaseManager()
    async with LocalContext(max_workers=2):
        result = await train_model(
            train_process=FakeLearningProcess(dim=3),
            train_data_source=FakeDataSource(8, dim=3),
            train_per_round_clients=4,
            train_total_rounds=5,
            program_state_manager=MemoryProgramStateManager(),
            model_output_manager=ReleaseManagerFromTFF(tff_models),
            train_metrics_manager=metrics,
            seed=3,
        )

    released = dict(tff_memory.values())
    assert list(released) == [1, 2, 3, 4, 5]
    for round_num, value in ours.values().items():
        assert flatten(released[round_num]) == flatten(value)
    rows = read_tff_csv(tmp_path / "tff_metrics.csv")
    assert [row["key"] for row in rows] == ["1", "2", "3", "4", "5"]
    for row in rows:
        expected = ours.values()[int(row["key"])]["client_work"]["train"]
        assert math.isclose(float(row["client_work/train/loss"]), expected["loss"], rel_tol=1e-15)
        assert int(row["client_work/train/num_examples"]) == expected["num_examples"]
    final = dict(tff_models.values())[final_model_key(5)]
    np.testing.assert_array_equal(final, result.state["weights"])


async def test_tff_file_managers_keep_what_a_tff_process_under_train_model_releases(
    fedavg, data_source, tmp_path: Path
) -> None:
    """TFF's SavedModel and TensorBoard managers as our model and metrics managers."""
    saved_models = tff.program.SavedModelFileReleaseManager(str(tmp_path / "models"))
    process = TFFLearningProcess(fedavg)
    ours = MemoryReleaseManager()
    async with TFFContext():
        result = await train_model(
            train_process=process,
            train_data_source=data_source,
            train_per_round_clients=3,
            train_total_rounds=2,
            program_state_manager=MemoryProgramStateManager(),
            model_output_manager=ReleaseManagerFromTFF(saved_models),
            train_metrics_manager=GroupingReleaseManager(
                [
                    ours,
                    ReleaseManagerFromTFF(
                        tff.program.TensorBoardReleaseManager(str(tmp_path / "tensorboard"))
                    ),
                ]
            ),
        )
        weights = await process.get_model_weights(result.state)
    kept = await saved_models.get_value(final_model_key(2))
    assert_same_leaves(from_tff_structure(kept), weights)
    losses = {
        event.step: float(tf.make_ndarray(value.tensor))
        for path in (tmp_path / "tensorboard").glob("events.out.tfevents.*")
        for event in tf.compat.v1.train.summary_iterator(str(path))
        for value in event.summary.value
        if value.tag == "client_work/train/loss"
    }
    assert losses == {
        round_num: float(metrics["client_work"]["train"]["loss"])
        for round_num, metrics in ours.values().items()
    }


async def test_our_managers_receive_what_tff_train_model_releases(tmp_path: Path) -> None:
    process, client_data = tiny_tff_fed_avg()
    tff_metrics = tff.program.MemoryReleaseManager()
    our_metrics = MemoryReleaseManager()
    our_csv = CSVFileReleaseManager(tmp_path / "metrics.csv")
    tff_models = tff.program.MemoryReleaseManager()
    our_models = MemoryReleaseManager()
    with native_context():
        await tff.learning.programs.train_model(
            train_process=process,
            train_data_source=FixedCohort.source(client_data),
            train_per_round_clients=len(client_data),
            train_total_rounds=3,
            program_state_manager=tff.program.FileProgramStateManager(str(tmp_path / "state")),
            model_output_manager=tff.program.GroupingReleaseManager(
                [tff_models, ReleaseManagerForTFF(our_models)]
            ),
            train_metrics_manager=tff.program.GroupingReleaseManager(
                [tff_metrics, ReleaseManagerForTFF(our_metrics), ReleaseManagerForTFF(our_csv)]
            ),
            evaluation_manager=None,
            evaluation_periodicity=100,
        )
    await our_csv.aclose()

    expected = dict(tff_metrics.values())
    assert list(our_metrics.values()) == [1, 2, 3]
    for round_num, value in our_metrics.values().items():
        assert_same_leaves(value, from_tff_structure(expected[round_num]))
    # TFF's train_model rewraps the metrics: client_work/train/* becomes model_metrics/*.
    rows = read_tff_csv(tmp_path / "metrics.csv")
    losses = [float(row["model_metrics/loss"]) for row in rows]
    assert losses == [float(expected[r]["model_metrics"]["loss"]) for r in (1, 2, 3)]
    assert losses[2] < losses[0]
    key = "training_checkpoint_round_3"
    state = our_models.values()[key]
    tff_state = dict(tff_models.values())[key]
    assert type(state) is type(tff_state)  # LearningAlgorithmState, a NamedTuple
    assert_same_leaves(state, from_tff_structure(tff_state))
    trainable = state.global_model_weights.trainable
    assert [array.shape for array in trainable] == [(4, 3), (3,)]


def assert_same_leaves(actual: object, expected: object) -> None:
    actual_leaves, expected_leaves = flatten(actual), flatten(expected)
    assert [path for path, _ in actual_leaves] == [path for path, _ in expected_leaves]
    for (path, a), (_, e) in zip(actual_leaves, expected_leaves, strict=True):
        np.testing.assert_array_equal(a, e, err_msg=path)
        assert np.asarray(a).dtype == np.asarray(e).dtype, path


async def test_released_keys_must_be_int_or_str() -> None:
    ours = ReleaseManagerForTFF(MemoryReleaseManager())
    with pytest.raises(TypeError, match="release key must be an int or a str, got float"):
        await ours.release({"a": 1}, 1.5)
    await ours.release({"a": 1}, np.int64(4))
    assert list(ours.manager.values()) == [4]
    assert type(next(iter(ours.manager.values()))) is int
    theirs = ReleaseManagerFromTFF(tff.program.MemoryReleaseManager())
    with pytest.raises(TypeError, match="got bool True"):
        await theirs.release({"a": 1}, True)


async def test_constructors_name_the_bad_argument() -> None:
    with pytest.raises(TypeError, match=r"tff_manager must be a tff\.program\.ReleaseManager"):
        ReleaseManagerFromTFF(MemoryReleaseManager())  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="manager must be a programlogic ReleaseManager"):
        ReleaseManagerForTFF(tff.program.MemoryReleaseManager())  # type: ignore[arg-type]


@dataclasses.dataclass
class Point:
    x: float
    tags: list[str]


@attrs.define
class Weights:
    kernel: object
    bias: object


class Pair(collections.namedtuple("Pair", ["first", "second"])):
    pass


async def test_values_cross_the_boundary_in_each_sides_containers() -> None:
    theirs = tff.program.MemoryReleaseManager()
    await ReleaseManagerFromTFF(theirs).release(
        {"point": Point(0.5, ["a"]), "pair": Pair(tf.constant([1, 2]), b"x")}, 7
    )
    released = dict(theirs.values())[7]
    assert released["point"] == {"x": 0.5, "tags": ["a"]}
    assert type(released["pair"]) is Pair
    np.testing.assert_array_equal(released["pair"].first, np.array([1, 2], np.int32))
    assert isinstance(released["pair"].first, np.ndarray)

    ours = MemoryReleaseManager()
    value = collections.OrderedDict(
        weights=Weights(tf.constant([[1.0]]), np.float32(2)),
        struct=tff.structure.Struct([("a", 1), ("b", np.int64(2))]),
        unnamed=tff.structure.Struct([(None, "s")]),
    )
    await ReleaseManagerForTFF(ours).release(value, "final")
    got = ours.values()["final"]
    assert type(got) is collections.OrderedDict
    assert flatten(got) == [
        ("weights/kernel", got["weights"]["kernel"]),
        ("weights/bias", np.float32(2)),
        ("struct/a", 1),
        ("struct/b", 2),
        ("unnamed/0", "s"),
    ]
    np.testing.assert_array_equal(got["weights"]["kernel"], np.array([[1.0]], np.float32))
    assert to_tff_structure(Point(1.0, [])) == {"x": 1.0, "tags": []}


async def test_tff_value_references_are_materialized_for_our_managers() -> None:
    class Later(tff.program.MaterializableValueReference):
        @property
        def type_signature(self) -> tff.TensorType:
            return tff.TensorType(np.float32)

        async def get_value(self) -> np.float32:
            return np.float32(0.25)

    ours = MemoryReleaseManager()
    await ReleaseManagerForTFF(ours).release({"loss": Later(), "round": 2}, 2)
    assert ours.values()[2] == {"loss": np.float32(0.25), "round": 2}
    with pytest.raises(TypeError, match="materialize it first"):
        from_tff_structure({"loss": Later()})


async def test_errors_cross_the_boundary_unchanged() -> None:
    class FullDisk(tff.program.ReleaseManager):
        async def release(self, value: object, key: object) -> None:
            raise OSError("disk full")

    with pytest.raises(OSError, match="disk full"):
        await ReleaseManagerFromTFF(FullDisk()).release({"a": 1}, 1)

    class Refusing(MemoryReleaseManager):
        async def release(self, value: object, key: object) -> None:
            raise ValueError("refused")

    with pytest.raises(ValueError, match="refused"):
        await ReleaseManagerForTFF(Refusing()).release({"a": 1}, 1)


@pytest.mark.parametrize("anyio_backend", ["asyncio", "trio"])
async def test_tff_managers_write_off_the_event_loop_under_asyncio_and_trio(
    tmp_path: Path,
) -> None:
    # Each release blocks its thread until a task of the event loop has answered it.
    calls = {key: (threading.Event(), threading.Event()) for key in (1, 2)}

    class SlowDisk(tff.program.ReleaseManager):
        """Blocks in release, as TFF's file managers do while they write."""

        def __init__(self) -> None:
            self.released: list[tuple[object, object, bool]] = []

        async def release(self, value: object, key: object) -> None:
            writing, answered = calls[key]
            writing.set()
            loop_ran = answered.wait(30)  # a hang guard: False only if the loop was blocked
            await asyncio.sleep(0)  # TFF's managers await asyncio inside
            self.released.append((value, key, loop_ran))

    async def answer(key: int) -> None:
        writing, answered = calls[key]
        assert await anyio.to_thread.run_sync(writing.wait, 30)
        answered.set()

    slow = SlowDisk()
    manager = ReleaseManagerFromTFF(slow)
    async with anyio.create_task_group() as group:
        for key in (1, 2):
            group.start_soon(answer, key)
            group.start_soon(manager.release, {"loss": 0.5}, key)
    assert sorted((key, loop_ran) for _, key, loop_ran in slow.released) == [(1, True), (2, True)]
    csv_manager = tff.program.CSVFileReleaseManager(str(tmp_path / "m.csv"))
    await ReleaseManagerFromTFF(csv_manager).release({"loss": 0.5}, 3)
    assert read_tff_csv(tmp_path / "m.csv") == [{"key": "3", "loss": "0.5"}]
