"""``tune`` on the fakes: trials, their files, pruning, resume, failures, shared studies."""

from __future__ import annotations

import datetime
from pathlib import Path
from typing import Any

import anyio
import numpy as np
import optuna
import pytest

from managers import FileProgramStateManager, ModelFileReleaseManager
from programlogic import Checkpoint, LearningProcessOutput, LocalContext, NoFederatedContextError
from programlogic.testing import FakeDataSource, FakeEvaluationProcess, FakeLearningProcess
from programlogic.tuning import PRUNED, StudyProgress, TrialProgram, TrialSpec, tune
from programlogic.tuning._locks import FileTrialLocks

pytestmark = pytest.mark.anyio

optuna.logging.set_verbosity(optuna.logging.WARNING)

ROUNDS = 6


def search_space(trial: optuna.Trial) -> None:
    trial.suggest_float("learning_rate", 0.01, 1.0, log=True)
    trial.suggest_int("clients", 2, 4)


def program(spec: TrialSpec, process: FakeLearningProcess | None = None) -> TrialProgram:
    return TrialProgram(
        train_process=process or FakeLearningProcess(learning_rate=spec.params["learning_rate"]),
        train_data_source=FakeDataSource(10),
        train_per_round_clients=spec.params["clients"],
        train_total_rounds=ROUNDS,
        evaluation_process=FakeEvaluationProcess(),
        evaluation_data_source=FakeDataSource(3, seed=1),
        evaluation_per_round_clients=3,
        evaluation_periodicity=2,
    )


async def run_study(root: Path, **overrides: Any) -> Any:
    arguments: dict[str, Any] = {
        "search_space": search_space,
        "build_trial": program,
        "metric": "eval/loss",
        "direction": "minimize",
        "num_trials": 6,
        "root": root,
        "pruner": optuna.pruners.NopPruner(),
        **overrides,
    }
    async with LocalContext():
        return await tune(**arguments)


def outcome(result: Any) -> list[tuple[Any, ...]]:
    """What a user reads of a study: per trial its state, parameters and values."""
    return [
        (trial.number, trial.state, trial.params, trial.value, trial.intermediate_values)
        for trial in result.trials
    ]


async def test_each_trial_trains_evaluates_and_keeps_its_files(tmp_path: Path) -> None:
    result = await run_study(tmp_path, concurrency=2)
    assert [trial.number for trial in result.trials] == list(range(6))
    for trial in result.trials:
        assert trial.state == "complete" and trial.final_round == ROUNDS
        assert sorted(trial.intermediate_values) == [2, 4, 6]  # round 0 is not reported
        assert trial.value == trial.intermediate_values[ROUNDS]
        assert trial.directory == tmp_path / "trials" / str(trial.number)
        evaluations = (trial.directory / "evaluation.csv").read_text().splitlines()
        assert [line.split(",")[0] for line in evaluations[1:]] == ["0", "2", "4", "6"]
        metrics = (trial.directory / "metrics.csv").read_text().splitlines()
        assert len(metrics) == 1 + ROUNDS
        weights = await ModelFileReleaseManager(trial.directory / "models").load(trial.model_key)
        assert np.asarray(weights).shape == (2,)
    assert result.best == min(result.trials, key=lambda trial: trial.value)
    assert (tmp_path / "study.db").exists()
    assert len(result.study.trials) == 6
    # Each trial claims, reports and finishes through the storage: at least 3 calls each.
    assert result.storage_calls >= 3 * 6 and result.storage_seconds > 0


async def test_a_study_is_a_function_of_its_seed(tmp_path: Path, anyio_backend: str) -> None:
    first = await run_study(tmp_path / "first", seed=3)
    again = await run_study(tmp_path / "again", seed=3)
    other = await run_study(tmp_path / "other", seed=4)
    assert outcome(first) == outcome(again)
    assert [trial.params for trial in first.trials] != [trial.params for trial in other.trials]


async def test_a_pruned_trial_stops_at_the_round_the_pruner_rejected(tmp_path: Path) -> None:
    pruner = optuna.pruners.ThresholdPruner(upper=5.0)
    result = await run_study(tmp_path, pruner=pruner, num_trials=8)
    pruned = [trial for trial in result.trials if trial.state == "pruned"]
    assert pruned and any(trial.state == "complete" for trial in result.trials)
    for trial in pruned:
        first_over = min(step for step, value in trial.intermediate_values.items() if value > 5)
        assert trial.final_round == first_over == max(trial.intermediate_values)
        metrics = (trial.directory / "metrics.csv").read_text().splitlines()
        assert len(metrics) == 1 + first_over  # trained no further
        weights = await ModelFileReleaseManager(trial.directory / "models").load(trial.model_key)
        assert np.asarray(weights).shape == (2,)
    again = await run_study(tmp_path, pruner=pruner, num_trials=8)
    assert outcome(again) == outcome(result)  # a rerun changes nothing


