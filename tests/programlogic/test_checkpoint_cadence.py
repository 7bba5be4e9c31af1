"""``train_model(checkpoint_every=, checkpoint_interval=)``: fewer saves, the same outputs."""

from __future__ import annotations

import datetime
import itertools
from pathlib import Path
from typing import Any

import anyio
import numpy as np
import pytest

from managers import (
    CSVFileReleaseManager,
    FileProgramStateManager,
    GroupingReleaseManager,
    MemoryProgramStateManager,
    MemoryReleaseManager,
    TensorBoardReleaseManager,
)
from programlogic import (
    EvaluationManager,
    LearningProcessOutput,
    LocalContext,
    StoppingPolicy,
    StopReason,
    final_model_key,
    train_model,
)
from programlogic.testing import (
    FakeClock,
    FakeDataSource,
    FakeEvaluationProcess,
    FakeLearningProcess,
    SimulatedCrash,
)

pytestmark = pytest.mark.anyio

ROUNDS = 10


class Run:
    """The managers of one program, kept across its runs."""

    def __init__(self) -> None:
        self.state = MemoryProgramStateManager(keep_total=None)
        self.metrics = MemoryReleaseManager()
        self.models = MemoryReleaseManager()
        self.evaluations = MemoryReleaseManager()
        self.evaluation_states: dict[str, MemoryProgramStateManager] = {}

    def evaluation_manager(self, held_round: int | None = None) -> EvaluationManager:
        """One-round evaluations; the one of ``held_round`` never finishes."""
        return EvaluationManager(
            data_source=FakeDataSource(3, seed=1),
            aggregated_metrics_manager=self.evaluations,
            create_state_manager_fn=lambda name: self.evaluation_states.setdefault(
                name, MemoryProgramStateManager()
            ),
            create_process_fn=lambda name: (
                Held() if name == f"evaluation_of_round_{held_round}" else FakeEvaluationProcess(),
                MemoryReleaseManager(),
            ),
            cohort_size=3,
            duration=datetime.timedelta(0),
        )

    async def train(self, process: Any = None, **arguments: Any) -> Any:
        async with LocalContext():
            return await train_model(
                train_process=process or FakeLearningProcess(),
                train_data_source=FakeDataSource(10),
                train_per_round_clients=3,
                train_total_rounds=ROUNDS,
                program_state_manager=self.state,
                model_output_manager=self.models,
                train_metrics_manager=self.metrics,
                **arguments,
            )


class Held(FakeEvaluationProcess):
    """An evaluation that never finishes."""

    async def next(self, state: Any, clients: Any) -> LearningProcessOutput:
        await anyio.sleep_forever()
        raise AssertionError("unreachable")


class CrashesOnce(FakeLearningProcess):
    """Raises SimulatedCrash when it is asked for round ``round_num`` the first time."""

    def __init__(self, round_num: int) -> None:
        super().__init__()
        self.round_num = round_num

    async def next(self, state: Any, clients: Any) -> LearningProcessOutput:
        if state["rounds"] + 1 == self.round_num:
            self.round_num = -1
            raise SimulatedCrash(f"crashed in round {state['rounds'] + 1}")
        return await super().next(state, clients)


async def test_every_third_round_is_saved_and_every_round_released() -> None:
    run = Run()
    await run.train(checkpoint_every=3)
    assert await run.state.get_versions() == [0, 3, 6, 9, 10]  # the last round always
    assert sorted(run.metrics.values()) == list(range(1, ROUNDS + 1))


async def test_rounds_lost_to_a_crash_are_trained_and_released_again_the_same() -> None:
    uninterrupted = Run()
    await uninterrupted.train(checkpoint_every=4)
    run = Run()
    process = CrashesOnce(7)
    with pytest.raises(SimulatedCrash):
        await run.train(process, checkpoint_every=4)
    assert await run.state.get_versions() == [0, 4]
    assert sorted(run.metrics.values()) == [1, 2, 3, 4, 5, 6]  # 5 and 6 not saved
    result = await run.train(process, checkpoint_every=4)
    assert result.resumed_from == 4
    assert run.metrics.values() == uninterrupted.metrics.values()
    key = final_model_key(ROUNDS)
    np.testing.assert_array_equal(run.models.values()[key], uninterrupted.models.values()[key])


async def train_to_files(root: Path, process: Any, every: int) -> Any:
    """A run with file state, CSV and TensorBoard metrics under ``root``."""
    metrics = GroupingReleaseManager(
        [CSVFileReleaseManager(root / "metrics.csv"), TensorBoardReleaseManager(root / "tb")]
    )
    async with LocalContext(), FileProgramStateManager(root / "state") as state, metrics:
        return await train_model(
            train_process=process,
            train_data_source=FakeDataSource(10),
            train_per_round_clients=3,
            train_total_rounds=ROUNDS,
            program_state_manager=state,
            model_output_manager=MemoryReleaseManager(),
            train_metrics_manager=metrics,
            checkpoint_every=every,
        )


