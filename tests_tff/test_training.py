"""TFF's FedAvg under our train_model: TFF's own program logic gives the same rounds."""

from __future__ import annotations

import asyncio
import tempfile

import numpy as np
import pytest
import tensorflow_federated as tff

from managers import FileProgramStateManager, MemoryReleaseManager
from managers.serialization import dumps
from programlogic import train_model
from programlogic.contexts.tff import TFFContext, TFFLearningProcess, to_plain
from programlogic.contexts.tff.context import _stop_runtime

pytestmark = pytest.mark.anyio

ROUNDS = 5
PER_ROUND = 4
SEED = 3


@pytest.fixture(scope="module")
def tff_reference(fedavg, datasets):
    """TFF's own train_model with TFF's file state and memory release managers."""
    from conftest import SampledDatasetSource  # the TFF data source of conftest

    from programlogic import InMemoryDataSource

    source = SampledDatasetSource(InMemoryDataSource(datasets), datasets, SEED)
    metrics = tff.program.MemoryReleaseManager()
    models = tff.program.MemoryReleaseManager()
    with tempfile.TemporaryDirectory() as root:
        state_manager = tff.program.FileProgramStateManager(root)

        async def run() -> None:
            await tff.learning.programs.train_model(
                train_process=fedavg,
                train_data_source=source,
                train_per_round_clients=PER_ROUND,
                train_total_rounds=ROUNDS,
                program_state_manager=state_manager,
                model_output_manager=models,
                train_metrics_manager=metrics,
                evaluation_manager=None,
                evaluation_periodicity=1,
            )

        runtime = tff.backends.native.create_async_local_cpp_execution_context()
        try:
            with tff.framework.get_context_stack().install(
                tff.program.NativeFederatedContext(runtime)
            ):
                asyncio.run(run())
        finally:
            _stop_runtime(runtime)  # TFF would leave its worker process to the GC
    return metrics.values(), models.values()


def flat(structure, path=""):
    """(path, leaf) pairs of a nested structure, whatever its containers."""
    if isinstance(structure, dict):
        return [pair for key, value in structure.items() for pair in flat(value, f"{path}/{key}")]
    if isinstance(structure, list | tuple):
        return [pair for i, value in enumerate(structure) for pair in flat(value, f"{path}/{i}")]
    return [(path, structure)]


async def ours(process, data_source, root, rounds=ROUNDS, **managers):
    """Our train_model on the TFF process, in a TFFContext; its TrainingResult."""
    metrics = managers.pop("metrics", MemoryReleaseManager())
    models = managers.pop("models", MemoryReleaseManager())
    async with TFFContext():
        return await train_model(
            train_process=process,
            train_data_source=data_source,
            train_per_round_clients=PER_ROUND,
            train_total_rounds=rounds,
            program_state_manager=FileProgramStateManager(root),
            model_output_manager=models,
            train_metrics_manager=metrics,
            seed=SEED,
        )


async def test_our_train_model_gives_the_rounds_of_tffs_own_train_model(
    fedavg, data_source, tff_reference, tmp_path
) -> None:
    tff_metrics, tff_models = tff_reference
    metrics, models = MemoryReleaseManager(), MemoryReleaseManager()
    process = TFFLearningProcess(fedavg)
    result = await ours(process, data_source, tmp_path, metrics=metrics, models=models)

    assert result.round_num == ROUNDS
    assert list(metrics.values()) == list(range(1, ROUNDS + 1)) == list(tff_metrics)
    for round_num, released in metrics.values().items():
        assert set(released) == {"distributor", "client_work", "aggregator", "finalizer"}
        # TFF's train_model releases client_work/train as model_metrics.
        rewrapped = tff.learning.programs.extract_and_rewrap_metrics(
            released, path=("client_work", "train")
        )
        leaves, expected = dict(flat(rewrapped)), dict(flat(tff_metrics[round_num]))
        assert sorted(leaves) == sorted(expected)
        assert "/model_metrics/loss" in leaves
        for path, leaf in leaves.items():
            assert np.asarray(leaf).dtype == np.asarray(expected[path]).dtype, path
            assert np.array_equal(leaf, expected[path]), (round_num, path, leaf, expected[path])
    first, last = metrics.values()[1], metrics.values()[ROUNDS]
    assert last["client_work"]["train"]["loss"] < first["client_work"]["train"]["loss"]

    # TFF's releases its final train state; ours is the same, bit for bit.
    tff_state = tff_models[f"training_checkpoint_round_{ROUNDS}"]
    assert dumps(result.state) == dumps(process.from_tff_state(tff_state))
    (weights,) = models.values().values()
    assert dumps(weights) == dumps(
        to_plain(tff_state.global_model_weights, fedavg.get_model_weights.type_signature.result)
    )
