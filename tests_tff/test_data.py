"""Data sources across the TFF boundary: TFF's sampled by (seed, round) here, ours fed to TFF."""

from __future__ import annotations

import collections
import copy
from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_federated as tff
from _small_tff import native_context, tiny_tff_fed_avg

from managers import MemoryProgramStateManager, MemoryReleaseManager
from programlogic import InMemoryDataSource, LocalContext, ResumeError, Sampling, train_model
from programlogic.contexts.tff import (
    FederatedDataSourceForTFF,
    FederatedDataSourceFromTFF,
    TFFContext,
    TFFLearningProcess,
    client_dataset_type,
)
from programlogic.testing import FakeLearningProcess

pytestmark = pytest.mark.anyio


def numbered_datasets(count: int) -> list[tf.data.Dataset]:
    return [tf.data.Dataset.from_tensor_slices(np.full((2, 1), i, np.int32)) for i in range(count)]


def contents(dataset: tf.data.Dataset) -> list[list[int]]:
    return [element.tolist() for element in dataset.as_numpy_iterator()]


async def test_a_tff_dataset_source_is_sampled_by_seed_and_round() -> None:
    tff_source = tff.program.DatasetDataSource(numbered_datasets(12))
    source = FederatedDataSourceFromTFF(tff_source)
    assert source.client_ids == [f"{i:02d}" for i in range(12)]
    assert source.federated_type == tff_source.federated_type
    rounds = {r: source.iterator(5).select(4, r) for r in (1, 2, 3)}
    again = FederatedDataSourceFromTFF(tff_source.iterator()).iterator(5)
    for r, handles in rounds.items():
        assert again.select(4, r) == handles
        assert len(set(handles)) == 4
        for handle in handles:
            assert contents(handle.load()) == [[int(handle.client_id)]] * 2
    assert rounds[1] != rounds[2]
    # The same ids sample the same clients as our own sources do.
    ours = InMemoryDataSource({i: None for i in source.client_ids}).iterator(5)
    assert [h.client_id for h in ours.select(4, 2)] == [h.client_id for h in rounds[2]]
    fixed = FederatedDataSourceFromTFF(tff_source, sampling=Sampling.FIXED).iterator(1)
    assert fixed.select(3, 1) == fixed.select(3, 9)


async def test_a_tff_process_trains_on_a_tff_source_under_train_model(fedavg, datasets) -> None:
    clients = list(datasets.values())
    tff_source = FederatedDataSourceFromTFF(tff.program.DatasetDataSource(clients))
    ours = InMemoryDataSource({f"{i:02d}": dataset for i, dataset in enumerate(clients)})

    async def run(source: object) -> dict[int, object]:
        metrics = MemoryReleaseManager()
        async with TFFContext():
            await train_model(
                train_process=TFFLearningProcess(fedavg),
                train_data_source=source,  # type: ignore[arg-type]
                train_per_round_clients=4,
                train_total_rounds=2,
                program_state_manager=MemoryProgramStateManager(),
                model_output_manager=MemoryReleaseManager(),
                train_metrics_manager=metrics,
                seed=5,
            )
        return metrics.values()

    from_tff, from_ours = await run(tff_source), await run(ours)
    assert list(from_tff) == [1, 2]
    np.testing.assert_equal(from_tff, from_ours)  # the same clients, bit for bit


async def test_client_ids_and_client_data_load_where_the_work_runs() -> None:
    arrays = {f"c{i}": np.full((3, 2), float(i)) for i in range(6)}
    by_id = FederatedDataSourceFromTFF(
        tff.program.ClientIdDataSource(list(arrays)), load=arrays.__getitem__
    )
    for handle in by_id.iterator(0).select(3, 1):
        np.testing.assert_array_equal(handle.load(), arrays[handle.client_id])
    ids_only = FederatedDataSourceFromTFF(tff.program.ClientIdDataSource(["b", "a"]))
    assert [h.load() for h in ids_only.all_clients()] == ["a", "b"]

    client_data = tff.simulation.datasets.TestClientData(
        {f"w{i}": collections.OrderedDict(x=np.full((2, 1), i, np.int32)) for i in range(4)}
    )
    source = FederatedDataSourceFromTFF(client_data)
    assert source.client_ids == ["w0", "w1", "w2", "w3"]
    for handle in source.iterator(7).select(2, 4):
        [first, _] = list(handle.load().as_numpy_iterator())
        assert f"w{int(first['x'][0])}" == handle.client_id


