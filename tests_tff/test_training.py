"""TFF's FedAvg under our train_model: TFF's own train_model gives the same rounds, and a
run interrupted (cancelled, or killed) resumes to the uninterrupted run's state, bit for bit.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

import anyio
import numpy as np
import pytest
import tensorflow_federated as tff
from conftest import PER_ROUND, SEED

from managers import FileProgramStateManager, MemoryReleaseManager, ReleaseManager
from managers.serialization import dumps
from programlogic import InMemoryDataSource, StopReason, train_model
from programlogic.contexts.tff import (
    FederatedDataSourceForTFF,
    TFFContext,
    TFFLearningProcess,
    client_dataset_type,
    to_plain,
)
from programlogic.contexts.tff.context import _stop_runtime

pytestmark = pytest.mark.anyio

ROUNDS = 5
PROGRAM = Path(__file__).with_name("_tff_program.py")


def flat(structure, path=""):
    """(path, leaf) pairs of a nested structure, whatever its containers."""
    if isinstance(structure, dict):
        return [pair for key, value in structure.items() for pair in flat(value, f"{path}/{key}")]
    if isinstance(structure, list | tuple):
        return [pair for i, value in enumerate(structure) for pair in flat(value, f"{path}/{i}")]
    return [(path, structure)]


async def ours(process, data_source, root, rounds=ROUNDS, metrics=None, models=None):
    """Our train_model on the TFF process in a TFFContext, file state under ``root``."""
    async with TFFContext(), FileProgramStateManager(root) as state:
        return await train_model(
            train_process=process,
            train_data_source=data_source,
            train_per_round_clients=PER_ROUND,
            train_total_rounds=rounds,
            program_state_manager=state,
            model_output_manager=models or MemoryReleaseManager(),
            train_metrics_manager=metrics,
            seed=SEED,
        )


@pytest.fixture(scope="module")
def tff_reference(fedavg, datasets):
    """TFF's own train_model, TFF's file state manager and memory release managers."""
    source = FederatedDataSourceForTFF(
        InMemoryDataSource(datasets),
        client_dataset_type(next(iter(datasets.values()))),
        seed=SEED,
    )
    metrics, models = tff.program.MemoryReleaseManager(), tff.program.MemoryReleaseManager()
    with tempfile.TemporaryDirectory() as root:

        async def run() -> None:
            await tff.learning.programs.train_model(
                train_process=fedavg,
                train_data_source=source,
                train_per_round_clients=PER_ROUND,
                train_total_rounds=ROUNDS,
                program_state_manager=tff.program.FileProgramStateManager(root),
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


@pytest.fixture(scope="module")
async def uninterrupted(fedavg, data_source, tmp_path_factory):
    """Our uninterrupted run: (process, its TrainingResult, its released metrics)."""
    process, metrics = TFFLearningProcess(fedavg), MemoryReleaseManager()
    root = tmp_path_factory.mktemp("uninterrupted")
    result = await ours(process, data_source, root, metrics=metrics)
    assert result.stop_reason is StopReason.COMPLETED
    return process, result, metrics.values()


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


class CancelAfter(ReleaseManager):
    """Keeps the metrics; cancels ``scope`` once round ``last``'s are released."""

    def __init__(self, last: int, scope: anyio.CancelScope) -> None:
        self.last, self.scope, self.kept = last, scope, MemoryReleaseManager()

    async def release(self, value, key) -> None:
        await self.kept.release(value, key)
        if key == self.last:
            self.scope.cancel()


async def test_a_cancelled_run_resumes_to_the_uninterrupted_state(
    fedavg, data_source, uninterrupted, tmp_path
) -> None:
    _, expected, expected_metrics = uninterrupted
    process = TFFLearningProcess(fedavg)
    with anyio.CancelScope() as scope:
        await ours(process, data_source, tmp_path, metrics=CancelAfter(2, scope))
    assert scope.cancelled_caught

    metrics = MemoryReleaseManager()
    result = await ours(process, data_source, tmp_path, metrics=metrics)
    assert result.resumed_from is not None and 2 <= result.resumed_from < ROUNDS
    assert dumps(result.state) == dumps(expected.state)
    for round_num, value in metrics.values().items():
        assert dumps(value) == dumps(expected_metrics[round_num])


async def test_a_killed_program_resumes_to_the_uninterrupted_state(
    fedavg, data_source, uninterrupted, tmp_path
) -> None:
    _, expected, expected_metrics = uninterrupted
    state, log = tmp_path / "state", tmp_path / "program.log"
    with log.open("wb") as output:
        # Its own session: the TFF worker process it starts outlives a SIGKILL of the
        # program and holds its output open, so the group is killed after, and the
        # output goes to a file rather than a pipe nobody would close.
        program = subprocess.Popen(
            [sys.executable, str(PROGRAM), str(state), str(ROUNDS), "2"],
            stdout=output,
            stderr=output,
            start_new_session=True,
        )
        try:
            returncode = await anyio.to_thread.run_sync(lambda: program.wait(timeout=120))
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(program.pid, signal.SIGKILL)
    assert returncode == -signal.SIGKILL, log.read_text()[-2000:]
    versions = sorted(int(p.stem.rsplit("_", 1)[1]) for p in state.glob("program_state_*"))
    assert versions[-1] == 2

    metrics = MemoryReleaseManager()
    result = await ours(TFFLearningProcess(fedavg), data_source, state, metrics=metrics)
    assert result.resumed_from == 2
    assert dumps(result.state) == dumps(expected.state)
    assert list(metrics.values()) == [2, 3, 4, 5]
    for round_num, value in metrics.values().items():
        assert dumps(value) == dumps(expected_metrics[round_num])
