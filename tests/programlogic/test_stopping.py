import datetime
import logging
from typing import Any

import pytest

from managers import (
    GroupingReleaseManager,
    MemoryProgramStateManager,
    MemoryReleaseManager,
    ReleaseManager,
)
from programlogic import (
    EvaluationManager,
    LearningProcessOutput,
    LocalContext,
    StopReason,
    final_model_key,
    train_model,
)
from programlogic.stopping import AnyOf, PatienceStopping, SpeechTrainerStopping, StoppingPolicy
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
    assert await restarted.after_evaluation(4) is StopReason.EARLY_STOPPED
    await restarted.release({"eval": {"loss": 0.5}}, 6)
    assert await restarted.after_evaluation(6) is None
    assert await restarted.after_evaluation(4) is StopReason.EARLY_STOPPED  # later rounds ignored
    assert await restarted.after_evaluation(3) is None  # only round 2 is <= 3


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


async def test_a_stop_reason_is_an_interned_str() -> None:
    assert StopReason("early_stopped") is StopReason.EARLY_STOPPED
    assert StopReason("pruned") is StopReason("pruned") == "pruned"
    assert repr(StopReason("pruned")) == "StopReason('pruned')"
    with pytest.raises(TypeError, match="a stop reason must be a str, got int 3"):
        StopReason(3)
    with pytest.raises(ValueError, match="a stop reason must be a non-empty str"):
        StopReason("")


class StopAt(StoppingPolicy):
    """Stops after evaluating ``round_num`` or later, with ``reason``."""

    def __init__(self, round_num: int, reason: str = "early_stopped") -> None:
        self.round_num, self.reason = round_num, StopReason(reason)

    async def after_evaluation(self, round_num: int) -> StopReason | None:
        return self.reason if round_num >= self.round_num else None


class Budget(StoppingPolicy):
    """Lets ``rounds`` rounds start, then stops before the next one."""

    def __init__(self, rounds: int, reason: str = "privacy_budget_exhausted") -> None:
        self.rounds, self.reason = rounds, StopReason(reason)

    async def before_round(self, round_num: int) -> StopReason | None:
        return self.reason if round_num > self.rounds else None


async def test_any_of_stops_when_any_does_with_the_first_reason_in_order() -> None:
    both = AnyOf(StopAt(3, "first"), StopAt(2, "second"), Budget(4))
    assert await both.after_evaluation(1) is None
    assert await both.after_evaluation(2) == "second"
    assert await both.after_evaluation(3) == "first"
    assert await both.before_round(4) is None
    assert await both.before_round(5) == "privacy_budget_exhausted"


async def test_any_of_feeds_every_metric_policy_it_holds() -> None:
    state = MemoryProgramStateManager()
    both = AnyOf(Budget(9), PatienceStopping("eval/loss", state, patience=1), speech(window=2))
    for round_num, loss in enumerate([3.0, 2.0, 2.5]):
        await both.release({"eval": {"loss": loss}}, round_num)
    assert await both.after_evaluation(1) is None
    assert await both.after_evaluation(2) is StopReason.EARLY_STOPPED
    assert await PatienceStopping("eval/loss", state).results() == [(0, 3.0), (1, 2.0), (2, 2.5)]


async def test_any_of_checks_its_policies() -> None:
    with pytest.raises(ValueError, match="AnyOf needs at least one policy"):
        AnyOf()
    with pytest.raises(TypeError, match=r"policies\[1\] must be a StoppingPolicy, got str"):
        AnyOf(Budget(1), "patience")