async def test_a_stopped_tuner_resumes_its_trials_to_the_uninterrupted_study(
    tmp_path: Path,
) -> None:
    reference = await run_study(tmp_path / "reference")
    started: list[tuple[int, dict[str, Any]]] = []
    cancelled = anyio.Event()

    def stop_in_trial_3(spec: TrialSpec) -> TrialProgram:
        started.append((spec.number, spec.params))

        class Stopping(FakeLearningProcess):
            async def next(self, state: Any, clients: Any) -> LearningProcessOutput:
                if spec.number == 3 and state["rounds"] == 4 and not cancelled.is_set():
                    cancelled.set()
                    scope.cancel()
                    await anyio.sleep_forever()
                return await super().next(state, clients)

        return program(spec, Stopping(learning_rate=spec.params["learning_rate"]))

    with anyio.CancelScope() as scope:
        await run_study(tmp_path / "stopped", build_trial=stop_in_trial_3)
    assert cancelled.is_set()
    stopped = optuna.load_study(
        study_name="study", storage=f"sqlite:///{tmp_path}/stopped/study.db"
    )
    assert [trial.state.name for trial in stopped.trials][3] == "RUNNING"
    resumed = await run_study(tmp_path / "stopped", build_trial=stop_in_trial_3)
    assert outcome(resumed) == outcome(reference)
    assert resumed.best.number == reference.best.number
    numbers = [number for number, _ in started]
    assert numbers == [0, 1, 2, 3, 3, 4, 5]  # trial 3 went on as itself
    assert started[3] == started[4]  # with its parameters, not suggested again
    metrics = (tmp_path / "stopped" / "trials" / "3" / "metrics.csv").read_text()
    assert metrics == (tmp_path / "reference" / "trials" / "3" / "metrics.csv").read_text()


async def test_a_failing_trial_is_recorded_and_the_study_goes_on(tmp_path: Path) -> None:
    def fails_in_trial_1(spec: TrialSpec) -> TrialProgram:
        if spec.number == 1:
            raise ValueError("no such optimizer")
        return program(spec)

    result = await run_study(tmp_path, build_trial=fails_in_trial_1)
    assert [trial.state for trial in result.trials].count("complete") == 5
    failed = result.trials[1]
    assert failed.state == "failed" and failed.error == "ValueError: no such optimizer"
    assert failed.model_key is None
    again = await run_study(tmp_path, build_trial=program)  # failed trials are not retried
    assert outcome(again) == outcome(result)


async def test_a_search_space_that_raises_fails_its_trial_only(tmp_path: Path) -> None:
    def narrow_for_trial_2(trial: optuna.Trial) -> None:
        search_space(trial)
        if trial.number == 2:
            trial.suggest_float("momentum", 0.9, 0.1)

    result = await run_study(tmp_path, search_space=narrow_for_trial_2)
    assert [trial.state for trial in result.trials].count("complete") == 5
    assert result.trials[2].state == "failed"
    assert result.trials[2].error.startswith("ValueError: ")


async def test_fail_fast_raises_the_trial_error_and_leaves_the_rest_to_resume(
    tmp_path: Path,
) -> None:
    class Failing(FakeLearningProcess):
        async def next(self, state: Any, clients: Any) -> LearningProcessOutput:
            if state["rounds"] == 2:
                raise RuntimeError("diverged")
            return await super().next(state, clients)

    def fails_in_trial_2(spec: TrialSpec) -> TrialProgram:
        return program(spec, Failing() if spec.number == 2 else None)

    with pytest.raises(RuntimeError, match="diverged"):
        await run_study(tmp_path, build_trial=fails_in_trial_2, fail_fast=True)
    result = await run_study(tmp_path)
    assert [trial.state for trial in result.trials].count("failed") == 1
    assert result.trials[2].error == "RuntimeError: diverged"
    assert len(result.trials) == 6


async def test_a_failure_of_the_tuner_itself_fails_tune(tmp_path: Path) -> None:
    class BrokenPruner(optuna.pruners.BasePruner):
        def prune(self, study: Any, trial: Any) -> bool:
            raise ConnectionError("the database went away")

    with pytest.raises(ConnectionError, match="went away"):
        await run_study(tmp_path, pruner=BrokenPruner())
    study = optuna.load_study(study_name="study", storage=f"sqlite:///{tmp_path}/study.db")
    assert [trial.state.name for trial in study.trials] == ["RUNNING"]  # not marked failed


