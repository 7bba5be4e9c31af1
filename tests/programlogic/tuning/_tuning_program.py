"""A tuning program for the kill-and-resume tests of the tuner.

``python _tuning_program.py ROOT BACKEND CONCURRENCY TRIALS [STAGE TRIAL [ROUND]]``
tunes the learning rate and the cohort size of the fake learning process (a study of
TRIALS trials of :data:`ROUNDS` rounds, evaluated every :data:`PERIODICITY` rounds,
pruned by a median pruner), its study and trials under ROOT, resuming whatever ROOT
holds, CONCURRENCY trials at a time on the anyio BACKEND, and prints "done" at the end.
Every build of a trial appends ``{"run", "number", "params"}`` as a JSON line to
``ROOT/params.jsonl``, and every train round a trial starts appends ``{"run", "number",
"round"}`` to ``ROOT/rounds.jsonl``, ``run`` naming this process.

Given STAGE and TRIAL (and ROUND for the stages of a round), it kills itself with
SIGKILL when trial number TRIAL reaches that stage, at the same instant on any machine:

- ``suggesting``: the learning rate is suggested, the cohort size not yet;
- ``building``: the trial's program is being built, its parameters all suggested;
- ``computing``: the trial's learning process starts train round ROUND;
- ``evaluating``: the evaluation of the trial's train round ROUND starts computing;
- ``pruning``: the pruner decided on the report of round ROUND and has not returned;
- ``finishing``: the trial's training ended and the tuner is telling the study
  (the sampler's ``after_trial``, which Optuna calls before it saves the trial's state).

The environment may change the study and hold the program at points a test chooses:

- ``TUNING_STORAGE``: the study's storage URL (``sqlite:///ROOT/study.db`` if unset),
  ``TUNING_STUDY`` its name (``study``), ``TUNING_POLL_INTERVAL`` the tuner's
  ``poll_interval`` in seconds (its default if unset);
- ``TUNING_GATE``: a file's path: every build of a trial prints ``building NUMBER``,
  then waits until that file exists before it goes on;
- ``TUNING_HOLD``: a file's path: at the kill point the program prints ``holding``,
  then waits until that file exists before it kills itself.
"""

import datetime
import json
import os
import signal
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import anyio
import optuna

from programlogic import LearningProcessOutput, LocalContext
from programlogic.evaluation import evaluation_seed
from programlogic.testing import FakeDataSource, FakeEvaluationProcess, FakeLearningProcess
from programlogic.tuning import TrialProgram, TrialSpec, tune

STAGES = ("suggesting", "building", "computing", "evaluating", "pruning", "finishing")
ROUND_STAGES = ("computing", "evaluating", "pruning")
ROUNDS = 6
PERIODICITY = 2
SEED = 3
STUDY_SEED = 7
RUN = uuid.uuid4().hex


def _path_from_environment(name: str) -> Path | None:
    value = os.environ.get(name)
    return None if value is None else Path(value)


def wait_for(path: Path | None) -> None:
    """Block until the file ``path`` exists (a test's go-ahead); at once if ``path`` is None.

    It blocks its thread on purpose: a process held there stalls as a stuck machine does.
    """
    while path is not None and not path.exists():
        time.sleep(0.01)


class Kill:
    """Where this run kills itself: a stage of a trial (and a round), or nowhere."""

    def __init__(
        self, stage: str | None = None, trial: int | None = None, round_num: int | None = None
    ) -> None:
        if stage is not None and stage not in STAGES:
            raise ValueError(f"stage must be one of {STAGES}, got {stage!r}")
        if (stage in ROUND_STAGES) != (round_num is not None):
            raise ValueError(f"a round is given exactly for the stages {ROUND_STAGES}")
        self.target = (stage, trial, round_num)
        self.hold = _path_from_environment("TUNING_HOLD")

    def at(self, stage: str, trial: int, round_num: int | None = None) -> None:
        if (stage, trial, round_num) == self.target:
            if self.hold is not None:
                print("holding", flush=True)
                wait_for(self.hold)
            os.kill(os.getpid(), signal.SIGKILL)


def search_space(kill: Kill):
    """Optuna's suggestions for a trial: two, so that a kill can fall between them."""

    def suggest(trial: optuna.Trial) -> None:
        trial.suggest_float("learning_rate", 0.01, 1.0, log=True)
        kill.at("suggesting", trial.number)
        trial.suggest_int("clients", 2, 6)

    return suggest