# Evaluation of train round r gives LOSSES[r]; patience 2 stops once rounds 0-4 are in:
# the best is round 2's 8.0, and rounds 3 and 4 do not improve on it.
LOSSES = [10.0, 9.0, 8.0, 8.5, 8.7, 7.0, 6.0, 5.0, 4.0, 3.0, 2.0, 1.0]
TOTAL = len(LOSSES) - 1


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
    """Training with forked evaluations and early stopping; durable parts survive restarts.

    ``make_policy(policy_state)`` builds the run's policy; metric policies receive the
    evaluations' aggregated metrics.
    """

    def __init__(self, make_policy=None) -> None:
        self.make_policy = make_policy or (
            lambda state: PatienceStopping("eval/loss", state, patience=2)
        )
        self.clock = FakeClock()
        self.training_state = MemoryProgramStateManager()
        self.states: dict[str, MemoryProgramStateManager] = {}
        self.policy_state = MemoryProgramStateManager()
        self.aggregated = MemoryReleaseManager()
        self.train_metrics = MemoryReleaseManager()
        self.models = MemoryReleaseManager()

    async def run(self, state_manager=None, *, use_policy: bool = True, **options):
        policy = self.make_policy(self.policy_state) if use_policy else None
        sinks = [self.aggregated] + ([policy] if isinstance(policy, ReleaseManager) else [])
        evaluations = EvaluationManager(
            data_source=FakeDataSource(4),
            aggregated_metrics_manager=GroupingReleaseManager(sinks),
            create_state_manager_fn=lambda name: self.states.setdefault(
                name, MemoryProgramStateManager()
            ),
            create_process_fn=lambda name: (Scripted(), MemoryReleaseManager()),
            cohort_size=2,
            duration=datetime.timedelta(0),
            clock=self.clock,
        )
        arguments = {
            "train_total_rounds": TOTAL,
            "stopping_waits_for_evaluations": True,
            **options,
        }
        async with LocalContext():
            return await train_model(
                train_process=Counting(),
                train_data_source=FakeDataSource(4),
                train_per_round_clients=2,
                program_state_manager=state_manager or self.training_state,
                model_output_manager=self.models,
                train_metrics_manager=self.train_metrics,
                evaluation_manager=evaluations,
                clock=self.clock,
                stopping=policy,
                **arguments,
            )

    def trained_rounds(self) -> list[int]:
        return sorted(self.train_metrics.values())

    def evaluated_rounds(self) -> list[int]:
        return sorted(self.aggregated.values())


async def test_the_waiting_mode_stops_at_the_round_whose_evaluation_triggered_it() -> None:
    program = Program()
    result = await program.run()
    assert result.stop_reason is StopReason.EARLY_STOPPED
    assert result.round_num == 4 and result.state == {"round": 4}
    assert program.trained_rounds() == [1, 2, 3, 4]  # round 5 never trained
    assert program.evaluated_rounds() == [0, 1, 2, 3, 4]
    # The final model is round 4's, the one whose evaluation (loss 8.7) decided.
    saved = await program.training_state.load(4)
    assert saved["stop_reason"] == "early_stopped"
    assert list(program.models.values()) == [final_model_key(4)]
    assert program.models.values()[final_model_key(4)] == saved["train_state"]["round"] == 4
    assert (await PatienceStopping("eval/loss", program.policy_state).results())[-1] == (4, 8.7)
    assert (await program.training_state.get_versions())[-1] == 4


@pytest.mark.parametrize("after_save", [False, True])
@pytest.mark.parametrize("crash_round", [2, 3, 4])
async def test_the_waiting_mode_stops_at_the_same_round_after_a_crash(
    crash_round: int, after_save: bool
) -> None:
    program = Program()
    crashing = CrashingStateManager(program.training_state, crash_round, after_save=after_save)
    with pytest.raises(SimulatedCrash):
        await program.run(crashing)
    result = await program.run()
    assert result.stop_reason is StopReason.EARLY_STOPPED and result.round_num == 4
    assert program.trained_rounds() == [1, 2, 3, 4]
    assert program.evaluated_rounds() == [0, 1, 2, 3, 4]
    assert program.models.values() == {final_model_key(4): 4}


async def test_a_stopped_run_stays_stopped_when_run_again_even_without_its_policy() -> None:
    program = Program()
    await program.run()
    program.models = MemoryReleaseManager()
    result = await program.run(use_policy=False)
    assert result.stop_reason is StopReason.EARLY_STOPPED and result.round_num == 4
    assert result.resumed_from == 4
    assert program.models.values() == {final_model_key(4): 4}
    assert program.trained_rounds() == [1, 2, 3, 4]
    assert (await program.training_state.get_versions())[-1] == 4


