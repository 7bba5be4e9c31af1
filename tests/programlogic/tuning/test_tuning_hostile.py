"""``tune`` against what goes wrong around a study: a diverging trial (a NaN objective),
search-space bounds that are not numbers, a damaged or read-only study database, trial
directories the study has no record of, and an environment without the tuning extra.
Each is either a failed trial, with the study going on, or an error naming what to fix."""

from __future__ import annotations

import math
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import anyio
import numpy as np
import optuna
import pytest

from programlogic import LearningProcessOutput
from programlogic.testing import FakeLearningProcess
from programlogic.tuning import StudyProgress, TrialProgram, TrialSpec
from tests.managers.test_state_file_hostile import read_only
from tests.programlogic.tuning.test_tuning import ROUNDS, program, run_study, search_space

pytestmark = pytest.mark.anyio

optuna.logging.set_verbosity(optuna.logging.WARNING)

REPOSITORY = Path(__file__).parents[3]


def states(result: object) -> list[str]:
    return [trial.state for trial in result.trials]


# A diverging trial.


class Diverging(FakeLearningProcess):
    """Its weights are NaN from round 3 on, as a too large learning rate leaves them."""

    async def next(self, state: Any, clients: Any) -> LearningProcessOutput:
        output = await super().next(state, clients)
        if output.state["rounds"] >= 3:
            output.state["weights"] = np.full_like(output.state["weights"], np.nan)
        return output


def diverges_in_trial_1(spec: TrialSpec) -> TrialProgram:
    if spec.number == 1:
        return program(spec, Diverging(learning_rate=spec.params["learning_rate"]))
    return program(spec)


async def test_a_trial_whose_objective_is_nan_fails_and_the_study_goes_on(tmp_path: Path) -> None:
    result = await run_study(tmp_path, build_trial=diverges_in_trial_1)
    assert states(result) == ["complete", "failed", *["complete"] * 4]
    diverged = result.trials[1]
    assert math.isnan(diverged.intermediate_values[ROUNDS])  # what the trial reported
    assert diverged.value is None and diverged.model_key is None
    assert diverged.error == (
        f"ValueError: the objective 'eval/loss' of trial 1 is nan at its last round "
        f"{ROUNDS}, which a study cannot rank: the trial failed (did its training diverge?)"
    )
    assert result.best is not None and result.best.number != 1
    again = await run_study(tmp_path, build_trial=diverges_in_trial_1)  # nothing to redo
    assert states(again) == states(result)
    assert [trial.error for trial in again.trials] == [trial.error for trial in result.trials]


async def test_fail_fast_raises_a_nan_objective(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="'eval/loss' of trial 1 is nan"):
        await run_study(tmp_path, build_trial=diverges_in_trial_1, fail_fast=True)
    result = await run_study(tmp_path, build_trial=diverges_in_trial_1)
    assert states(result) == ["complete", "failed", *["complete"] * 4]


# Search-space bounds that are not finite numbers.


@pytest.mark.parametrize(
    ("suggest", "message"),
    [
        (
            lambda trial: trial.suggest_float("momentum", math.nan, 0.9),
            "parameter 'momentum' has the low bound nan",
        ),
        (
            lambda trial: trial.suggest_float("momentum", 0.1, math.inf, log=True),
            "parameter 'momentum' has the high bound inf",
        ),
        (
            lambda trial: trial.suggest_float("momentum", -math.inf, 0.9, step=0.1),
            "parameter 'momentum' has the low bound -inf",
        ),
        (
            lambda trial: trial.suggest_int("layers", 1, math.inf),
            "parameter 'layers' has the high bound inf",
        ),
    ],
    ids=["nan-low", "inf-high-log", "minus-inf-low-step", "int-inf-high"],
)
async def test_bounds_that_are_not_finite_fail_their_trial_naming_the_parameter(
    tmp_path: Path, suggest, message: str
) -> None:
    def space(trial: optuna.Trial) -> None:
        search_space(trial)
        if trial.number == 1:
            suggest(trial)

    result = await run_study(tmp_path, search_space=space, num_trials=3)
    assert states(result) == ["complete", "failed", "complete"]
    error = result.trials[1].error
    assert error.startswith("ValueError: ") and message in error
    assert "Overflow" not in error


# The study database.