async def test_file_metrics_of_rounds_lost_to_a_crash_are_written_again_the_same(
    tmp_path: Path,
) -> None:
    """Every round's release is written when it returns, saved round or not; the rerun
    writes the rounds lost to the crash again: the files of an uninterrupted run."""
    pytest.importorskip("tensorboardX")  # the TFF environment's core run lacks it
    await train_to_files(tmp_path / "reference", FakeLearningProcess(), every=4)
    root = tmp_path / "crashed"
    process = CrashesOnce(7)
    with pytest.raises(SimulatedCrash):
        await train_to_files(root, process, every=4)
    # Rounds 5 and 6 were released, not saved: the rerun trains and writes them again.
    rows = (root / "metrics.csv").read_text().splitlines()[1:]
    assert [row.split(",")[0] for row in rows] == ["1", "2", "3", "4", "5", "6"]
    result = await train_to_files(root, process, every=4)
    assert result.resumed_from == 4
    expected = (tmp_path / "reference" / "metrics.csv").read_text()
    assert (root / "metrics.csv").read_text() == expected
    assert len(expected.splitlines()) == ROUNDS + 1


async def test_an_evaluation_in_flight_between_checkpoints_resumes_consistently() -> None:
    reference = Run()
    await reference.train(
        evaluation_manager=reference.evaluation_manager(),
        evaluation_periodicity=5,
        checkpoint_every=4,
    )
    run = Run()
    process = CrashesOnce(7)
    with pytest.raises(SimulatedCrash):
        await run.train(
            process,
            evaluation_manager=run.evaluation_manager(held_round=5),
            evaluation_periodicity=5,
            checkpoint_every=4,
        )
    assert sorted(run.evaluations.values()) == [0]  # round 5's in flight, past checkpoint 4
    assert "evaluation_of_round_5" in run.evaluation_states
    await run.train(
        process,
        evaluation_manager=run.evaluation_manager(),
        evaluation_periodicity=5,
        checkpoint_every=4,
    )
    assert sorted(run.evaluations.values()) == [0, 5, 10]
    assert run.evaluations.values() == reference.evaluations.values()


async def test_a_round_a_stopping_policy_makes_the_last_is_saved() -> None:
    class StopBefore6(StoppingPolicy):
        async def before_round(self, round_num: int) -> StopReason | None:
            return StopReason("budget") if round_num == 6 else None

    run = Run()
    result = await run.train(stopping=StopBefore6(), checkpoint_every=4)
    assert (result.round_num, result.stop_reason) == (5, "budget")
    assert await run.state.get_versions() == [0, 4, 5]


async def test_an_interval_keeps_saves_at_least_that_far_apart() -> None:
    clock = FakeClock()
    saved_at: dict[int, datetime.datetime] = {}

    class Timed(MemoryProgramStateManager):
        async def save(self, state: Any, version: int) -> None:
            saved_at[version] = clock.now()
            await super().save(state, version)

    run = Run()
    run.state = Timed(keep_total=None)
    minute = datetime.timedelta(minutes=1)
    process = FakeLearningProcess(clock=clock, round_duration=minute)
    await run.train(process, clock=clock, checkpoint_interval=3 * minute)
    versions = await run.state.get_versions()
    assert versions[0] == 0 and versions[-1] == ROUNDS and len(versions) < ROUNDS + 1
    between = versions[1:-1]
    assert between  # some rounds in between were saved, others not
    times = [saved_at[version] for version in [0, *between]]
    assert all(later - earlier >= 3 * minute for earlier, later in itertools.pairwise(times))
    assert sorted(run.metrics.values()) == list(range(1, ROUNDS + 1))


async def test_a_cadence_is_refused_where_rounds_do_not_replay() -> None:
    class Timing(LocalContext):
        @property
        def replays_rounds(self) -> bool:
            return False

    run = Run()
    async with Timing():
        with pytest.raises(ValueError, match="checkpoint_every=2 needs a federated context"):
            await train_model(
                train_process=FakeLearningProcess(),
                train_data_source=FakeDataSource(10),
                train_per_round_clients=3,
                train_total_rounds=ROUNDS,
                program_state_manager=run.state,
                model_output_manager=run.models,
                checkpoint_every=2,
            )
    with pytest.raises(ValueError, match="needs an int evaluation_periodicity"):
        await run.train(
            evaluation_manager=run.evaluation_manager(),
            evaluation_periodicity=datetime.timedelta(minutes=5),
            checkpoint_interval=datetime.timedelta(minutes=1),
        )
    assert await run.state.get_versions() == []


async def test_a_ray_context_with_a_round_deadline_does_not_replay() -> None:
    ray_context = pytest.importorskip("programlogic.contexts.ray").RayContext
    assert ray_context(max_workers=1).replays_rounds
    assert not ray_context(max_workers=1, round_deadline=5).replays_rounds
    assert LocalContext().replays_rounds