async def test_the_waiting_mode_asks_only_evaluated_rounds() -> None:
    program = Program(lambda state: StopAt(3))
    result = await program.run(evaluation_periodicity=2)
    assert result.round_num == 4  # round 3 was not evaluated, so not asked
    assert program.trained_rounds() == [1, 2, 3, 4]
    assert program.evaluated_rounds() == [0, 2, 4]


async def test_the_overlapping_mode_asks_after_every_round_without_waiting() -> None:
    program = Program(lambda state: StopAt(3))
    result = await program.run(evaluation_periodicity=2, stopping_waits_for_evaluations=False)
    assert result.stop_reason is StopReason.EARLY_STOPPED and result.round_num == 3
    assert program.trained_rounds() == [1, 2, 3]
    assert program.evaluated_rounds() == [0, 2, 3]  # the last round is always evaluated
    assert program.models.values() == {final_model_key(3): 3}


async def test_the_overlapping_mode_decides_on_the_results_that_have_arrived() -> None:
    # Every result is in before training starts: the overlapping mode stops right after
    # the first round whose earlier results satisfy the rule, here round 4.
    program = Program()
    policy = PatienceStopping("eval/loss", program.policy_state, patience=2)
    for round_num, loss in enumerate(LOSSES):
        await policy.release({"eval": {"loss": loss}}, round_num)
    result = await program.run(stopping_waits_for_evaluations=False)
    assert result.stop_reason is StopReason.EARLY_STOPPED and result.round_num == 4
    assert program.models.values() == {final_model_key(4): 4}


@pytest.mark.parametrize("waits", [True, False])
async def test_a_stop_at_the_last_round_is_a_completed_run(waits: bool) -> None:
    program = Program(lambda state: StopAt(TOTAL))
    result = await program.run(stopping_waits_for_evaluations=waits)
    assert result.stop_reason is StopReason.COMPLETED and result.round_num == TOTAL


@pytest.mark.parametrize("waits", [True, False])
async def test_a_before_round_policy_stops_before_training_the_round(waits: bool) -> None:
    program = Program(lambda state: Budget(3))
    result = await program.run(evaluation_periodicity=10, stopping_waits_for_evaluations=waits)
    assert result.stop_reason == "privacy_budget_exhausted"
    assert result.stop_reason is StopReason("privacy_budget_exhausted")
    assert result.round_num == 3
    assert program.trained_rounds() == [1, 2, 3]
    assert program.evaluated_rounds() == [0, 3]  # the last round is evaluated
    assert program.models.values() == {final_model_key(3): 3}
    assert (await program.training_state.load(3))["stop_reason"] == "privacy_budget_exhausted"


async def test_a_policy_reason_survives_a_crash_and_a_rerun() -> None:
    program = Program(lambda state: Budget(3))
    with pytest.raises(SimulatedCrash):
        await program.run(CrashingStateManager(program.training_state, 3))
    result = await program.run()
    assert result.stop_reason == "privacy_budget_exhausted" and result.round_num == 3
    rerun = await program.run(use_policy=False)
    assert rerun.stop_reason == "privacy_budget_exhausted" and rerun.round_num == 3
    assert rerun.resumed_from == 3
    assert program.trained_rounds() == [1, 2, 3]


async def test_a_checkpoint_from_before_stop_reasons_reads_as_early_stopped() -> None:
    program = Program(lambda state: Budget(3))
    await program.run()
    saved = await program.training_state.load(3)
    del saved["stop_reason"]
    saved["stopped"] = True
    await program.training_state.remove(3)
    await program.training_state.save(saved, 3)
    result = await program.run(use_policy=False)
    assert result.stop_reason is StopReason.EARLY_STOPPED and result.round_num == 3


