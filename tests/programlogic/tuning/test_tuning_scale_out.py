"""Tuners on several machines share one study in PostgreSQL: they split its trials, one
takes over the running trial of another that died, and a tuner whose database goes down
fails with the database's error, its trial left to resume.

Two tuners are two processes of _tuning_program.py on one ``root`` directory (as two
machines would share a file system for the trial directories) and one database, each
test on a study of its own.
"""

from __future__ import annotations

import contextlib
import csv
import dataclasses
import json
import os
import signal
import subprocess
import sys
import uuid
from collections import Counter
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import anyio
import anyio.to_thread
import optuna
import psycopg
import pytest
import sqlalchemy.exc
from anyio.abc import Process
from anyio.streams.buffered import BufferedByteReceiveStream
from optuna.exceptions import StorageInternalError

from programlogic import LearningProcessOutput, LocalContext
from programlogic.testing import FakeLearningProcess
from programlogic.tuning import TrialSpec, tune
from tests.programlogic.tuning._tuning_program import ROUNDS, trial_program
from tests.programlogic.tuning.postgres_cluster import (
    postgres_cluster,
    start_cluster,
    stop_cluster,
)

pytestmark = pytest.mark.anyio

PROGRAM = Path(__file__).with_name("_tuning_program.py")
REPOSITORY = Path(__file__).parents[3]
TRIALS = 10
ENDED = {"COMPLETE", "PRUNED"}


@pytest.fixture(autouse=True)
def quiet_optuna() -> None:
    optuna.logging.set_verbosity(optuna.logging.WARNING)


@pytest.fixture
def own_postgresql_url() -> Iterator[str]:
    """A cluster of the test's own, which the test may stop and start again."""
    with postgres_cluster() as url:
        yield url


@dataclasses.dataclass
class Tuner:
    """A running tuning program, whose printed lines the test reads as they come."""

    process: Process
    stdout: BufferedByteReceiveStream
    lines: list[str] = dataclasses.field(default_factory=list)

    async def line(self) -> str:
        self.lines.append((await self.stdout.receive_until(b"\n", 1000)).decode())
        return self.lines[-1]

    async def finish(self) -> int:
        """Read the rest of what it prints, wait for its end: its return code."""
        rest = b""
        with contextlib.suppress(anyio.EndOfStream):
            while True:
                rest += await self.stdout.receive()
        self.lines += rest.decode().splitlines()
        return await self.process.wait()

    def built(self) -> list[int]:
        """The trials it printed it was building (with a gate)."""
        return [int(line.split()[1]) for line in self.lines if line.startswith("building ")]


@contextlib.asynccontextmanager
async def tuner(
    root: Path, backend: str, concurrency: int, *kill: str | int, **environment: Any
) -> AsyncIterator[Tuner]:
    """Start the tuning program on ``root`` with ``TUNING_*`` variables ``environment``;
    a program still running when the block ends is killed."""
    command = [sys.executable, str(PROGRAM), str(root), backend, str(concurrency), str(TRIALS)]
    variables = {f"TUNING_{name.upper()}": str(value) for name, value in environment.items()}
    python_path = os.pathsep.join(filter(None, [str(REPOSITORY), os.environ.get("PYTHONPATH")]))
    env = {**os.environ, "PYTHONPATH": python_path, **variables}
    log = root.parent / f"stderr-{uuid.uuid4().hex}.log"
    with open(log, "wb") as stderr:
        process = await anyio.open_process(
            [*command, *map(str, kill)], stdout=subprocess.PIPE, stderr=stderr, env=env
        )
    async with process:
        assert process.stdout is not None
        try:
            yield Tuner(process, BufferedByteReceiveStream(process.stdout))
        finally:
            if process.returncode is None:
                process.kill()
            with anyio.CancelScope(shield=True):
                await process.wait()
                print(log.read_text(), end="")  # pytest shows it when the test failed


def new_study() -> str:
    return f"study-{uuid.uuid4().hex}"


def read_study(url: str, study_name: str) -> list[optuna.trial.FrozenTrial]:
    storage = optuna.storages.RDBStorage(url)
    try:
        study_id = storage.get_study_id_from_name(study_name)
        return storage.get_all_trials(study_id)
    finally:
        storage.remove_session()
        storage.engine.dispose()


def read_lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def metric_rounds(directory: Path) -> list[int]:
    with open(directory / "metrics.csv", newline="") as file:
        return [int(row["key"]) for row in csv.DictReader(file)]


