import datetime
from typing import Any

import pytest

from managers import MemoryProgramStateManager, MemoryReleaseManager
from programlogic import (
    EvaluationManager,
    LearningProcessOutput,
    LocalContext,
    StopReason,
    final_model_key,
    train_model,
)
from programlogic.stopping import PatienceStopping, SpeechTrainerStopping
from programlogic.testing import CrashingStateManager, FakeClock, FakeDataSource, SimulatedCrash

pytestmark = pytest.mark.anyio


def speech(**options: Any) -> SpeechTrainerStopping:
    return SpeechTrainerStopping("eval/loss", MemoryProgramStateManager(), **options)


def patience(**options: Any) -> PatienceStopping:
    return PatienceStopping("eval/loss", MemoryProgramStateManager(), **options)


@pytest.mark.parametrize(
    ("losses", "expected"),
    [
        ([3.0, 2.0], False),  # fewer than the window
        ([3.0, 2.0, 1.0], False),  # still falling
        ([2.0, 1.0, 3.0], True),  # the last loss went above the window's max
        ([2.0, 1.0, 1.5], False),  # up, but not above the max
        ([1.0, 1.0001, 1.00005], True),  # flat: mean and std under the thresholds
        ([1.0, 1.1, 1.05], False),  # std too large
    ],
)
async def test_the_speech_trainer_rule(losses: list[float], expected: bool) -> None:
    assert speech(window=3).decide(losses) is expected


@pytest.mark.parametrize(
    ("options", "values", "expected"),
    [
        ({"patience": 2}, [5.0, 4.0, 4.0], False),
        ({"patience": 2}, [5.0, 4.0, 4.0, 4.0], True),
        ({"patience": 2}, [5.0, 4.0, 4.5, 3.0], False),
        ({"patience": 2, "min_delta": 0.2}, [5.0, 4.0, 3.9, 3.85], True),
        ({"patience": 1, "mode": "max"}, [0.5, 0.6, 0.55], True),
        ({"patience": 1, "mode": "max"}, [0.5, 0.6, 0.7], False),
        ({"patience": 1}, [], False),
    ],
)
async def test_patience(options: dict[str, Any], values: list[float], expected: bool) -> None:
    assert patience(**options).decide(values) is expected


async def test_results_are_durable_idempotent_by_key_and_ordered_by_round() -> None:
    state = MemoryProgramStateManager()
    policy = PatienceStopping("eval/loss", state, patience=1)
    await policy.release({"eval": {"loss": 3.0}}, 4)
    await policy.release({"eval": {"loss": 1.0}}, 2)
    await policy.release({"eval": {"loss": 2.0}}, 4)
    await policy.release({"eval": {"loss": 9.0}}, "final")  # str keys are not results
    restarted = PatienceStopping("eval/loss", state, patience=1)
    assert await restarted.results() == [(2, 1.0), (4, 2.0)]
    assert await restarted.should_stop()
    await restarted.release({"eval": {"loss": 0.5}}, 6)
    assert not await restarted.should_stop()


