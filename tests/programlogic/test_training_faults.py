"""train_model under the faults of a deployment, played by FakeContext: failing and dropped
clients, too few clients, a lost cluster, slow rounds."""

from __future__ import annotations

import datetime
from pathlib import Path
from typing import Any

import anyio
import numpy as np
import pytest

from managers import FileProgramStateManager, MemoryProgramStateManager, MemoryReleaseManager
from programlogic import (
    ClientError,
    ClusterConnectionError,
    NotEnoughClientsError,
    TrainingResult,
    count_dropped_clients,
    train_model,
)
from programlogic.testing import (
    DropClients,
    FailClient,
    FakeClock,
    FakeContext,
    FakeDataSource,
    FakeLearningProcess,
    LoseCluster,
    SimulatedCrash,
    SlowCall,
)
from tests.programlogic.evaluation_helpers import RecordingEvaluations

pytestmark = pytest.mark.anyio

ROUNDS = 6
CLIENTS = [f"client_{i}" for i in range(5)]


async def train(
    context: FakeContext, state: Any, metrics: MemoryReleaseManager, **overrides: Any
) -> TrainingResult:
    """Every round asks all 5 clients, so the faults of a call name clients it asks."""
    arguments: dict[str, Any] = {
        "train_process": FakeLearningProcess(),
        "train_data_source": FakeDataSource(5),
        "train_per_round_clients": 5,
        "train_total_rounds": ROUNDS,
        "program_state_manager": state,
        "model_output_manager": MemoryReleaseManager(),
        "train_metrics_manager": metrics,
    }
    async with context:
        return await train_model(**{**arguments, **overrides})


async def uninterrupted() -> tuple[TrainingResult, dict[Any, Any]]:
    metrics = MemoryReleaseManager()
    result = await train(FakeContext(), MemoryProgramStateManager(), metrics)
    return result, metrics.values()


async def test_a_round_with_dropped_clients_trains_on_the_others_and_counts_them() -> None:
    fake = FakeContext([DropClients(["client_1", "client_3"], call=2)], min_clients=3)
    metrics = MemoryReleaseManager()
    with count_dropped_clients() as dropped:
        result = await train(fake, MemoryProgramStateManager(), metrics)
    reference, reference_metrics = await uninterrupted()

    assert result.round_num == ROUNDS
    assert sorted(dropped.client_ids) == ["client_1", "client_3"]
    examples = [metrics.values()[r]["client_work"]["train"]["num_examples"] for r in range(1, 7)]
    assert examples == [25, 15, 25, 25, 25, 25]
    assert metrics.values()[1] == reference_metrics[1]
    assert not np.array_equal(result.state["weights"], reference.state["weights"])
    assert sorted(fake.calls[1].finished) == ["client_0", "client_2", "client_4"]


async def test_too_few_clients_fail_train_model_with_that_error_alone_and_a_rerun_resumes() -> None:
    fake = FakeContext([DropClients(CLIENTS[1:], call=3)], min_clients=2)
    state, metrics = MemoryProgramStateManager(), MemoryReleaseManager()
    with pytest.raises(NotEnoughClientsError) as caught:
        await train(fake, state, metrics)
    assert caught.value is fake.calls[2].error
    assert (caught.value.finished, caught.value.required, caught.value.dropped) == (1, 2, 4)

    result = await train(fake, state, metrics)  # the same context: call 3's fault is spent
    reference, reference_metrics = await uninterrupted()
    assert result.resumed_from is not None
    np.testing.assert_array_equal(result.state["weights"], reference.state["weights"])
    assert metrics.values() == reference_metrics


@pytest.mark.parametrize("fault", ["client", "cluster"])
async def test_a_failed_client_or_a_lost_cluster_fails_the_run_and_a_rerun_resumes(
    fault: str, tmp_path: Path
) -> None:
    if fault == "client":
        fake, expected = FakeContext([FailClient("client_2", call=3)]), ClientError
    else:
        fake, expected = FakeContext([LoseCluster(call=3)]), ClusterConnectionError
    metrics = MemoryReleaseManager()
    with pytest.raises(expected) as caught:
        async with FileProgramStateManager(tmp_path) as state:
            await train(fake, state, metrics)
    assert caught.value is fake.calls[2].error
    if fault == "client":
        assert caught.value.client_ids == ("client_2",)
        assert isinstance(caught.value.error, SimulatedCrash)

    async with FileProgramStateManager(tmp_path) as state:
        result = await train(fake, state, metrics)
    reference, reference_metrics = await uninterrupted()
    assert result.resumed_from is not None and result.round_num == ROUNDS
    np.testing.assert_array_equal(result.state["weights"], reference.state["weights"])
    assert metrics.values() == reference_metrics


async def test_slow_rounds_make_a_time_based_evaluation_periodicity_pick_its_rounds() -> None:
    clock = FakeClock()
    start = int(clock.now().timestamp())
    evaluations = RecordingEvaluations()
    fake = FakeContext([SlowCall(datetime.timedelta(minutes=10))], clock=clock)
    await train(
        fake,
        MemoryProgramStateManager(),
        MemoryReleaseManager(),
        evaluation_manager=evaluations,
        evaluation_periodicity=datetime.timedelta(minutes=25),
        clock=clock,
    )
    # Round r ends at 10r minutes: round 3 is the first 25 minutes after round 0.
    assert {r: (t - start) // 60 for r, t in evaluations.started.items()} == {0: 0, 3: 30, 6: 60}


class GatedSaves(MemoryProgramStateManager):
    """A memory state manager whose save of ``version`` waits until ``gate`` is set."""

    def __init__(self, version: int) -> None:
        super().__init__()
        self.version, self.gate = version, anyio.Event()

    async def save(self, program_state: Any, version: int) -> None:
        if version == self.version:
            await self.gate.wait()
        await super().save(program_state, version)


async def test_a_failure_in_a_round_waits_for_the_previous_rounds_save_then_raises() -> None:
    state, failures = GatedSaves(version=2), []

    async def run() -> None:
        with pytest.raises(ClusterConnectionError) as caught:
            await train(FakeContext([LoseCluster(call=3)]), state, MemoryReleaseManager())
        failures.append(caught.value)

    async with anyio.create_task_group() as group:
        group.start_soon(run)
        await anyio.wait_all_tasks_blocked()  # round 3 failed while round 2's save waits
        assert not failures
        state.gate.set()
    assert len(failures) == 1
    assert (await state.get_versions())[-1] == 2

    result = await train(FakeContext(), state, MemoryReleaseManager())
    assert result.resumed_from == 2 and result.round_num == ROUNDS


@pytest.mark.parametrize("attempt", range(10))
async def test_a_lost_cluster_with_state_on_disk_always_resumes_after_the_last_trained_round(
    attempt: int, tmp_path: Path
) -> None:
    with pytest.raises(ClusterConnectionError):
        async with FileProgramStateManager(tmp_path) as state:
            await train(FakeContext([LoseCluster(call=4)]), state, MemoryReleaseManager())
    async with FileProgramStateManager(tmp_path) as state:
        result = await train(FakeContext(), state, MemoryReleaseManager())
    reference, _ = await uninterrupted()
    assert result.resumed_from == 3
    np.testing.assert_array_equal(result.state["weights"], reference.state["weights"])