class _Rounds:
    """The evaluation clients: the same as a FakeDataSource, but each evaluation of a
    train round first passes its kill point (the train round read from the seed)."""

    def __init__(self, kill: Kill, number: int) -> None:
        self._source = FakeDataSource(12, seed=2)
        self._kill = kill
        self._number = number
        self._rounds = {evaluation_seed(SEED, r): r for r in range(ROUNDS + 1)}

    def iterator(self, seed: int) -> Any:
        inner = self._source.iterator(seed)
        # Seeds of no train round (the manager's probe of the cohort size) kill nowhere.
        kill, number, train_round = self._kill, self._number, self._rounds.get(seed)

        class Iterator:
            def select(self, k: int, round_num: int) -> Any:
                if train_round is not None:
                    kill.at("evaluating", number, train_round)
                return inner.select(k, round_num)

        return Iterator()


def record(path: Path | None, **line: Any) -> None:
    if path is not None:
        with open(path, "a") as file:
            file.write(json.dumps({"run": RUN, **line}) + "\n")


def trial_program(
    spec: TrialSpec, kill: Kill | None = None, rounds: int = ROUNDS, root: Path | None = None
) -> TrialProgram:
    """The program of a trial with ``spec``'s parameters, killing the run where ``kill``
    says and recording its rounds under ``root`` if given."""
    kill = kill or Kill()
    number = spec.number

    class Process(FakeLearningProcess):
        async def next(self, state: Any, clients: Any) -> LearningProcessOutput:
            kill.at("computing", number, state["rounds"] + 1)
            record(root and root / "rounds.jsonl", number=number, round=state["rounds"] + 1)
            return await super().next(state, clients)

    return TrialProgram(
        train_process=Process(learning_rate=spec.params["learning_rate"]),
        train_data_source=FakeDataSource(20, seed=1),
        train_per_round_clients=spec.params["clients"],
        train_total_rounds=rounds,
        evaluation_process=FakeEvaluationProcess(),
        evaluation_data_source=_Rounds(kill, number),
        evaluation_per_round_clients=4,
        evaluation_periodicity=PERIODICITY,
        seed=SEED,
    )


def builder(root: Path, kill: Kill):
    """The trials' factory: records what it builds, then builds it (past the gate, if
    ``TUNING_GATE`` names one)."""
    gate = _path_from_environment("TUNING_GATE")

    def build(spec: TrialSpec) -> TrialProgram:
        record(root / "params.jsonl", number=spec.number, params=spec.params)
        if gate is not None:
            print(f"building {spec.number}", flush=True)
            wait_for(gate)
        kill.at("building", spec.number)
        return trial_program(spec, kill, root=root)

    return build


def pruner(kill: Kill) -> optuna.pruners.BasePruner:
    class Pruner(optuna.pruners.MedianPruner):
        def prune(self, study: optuna.Study, trial: Any) -> bool:
            decided = super().prune(study, trial)
            kill.at("pruning", trial.number, trial.last_step)
            return decided

    return Pruner(n_startup_trials=2)


def sampler(kill: Kill):
    class Sampler(optuna.samplers.TPESampler):
        def after_trial(self, study: Any, trial: Any, state: Any, values: Any) -> None:
            kill.at("finishing", trial.number)
            super().after_trial(study, trial, state, values)

    # Few random trials, so that the later suggestions depend on the ones that ended.
    return lambda seed: Sampler(seed=seed, n_startup_trials=3)


async def main(root: Path, concurrency: int, num_trials: int, kill: Kill) -> None:
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    root.mkdir(parents=True, exist_ok=True)
    seconds = os.environ.get("TUNING_POLL_INTERVAL")
    options = (
        {} if seconds is None else {"poll_interval": datetime.timedelta(seconds=float(seconds))}
    )
    async with LocalContext():
        await tune(
            search_space=search_space(kill),
            build_trial=builder(root, kill),
            metric="eval/loss",
            direction="minimize",
            num_trials=num_trials,
            root=root,
            concurrency=concurrency,
            seed=STUDY_SEED,
            sampler=sampler(kill),
            pruner=pruner(kill),
            storage=os.environ.get("TUNING_STORAGE"),
            study_name=os.environ.get("TUNING_STUDY", "study"),
            **options,
        )
    print("done", flush=True)


if __name__ == "__main__":
    directory, backend, concurrency, num_trials, *where = sys.argv[1:]
    stage, trial, round_num = (where + [None] * 3)[:3]
    kill = Kill(
        stage,
        None if trial is None else int(trial),
        None if round_num is None else int(round_num),
    )
    anyio.run(main, Path(directory), int(concurrency), int(num_trials), kill, backend=backend)
