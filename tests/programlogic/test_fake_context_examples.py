"""A program tested with FakeContext's fault plays the way a user tests theirs: a round
with dropped clients, a cluster lost mid-run and the rerun that resumes."""

import datetime
from pathlib import Path

import numpy as np
import pytest

from managers import FileProgramStateManager, MemoryProgramStateManager, MemoryReleaseManager
from programlogic import ClusterConnectionError, count_dropped_clients, final_model_key, train_model
from programlogic.testing import (
    DropClients,
    FakeClock,
    FakeContext,
    FakeDataSource,
    FakeLearningProcess,
    LoseCluster,
    SlowCall,
)

pytestmark = pytest.mark.anyio

ROOT = Path(__file__).resolve().parents[2]


# The first example.


async def my_program(context, metrics):
    async with context:
        with count_dropped_clients() as dropped:
            result = await train_model(
                train_process=FakeLearningProcess(),
                train_data_source=FakeDataSource(5),
                train_per_round_clients=5,
                train_total_rounds=4,
                program_state_manager=MemoryProgramStateManager(),
                model_output_manager=MemoryReleaseManager(),
                train_metrics_manager=metrics,
            )
    return result, dropped.count


@pytest.mark.anyio
async def test_my_program_survives_a_round_with_dropped_clients():
    # A deadline drops 2 of round 2's 5 clients; at least 3 must finish a round.
    fake = FakeContext([DropClients(["client_1", "client_3"], call=2)], min_clients=3)
    metrics = MemoryReleaseManager()
    result, dropped = await my_program(fake, metrics)
    assert result.round_num == 4 and dropped == 2
    assert sorted(fake.calls[1].finished) == ["client_0", "client_2", "client_4"]
    assert metrics.values()[2]["client_work"]["train"]["num_examples"] == 3 * 5


# The second example.

ROUND = datetime.timedelta(minutes=10)


async def my_training(context, directory, clock, models):
    async with context, FileProgramStateManager(directory) as state:
        return await train_model(
            train_process=FakeLearningProcess(),
            train_data_source=FakeDataSource(20),
            train_per_round_clients=5,
            train_total_rounds=6,
            program_state_manager=state,
            model_output_manager=models,
            clock=clock,
        )


@pytest.mark.anyio
async def test_my_training_resumes_after_the_cluster_is_lost(tmp_path):
    clock, expected_models = FakeClock(), MemoryReleaseManager()
    fake = FakeContext([SlowCall(ROUND)], clock=clock)  # each round's call takes 10 minutes
    expected = await my_training(fake, tmp_path / "never_lost", clock, expected_models)

    clock, models = FakeClock(), MemoryReleaseManager()
    start = clock.now()
    fake = FakeContext([SlowCall(ROUND), LoseCluster(call=3)], clock=clock)  # lost in round 3
    with pytest.raises(ClusterConnectionError):
        await my_training(fake, tmp_path / "run", clock, models)
    assert clock.now() - start == 2 * ROUND  # rounds 1 and 2; the lost call took no time
    result = await my_training(fake, tmp_path / "run", clock, models)  # the rerun

    assert result.resumed_from == 2  # round 2 was saved before the failure came through
    np.testing.assert_array_equal(result.state["weights"], expected.state["weights"])
    final = final_model_key(6)
    np.testing.assert_array_equal(models.values()[final], expected_models.values()[final])