def rounds_by_run(root: Path, number: int) -> dict[str, list[int]]:
    """The train rounds each run started of trial ``number``, in order."""
    started: dict[str, list[int]] = {}
    for line in read_lines(root / "rounds.jsonl"):
        if line["number"] == number:
            started.setdefault(line["run"], []).append(line["round"])
    return started


def assert_ended_once(root: Path, trial: optuna.trial.FrozenTrial, run: str) -> None:
    """Trial ``trial`` ended, trained by run ``run`` alone, each round once."""
    assert trial.state.name in ENDED, trial.number
    rounds = list(range(1, trial.user_attrs["final_round"] + 1))
    assert rounds_by_run(root, trial.number) == {run: rounds}, trial.number
    assert metric_rounds(root / "trials" / str(trial.number)) == rounds, trial.number


async def test_two_tuners_split_the_trials_of_a_shared_study(
    tmp_path: Path, anyio_backend: str, postgresql_url: str
) -> None:
    root, gate, study = tmp_path / "root", tmp_path / "gate", new_study()
    root.mkdir()
    shared = {"storage": postgresql_url, "study": study, "gate": gate, "poll_interval": 0.2}
    async with (
        tuner(root, anyio_backend, 2, **shared) as first,
        tuner(root, anyio_backend, 1, **shared) as second,
    ):
        # A fake trial takes a few milliseconds: a tuner alone could run them all before
        # the other one starts. Each waits at the gate with a trial it claimed until
        # both have one.
        with anyio.fail_after(60):
            assert (await first.line()).startswith("building ")
            assert (await second.line()).startswith("building ")
        gate.touch()
        with anyio.fail_after(60):
            assert (await first.finish(), await second.finish()) == (0, 0)
    assert first.lines[-1] == second.lines[-1] == "done"

    trials = await anyio.to_thread.run_sync(read_study, postgresql_url, study)
    assert [trial.number for trial in trials] == list(range(TRIALS))
    # Each trial was built once, by one of the two, and each built at least one.
    assert sorted(first.built() + second.built()) == list(range(TRIALS))
    assert first.built() and second.built()
    builds = read_lines(root / "params.jsonl")
    assert sorted(build["number"] for build in builds) == list(range(TRIALS))
    runs = {build["number"]: build["run"] for build in builds}
    first_runs = {runs[number] for number in first.built()}
    second_runs = {runs[number] for number in second.built()}
    assert len(first_runs) == len(second_runs) == 1 and first_runs != second_runs
    for build in builds:
        assert build["params"] == trials[build["number"]].params, build
    for trial in trials:
        assert_ended_once(root, trial, runs[trial.number])


async def wait_until_ended(url: str, study: str, numbers: set[int]) -> None:
    """Wait until the study's trials ``numbers`` have ended (their rows say so)."""
    while True:
        trials = await anyio.to_thread.run_sync(read_study, url, study)
        if numbers <= {trial.number for trial in trials if trial.state.name in ENDED}:
            return
        await anyio.sleep(0.05)


async def test_a_tuner_takes_over_the_running_trial_of_one_that_died(
    tmp_path: Path, anyio_backend: str, postgresql_url: str
) -> None:
    root, hold, study = tmp_path / "root", tmp_path / "hold", new_study()
    root.mkdir()
    shared = {"storage": postgresql_url, "study": study}
    # The dying tuner runs trial 0 alone up to train round 4 (nothing prunes a trial
    # alone), and stays there, holding the trial, until the other ran all the others.
    async with tuner(root, anyio_backend, 1, "computing", 0, 4, hold=hold, **shared) as dying:
        with anyio.fail_after(60):
            assert await dying.line() == "holding"
        async with tuner(root, anyio_backend, 1, poll_interval=0.2, **shared) as taking_over:
            with anyio.fail_after(60):
                await wait_until_ended(postgresql_url, study, set(range(1, TRIALS)))
            hold.touch()  # the other tuner has nothing left but to wait: die now
            with anyio.fail_after(60):
                assert await dying.finish() == -signal.SIGKILL
                assert await taking_over.finish() == 0
    assert taking_over.lines[-1] == "done"

    trials = await anyio.to_thread.run_sync(read_study, postgresql_url, study)
    assert [trial.number for trial in trials] == list(range(TRIALS))
    builds = read_lines(root / "params.jsonl")
    died, took_over = builds[0]["run"], builds[-1]["run"]
    assert Counter((build["run"], build["number"]) for build in builds) == Counter(
        [(died, 0)] + [(took_over, number) for number in range(TRIALS)]
    )
    # Trial 0 resumed as itself: the parameters the dead tuner suggested, its rounds
    # from the dead one's checkpoint (round 2's at least, as round 3 was computed).
    assert [build["params"] for build in builds if build["number"] == 0] == [trials[0].params] * 2
    assert trials[0].state.name in ENDED
    final_round = trials[0].user_attrs["final_round"]
    started = rounds_by_run(root, 0)
    assert started[died] == [1, 2, 3]
    assert started[took_over] == list(range(started[took_over][0], final_round + 1))
    assert started[took_over][0] in (3, 4), started
    assert metric_rounds(root / "trials" / "0") == list(range(1, final_round + 1))
    for trial in trials[1:]:
        assert_ended_once(root, trial, took_over)