async def test_a_missing_metric_names_what_is_there() -> None:
    with pytest.raises(KeyError, match=r"'eval/loss' is not in the metrics of round 3.*'loss'"):
        await patience().release({"loss": 1.0}, 3)


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda: speech(window=1), "window must be an int >= 2"),
        (lambda: speech(mean_threshold=-1), "mean_threshold must be a number >= 0"),
        (lambda: patience(patience=0), "patience must be an int >= 1"),
        (lambda: patience(mode="lowest"), "mode must be one of 'min', 'max', got 'lowest'"),
        (lambda: patience(min_delta=-0.1), "min_delta must be a number >= 0"),
    ],
)
async def test_bad_options_are_rejected(make, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        make()


# Evaluation of train round r gives LOSSES[r]; patience 2 stops once rounds 0-4 are in.
LOSSES = [10.0, 9.0, 8.0, 8.5, 8.7, 7.0, 6.0, 5.0, 4.0, 3.0, 2.0, 1.0]


class Counting:
    """A train process whose model weights are its round number."""

    async def initialize(self) -> dict[str, int]:
        return {"round": 0}

    async def next(self, state, clients) -> LearningProcessOutput:
        return LearningProcessOutput({"round": state["round"] + 1}, {"round": state["round"] + 1})

    async def get_model_weights(self, state) -> int:
        return state["round"]

    async def set_model_weights(self, state, weights) -> dict[str, int]:
        return {"round": int(weights)}


class Scripted(Counting):
    """An evaluation process whose loss is LOSSES[the evaluated train round]."""

    async def next(self, state, clients) -> LearningProcessOutput:
        return LearningProcessOutput(state, {"eval": {"loss": LOSSES[state["round"]]}})


class Program:
    """Training with forked evaluations and early stopping; durable parts survive restarts."""

    def __init__(self) -> None:
        self.clock = FakeClock()
        self.training_state = MemoryProgramStateManager()
        self.states: dict[str, MemoryProgramStateManager] = {}
        self.policy_state = MemoryProgramStateManager()
        self.aggregated = MemoryReleaseManager()
        self.models = MemoryReleaseManager()

    async def run(self, state_manager=None):
        policy = PatienceStopping("eval/loss", self.policy_state, patience=2)

        class Both(MemoryReleaseManager):
            async def release(inner, value, key):
                await self.aggregated.release(value, key)
                await policy.release(value, key)

        evaluations = EvaluationManager(
            data_source=FakeDataSource(4),
            aggregated_metrics_manager=Both(),
            create_state_manager_fn=lambda name: self.states.setdefault(
                name, MemoryProgramStateManager()
            ),
            create_process_fn=lambda name: (Scripted(), MemoryReleaseManager()),
            cohort_size=2,
            duration=datetime.timedelta(0),
            clock=self.clock,
        )
        async with LocalContext():
            return await train_model(
                train_process=Counting(),
                train_data_source=FakeDataSource(4),
                train_per_round_clients=2,
                train_total_rounds=len(LOSSES) - 1,
                program_state_manager=state_manager or self.training_state,
                model_output_manager=self.models,
                evaluation_manager=evaluations,
                clock=self.clock,
                stopping=policy,
                stopping_waits_for_evaluations=True,
            )


async def test_reproducible_early_stopping_stops_at_the_expected_round() -> None:
    program = Program()
    result = await program.run()
    assert result.stop_reason is StopReason.EARLY_STOPPED
    assert result.round_num == 5
    assert list(program.models.values()) == [final_model_key(5)]
    assert program.models.values()[final_model_key(5)] == 5
    assert sorted(program.aggregated.values()) == [0, 1, 2, 3, 4, 5]  # the last one still runs
    assert (await program.training_state.get_versions())[-1] == 5


@pytest.mark.parametrize("crash_round", [2, 4, 5])
async def test_reproducible_early_stopping_survives_a_restart(crash_round: int) -> None:
    program = Program()
    with pytest.raises(SimulatedCrash):
        await program.run(CrashingStateManager(program.training_state, crash_round))
    result = await program.run()
    assert result.stop_reason is StopReason.EARLY_STOPPED and result.round_num == 5
    assert sorted(program.aggregated.values()) == [0, 1, 2, 3, 4, 5]
    assert list(program.models.values()) == [final_model_key(5)]


async def test_a_stopped_run_stays_stopped_when_run_again() -> None:
    program = Program()
    await program.run()
    program.models = MemoryReleaseManager()
    result = await program.run()
    assert result.stop_reason is StopReason.EARLY_STOPPED and result.round_num == 5
    assert list(program.models.values()) == [final_model_key(5)]
    assert (await program.training_state.get_versions())[-1] == 5


async def test_stopping_arguments_are_checked() -> None:
    arguments = {
        "train_process": Counting(),
        "train_data_source": FakeDataSource(4),
        "train_per_round_clients": 2,
        "train_total_rounds": 3,
        "program_state_manager": MemoryProgramStateManager(),
        "model_output_manager": MemoryReleaseManager(),
    }
    with pytest.raises(TypeError, match="stopping must be a StoppingPolicy"):
        await train_model(**arguments, stopping=object())
    with pytest.raises(TypeError, match="stopping_waits_for_evaluations must be a bool"):
        await train_model(**arguments, stopping=patience(), stopping_waits_for_evaluations="yes")