async def test_train_model_on_a_tff_source_trains_as_on_ours() -> None:
    arrays = {f"c{i}": np.random.default_rng(i).normal(i, size=(4, 2)) for i in range(9)}

    async def run(source: object) -> dict[int, object]:
        metrics = MemoryReleaseManager()
        async with LocalContext(max_workers=2):
            await train_model(
                train_process=FakeLearningProcess(),
                train_data_source=source,  # type: ignore[arg-type]
                train_per_round_clients=3,
                train_total_rounds=4,
                program_state_manager=MemoryProgramStateManager(),
                model_output_manager=MemoryReleaseManager(),
                train_metrics_manager=metrics,
                seed=11,
            )
        return metrics.values()

    tff_source = tff.program.ClientIdDataSource(list(reversed(arrays)))
    assert await run(FederatedDataSourceFromTFF(tff_source, load=arrays.__getitem__)) == await run(
        InMemoryDataSource(arrays)
    )


async def test_sources_that_cannot_be_listed_are_refused() -> None:
    class Custom(tff.program.FederatedDataSource):
        federated_type = tff.FederatedType(np.int32, tff.CLIENTS)

        def iterator(self) -> tff.program.FederatedDataSourceIterator:
            raise NotImplementedError

    with pytest.raises(TypeError, match="got Custom; other sources cannot be listed"):
        FederatedDataSourceFromTFF(Custom())
    with pytest.raises(ValueError, match=r"duplicated client ids: \['a'\]"):
        FederatedDataSourceFromTFF(tff.program.ClientIdDataSource(["a", "b", "a"]))
    with pytest.raises(TypeError, match="load applies to client ids"):
        FederatedDataSourceFromTFF(tff.program.DatasetDataSource(numbered_datasets(2)), load=str)
    with pytest.raises(TypeError, match="load must be callable or None, got int"):
        FederatedDataSourceFromTFF(tff.program.ClientIdDataSource(["a"]), load=3)  # type: ignore[arg-type]


async def test_our_source_in_tff_selects_by_round_and_serializes() -> None:
    data = numbered_datasets(6)
    ours = InMemoryDataSource({f"{i}": d for i, d in enumerate(data)})
    source = FederatedDataSourceForTFF(ours, client_dataset_type(data[0]), seed=2)
    assert source.federated_type == tff.program.DatasetDataSource(data).federated_type
    iterator = source.iterator()
    first = iterator.select(3)
    expected = ours.iterator(2).select(3, 1)
    assert [contents(d) for d in first] == [contents(h.load()) for h in expected]
    copied = copy.deepcopy(iterator)
    restored = type(iterator).from_bytes(iterator.to_bytes())
    assert restored == iterator == copied
    second = [contents(d) for d in restored.select(3)]
    assert second == [contents(h.load()) for h in ours.iterator(2).select(3, 2)]
    assert [contents(d) for d in copied.select(3)] == second
    other = FederatedDataSourceForTFF(
        InMemoryDataSource({f"{i}": d for i, d in enumerate(data[:5])}),
        client_dataset_type(data[0]),
    )
    with pytest.raises(ResumeError, match="the saved data iterator sampled other clients"):
        type(other.iterator()).from_bytes(iterator.to_bytes())
    with pytest.raises(TypeError, match="source must be a programlogic FederatedDataSource"):
        FederatedDataSourceForTFF(data, client_dataset_type(data[0]))  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="seed must be an int >= 0, got -1"):
        FederatedDataSourceForTFF(ours, client_dataset_type(data[0]), seed=-1)


async def test_a_resumed_tff_program_on_our_source_trains_as_the_uninterrupted_one(
    tmp_path: Path,
) -> None:
    process, data = tiny_tff_fed_avg(num_clients=6)
    ours = InMemoryDataSource({f"{i}": d for i, d in enumerate(data)})

    async def run(root: Path, rounds: int) -> dict[int, object]:
        metrics = tff.program.MemoryReleaseManager()
        await tff.learning.programs.train_model(
            train_process=process,
            train_data_source=FederatedDataSourceForTFF(ours, client_dataset_type(data[0])),
            train_per_round_clients=3,
            train_total_rounds=rounds,
            program_state_manager=tff.program.FileProgramStateManager(str(root)),
            model_output_manager=tff.program.MemoryReleaseManager(),
            train_metrics_manager=metrics,
            evaluation_manager=None,
            evaluation_periodicity=100,
        )
        return dict(metrics.values())

    with native_context():
        uninterrupted = await run(tmp_path / "a", 4)
        await run(tmp_path / "b", 2)  # stops after round 2, as a killed run would
        resumed = await run(tmp_path / "b", 4)
    assert list(resumed) == [3, 4]
    for round_num in (3, 4):
        np.testing.assert_equal(resumed[round_num], uninterrupted[round_num])
    assert uninterrupted[1] != uninterrupted[2]