async def test_two_tuners_split_a_study_without_running_a_trial_twice(tmp_path: Path) -> None:
    runs: list[int] = []

    def counted(spec: TrialSpec) -> TrialProgram:
        runs.append(spec.number)
        return program(spec)

    results = []

    async def tuner() -> None:
        results.append(
            await tune(
                search_space=search_space,
                build_trial=counted,
                metric="eval/loss",
                direction="minimize",
                num_trials=8,
                root=tmp_path,
                concurrency=2,
                pruner=optuna.pruners.NopPruner(),
            )
        )

    async with LocalContext(), anyio.create_task_group() as tuners:
        tuners.start_soon(tuner)
        tuners.start_soon(tuner)
    assert sorted(runs) == list(range(8))
    assert all(len(result.trials) == 8 for result in results)
    assert all(trial.state == "complete" for trial in results[0].trials)


async def test_a_trial_held_by_a_live_tuner_is_taken_over_once_it_dies(tmp_path: Path) -> None:
    await run_study(tmp_path, num_trials=2)
    study = optuna.load_study(study_name="study", storage=f"sqlite:///{tmp_path}/study.db")
    orphan = study.ask()  # a trial some other tuner started
    search_space(orphan)
    other_tuner = FileTrialLocks(tmp_path / "locks")
    assert other_tuner.try_lock_trial(orphan.number)
    progress: list[StudyProgress] = []

    opened = anyio.Event()

    def watched(update: StudyProgress) -> None:
        progress.append(update)
        opened.set()

    async with anyio.create_task_group() as group:
        group.start_soon(
            lambda: run_study(
                tmp_path,
                num_trials=2,
                on_progress=watched,
                poll_interval=datetime.timedelta(0),
            )
        )
        await opened.wait()
        await anyio.wait_all_tasks_blocked()
        assert all(update.trial is None for update in progress)  # it waits, taking nothing
        other_tuner.close()  # the other tuner dies
    study = optuna.load_study(study_name="study", storage=f"sqlite:///{tmp_path}/study.db")
    assert [trial.state.name for trial in study.trials] == ["COMPLETE"] * 3
    assert study.trials[2].params == orphan.params
    taken_over = [update.trial for update in progress if update.trial is not None]
    assert [(trial.number, trial.state) for trial in taken_over] == [
        (2, "running"),
        (2, "complete"),
    ]
    assert progress[-1].complete == 3 and progress[-1].running == 0


async def test_a_rerun_with_other_settings_is_refused(tmp_path: Path) -> None:
    await run_study(tmp_path, num_trials=1)
    with pytest.raises(ValueError, match="seed 0 in the study, 1 given"):
        await run_study(tmp_path, num_trials=1, seed=1)
    with pytest.raises(ValueError, match="direction 'maximize'"):
        await run_study(tmp_path, num_trials=1, direction="maximize")


async def test_the_objective_metric_must_be_in_the_evaluation_metrics(tmp_path: Path) -> None:
    result = await run_study(tmp_path, num_trials=1, metric="eval/accuracy")
    assert result.trials[0].state == "failed"
    assert "'eval/accuracy' is not in the metrics of round" in result.trials[0].error


async def test_the_stop_reason_of_a_pruned_trial_is_pruned(tmp_path: Path) -> None:
    await run_study(tmp_path, num_trials=1, pruner=optuna.pruners.ThresholdPruner(upper=0.0))
    async with FileProgramStateManager(tmp_path / "trials" / "0" / "state") as state_manager:
        saved, version = await state_manager.load_latest()
    assert version == 2  # the first evaluated round after the initial model
    assert Checkpoint.from_saved(saved, version).stop_reason is PRUNED


@pytest.mark.parametrize(
    ("overrides", "error", "message"),
    [
        ({"search_space": 3}, TypeError, "search_space must be callable"),
        ({"num_trials": 0}, ValueError, "num_trials"),
        ({"direction": "up"}, ValueError, "direction"),
        ({"concurrency": 0}, ValueError, "concurrency"),
        ({"metric": ""}, ValueError, "metric"),
        ({"pruner": "median"}, TypeError, "pruner must be"),
        ({"storage": "mysql://tuner:secret@db/study"}, ValueError, "'mysql'"),
    ],
)
async def test_bad_arguments_are_named(
    tmp_path: Path, overrides: dict[str, Any], error: type[Exception], message: str
) -> None:
    with pytest.raises(error, match=message) as raised:
        await run_study(tmp_path, **overrides)
    assert "secret" not in str(raised.value)


async def test_tune_needs_a_federated_context(tmp_path: Path) -> None:
    with pytest.raises(NoFederatedContextError):
        await tune(
            search_space=search_space,
            build_trial=program,
            metric="eval/loss",
            direction="minimize",
            num_trials=1,
            root=tmp_path,
        )