async def test_a_damaged_study_database_is_named(tmp_path: Path) -> None:
    await run_study(tmp_path, num_trials=1)
    database = tmp_path / "study.db"
    for name in ("study.db-wal", "study.db-shm"):
        (tmp_path / name).unlink(missing_ok=True)
    database.write_bytes(b"this is not a database" * 100)
    with pytest.raises(RuntimeError, match="cannot open the study") as raised:
        await run_study(tmp_path, num_trials=1)
    assert str(database) in str(raised.value)
    assert "damaged" in str(raised.value)


async def test_a_read_only_study_database_is_named(tmp_path: Path) -> None:
    await run_study(tmp_path, num_trials=1)
    database = tmp_path / "study.db"
    with read_only(tmp_path), pytest.raises(PermissionError) as raised:
        await run_study(tmp_path, num_trials=2)
    assert str(database) in str(raised.value) and "read-only" in str(raised.value)
    result = await run_study(tmp_path, num_trials=2)  # writable again: it goes on
    assert states(result) == ["complete", "complete"]


# Trial directories the study has no record of.


async def test_a_trial_directory_the_study_has_no_record_of_is_refused_naming_it(
    tmp_path: Path,
) -> None:
    await run_study(tmp_path, num_trials=2)
    for name in ("study.db", "study.db-wal", "study.db-shm"):  # an emptied study
        (tmp_path / name).unlink(missing_ok=True)
    for _ in range(2):  # refused alike on every rerun, and nothing is created
        with pytest.raises(RuntimeError, match="has no record of") as raised:
            await run_study(tmp_path, num_trials=2)
        message = str(raised.value)
        assert str(tmp_path / "trials" / "0") in message
        assert "move" in message and "restore" in message
        study = optuna.load_study(study_name="study", storage=f"sqlite:///{tmp_path}/study.db")
        assert study.trials == []
    (tmp_path / "trials").rename(tmp_path / "trials.old")  # one of the options it gives
    result = await run_study(tmp_path, num_trials=2)
    assert states(result) == ["complete", "complete"]


async def test_a_running_trial_whose_finished_run_the_study_lost_is_refused_naming_it(
    tmp_path: Path,
) -> None:
    """The study as a power cut can leave it (its newest commits lost): trial 0 running,
    its parameters suggested, nothing reported; its directory holds the finished run."""
    finished, lost = tmp_path / "finished", tmp_path / "lost"
    await run_study(finished, num_trials=1)

    async def stop_when_built(spec: TrialSpec) -> TrialProgram:
        scope.cancel()
        await anyio.sleep_forever()

    with anyio.CancelScope() as scope:
        await run_study(lost, num_trials=1, build_trial=stop_when_built)
    for name in ("study.db", "study.db-wal", "study.db-shm"):
        (finished / name).unlink(missing_ok=True)
        if (lost / name).exists():
            shutil.copy(lost / name, finished / name)
    for _ in range(2):
        with pytest.raises(RuntimeError, match="no record of its evaluation") as raised:
            await run_study(finished, num_trials=1)
        message = str(raised.value)
        assert str(finished / "trials" / "0") in message and "move" in message
    (finished / "trials" / "0").rename(finished / "trial-0.old")  # one of the options
    result = await run_study(finished, num_trials=1)
    assert states(result) == ["complete"]
    assert result.trials[0].final_round == ROUNDS


# What on_progress shows.


async def test_on_progress_shows_the_parameters_a_started_trial_uses(tmp_path: Path) -> None:
    progress: list[StudyProgress] = []
    result = await run_study(tmp_path, num_trials=3, on_progress=progress.append)
    started = [
        update.trial
        for update in progress
        if update.trial is not None and update.trial.state == "running"
    ]
    assert [trial.number for trial in started] == [0, 1, 2]
    for trial in started:
        assert trial.params and trial.params == result.trials[trial.number].params


# The tuning extra.


@pytest.mark.parametrize("missing", ["optuna", "sqlalchemy"])
async def test_importing_tuning_without_its_extra_names_the_extra(missing: str) -> None:
    code = f"import sys; sys.modules[{missing!r}] = None; import programlogic.tuning"
    completed = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        cwd=REPOSITORY,
        env={**os.environ, "PYTHONPATH": str(REPOSITORY)},
        check=False,
    )
    assert completed.returncode != 0
    last_line = completed.stderr.strip().splitlines()[-1]
    assert last_line.startswith("ImportError: programlogic.tuning needs ")
    assert last_line.endswith("pip install 'programlogic[tuning]'")