def stopping_builder(url: str, stopped: list[int]) -> Any:
    """The trials' factory whose trial 0 stops the database when it starts train round 3,
    once; ``stopped`` gets the trial's number then."""

    class Stopping(FakeLearningProcess):
        async def next(self, state: Any, clients: Any) -> LearningProcessOutput:
            if not stopped and state["rounds"] + 1 == 3:
                await anyio.to_thread.run_sync(stop_cluster, url)
                stopped.append(0)
            return await super().next(state, clients)

    def build(spec: TrialSpec) -> Any:
        program = trial_program(spec)
        if spec.number != 0:
            return program
        process = Stopping(learning_rate=spec.params["learning_rate"])
        return dataclasses.replace(program, train_process=process)

    return build


def search_space(trial: optuna.Trial) -> None:
    trial.suggest_float("learning_rate", 0.01, 1.0, log=True)
    trial.suggest_int("clients", 2, 6)


def stopping_options(url: str, root: Path, stopped: list[int]) -> dict[str, Any]:
    """``tune``'s arguments for a study of 3 trials whose trial 0 stops the database."""
    return {
        "search_space": search_space,
        "build_trial": stopping_builder(url, stopped),
        "metric": "eval/loss",
        "direction": "minimize",
        "num_trials": 3,
        "root": root,
        "storage": url,
    }


# What the storage raises when its database is gone: SQLAlchemy's and psycopg's errors,
# and Optuna's, which wraps SQLAlchemy's on a commit.
STORAGE_ERRORS = (sqlalchemy.exc.SQLAlchemyError, psycopg.Error, StorageInternalError)


async def test_a_database_going_down_fails_the_tuner_and_its_trial_resumes(
    tmp_path: Path, anyio_backend: str, own_postgresql_url: str
) -> None:
    url, stopped = own_postgresql_url, []
    options = stopping_options(url, tmp_path, stopped)
    async with LocalContext():
        # As itself: not inside an ExceptionGroup, which pytest.raises would let through.
        with anyio.fail_after(60), pytest.raises(STORAGE_ERRORS):
            await tune(**options)
    assert stopped == [0]

    await anyio.to_thread.run_sync(start_cluster, url)
    trials = await anyio.to_thread.run_sync(read_study, url, "study")
    assert [(trial.number, trial.state.name) for trial in trials] == [(0, "RUNNING")]
    params = trials[0].params
    async with LocalContext():
        with anyio.fail_after(60):
            result = await tune(**options)
    assert [trial.number for trial in result.trials] == [0, 1, 2]
    assert {trial.state for trial in result.trials} <= {"complete", "pruned"}
    assert result.trials[0].params == params
    final_round = result.trials[0].final_round
    assert final_round is not None and final_round <= ROUNDS
    assert metric_rounds(tmp_path / "trials" / "0") == list(range(1, final_round + 1))


async def test_a_database_going_down_fails_the_tuner_with_its_first_error(
    tmp_path: Path, anyio_backend: str, own_postgresql_url: str
) -> None:
    # The error that failed the tuner, not one its cleanup met afterwards: a traceback
    # without "During handling of the above exception, another exception occurred".
    url, stopped = own_postgresql_url, []
    async with LocalContext():
        with anyio.fail_after(60), pytest.raises(STORAGE_ERRORS) as raised:
            await tune(**stopping_options(url, tmp_path, stopped))
    assert stopped == [0]
    error = raised.value
    assert error.__suppress_context__ or not isinstance(error.__context__, STORAGE_ERRORS), (
        f"{type(error).__module__}.{type(error).__name__}: {error}, raised while handling "
        f"{type(error.__context__).__module__}.{type(error.__context__).__name__}"
    )
    await anyio.to_thread.run_sync(start_cluster, url)