async def test_a_budget_of_no_rounds_trains_nothing_and_releases_the_initial_model() -> None:
    program = Program(lambda state: Budget(0))
    result = await program.run()
    assert result.stop_reason == "privacy_budget_exhausted" and result.round_num == 0
    assert program.trained_rounds() == []
    assert program.models.values() == {final_model_key(0): 0}


async def test_a_rerun_with_more_rounds_asks_before_its_first_round() -> None:
    program = Program(lambda state: Budget(3))
    first = await program.run(train_total_rounds=3, evaluation_periodicity=10)
    assert first.stop_reason is StopReason.COMPLETED and first.round_num == 3
    program.models = MemoryReleaseManager()
    second = await program.run(train_total_rounds=8, evaluation_periodicity=10)
    assert second.stop_reason == "privacy_budget_exhausted" and second.round_num == 3
    assert program.trained_rounds() == [1, 2, 3]
    assert program.models.values() == {final_model_key(3): 3}
    assert program.evaluated_rounds() == [0, 3]
    # The loaded round's checkpoint exists, so the stop is not saved: a rerun asks again.
    third = await program.run(train_total_rounds=8)
    assert third.stop_reason == "privacy_budget_exhausted" and third.round_num == 3
    assert program.trained_rounds() == [1, 2, 3]


@pytest.mark.parametrize(
    ("budget", "round_num", "reason"),
    [(3, 3, "privacy_budget_exhausted"), (6, 4, "early_stopped")],
)
async def test_composed_policies_stop_at_the_first_stop(
    budget: int, round_num: int, reason: str
) -> None:
    program = Program(
        lambda state: AnyOf(PatienceStopping("eval/loss", state, patience=2), Budget(budget))
    )
    result = await program.run()
    assert result.stop_reason == reason and result.round_num == round_num
    assert program.models.values() == {final_model_key(round_num): round_num}


class Answering(StoppingPolicy):
    def __init__(self, answer: object) -> None:
        self.answer = answer

    async def before_round(self, round_num: int) -> Any:
        return self.answer


@pytest.mark.parametrize("answer", [True, 3, ""])
async def test_an_answer_that_is_not_a_stop_reason_is_a_type_error(answer: object) -> None:
    program = Program(lambda state: Answering(answer))
    with pytest.raises(TypeError, match="the stopping policy's before_round must return None"):
        await program.run()


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


class _StopsAtInitialize(Counting):
    """A process that fails at once: the test looks only at what train_model logged first."""

    async def initialize(self):
        raise SimulatedCrash("initialize")


@pytest.mark.parametrize(
    ("duration", "warned"), [(datetime.timedelta(hours=24), True), (datetime.timedelta(0), False)]
)
async def test_the_waiting_mode_warns_when_evaluations_run_for_a_long_duration(
    caplog: pytest.LogCaptureFixture, duration: datetime.timedelta, warned: bool
) -> None:
    evaluations = EvaluationManager(
        data_source=FakeDataSource(4),
        aggregated_metrics_manager=MemoryReleaseManager(),
        create_state_manager_fn=lambda name: MemoryProgramStateManager(),
        create_process_fn=lambda name: (Scripted(), MemoryReleaseManager()),
        cohort_size=2,
        duration=duration,
    )
    caplog.set_level(logging.WARNING, logger="programlogic.training")
    async with LocalContext():
        with pytest.raises(SimulatedCrash):
            await train_model(
                train_process=_StopsAtInitialize(),
                train_data_source=FakeDataSource(4),
                train_per_round_clients=2,
                train_total_rounds=3,
                program_state_manager=MemoryProgramStateManager(),
                model_output_manager=MemoryReleaseManager(),
                evaluation_manager=evaluations,
                stopping=PatienceStopping("eval/loss", MemoryProgramStateManager()),
                stopping_waits_for_evaluations=True,
            )
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert bool(warnings) is warned
    if warned:
        assert "duration (1 day, 0:00:00)" in warnings[0]
        assert "duration=timedelta(0)" in warnings[0]
