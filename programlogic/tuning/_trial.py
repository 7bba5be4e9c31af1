"""One trial: a ``train_model`` run with its own managers, reporting to the study."""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import anyio.to_thread

from managers.release.base import ReleaseKey, ReleaseManager, check_key
from managers.validation import check_int, check_interface
from programlogic.data import FederatedDataSource
from programlogic.file_run import FileRun, FileRunEvaluation
from programlogic.process import LearningProcess
from programlogic.stopping import StoppingPolicy, StopReason, metric_of_round
from programlogic.training import TrainingResult, train_model
from programlogic.tuning._study import Claim, StudyStore

__all__ = ["PRUNED", "TrialProgram", "TrialSpec", "run_trial"]

PRUNED = StopReason("pruned")
"""The stop reason of a trial the pruner stopped."""


@dataclasses.dataclass(frozen=True)
class TrialSpec:
    """What a trial's factory gets: the trial's number, parameters and directory.

    ``directory`` is ``<root>/trials/<number>``, where the tuner keeps the trial's
    program state, metrics, evaluations and final model; the factory may keep files of
    its own there too.
    """

    number: int
    params: dict[str, Any]
    directory: Path


@dataclasses.dataclass(frozen=True)
class TrialProgram:
    """What a trial trains and how it is evaluated: ``train_model``'s inputs for one trial.

    The training half is ``train_model``'s own arguments. Evaluation: every
    ``evaluation_periodicity`` rounds (and the initial and the last model), one round
    of ``evaluation_process`` on ``evaluation_per_round_clients`` clients of
    ``evaluation_data_source``; the tuner's objective metric is read from its metrics.
    Training waits for each evaluation, so that pruning, which decides on it, stops the
    trial at the same round on every run. ``seed`` is ``train_model``'s.
    """

    train_process: LearningProcess
    train_data_source: FederatedDataSource
    train_per_round_clients: int
    train_total_rounds: int
    evaluation_process: LearningProcess
    evaluation_data_source: FederatedDataSource
    evaluation_per_round_clients: int
    evaluation_periodicity: int = 1
    seed: int = 0

    def __post_init__(self) -> None:
        for name in ("train_process", "evaluation_process"):
            check_interface(name, getattr(self, name), "LearningProcess", ["initialize", "next"])
        for name in ("train_data_source", "evaluation_data_source"):
            check_interface(name, getattr(self, name), "FederatedDataSource", ["iterator"])
        check_int("train_per_round_clients", self.train_per_round_clients, minimum=1)
        check_int("train_total_rounds", self.train_total_rounds, minimum=1)
        check_int("evaluation_per_round_clients", self.evaluation_per_round_clients, minimum=1)
        check_int("evaluation_periodicity", self.evaluation_periodicity, minimum=1)
        check_int("seed", self.seed, minimum=0)


class _Pruning(StoppingPolicy, ReleaseManager):
    """Reports a trial's evaluations to the study, and stops the trial once pruned.

    Fed the aggregated evaluation metrics, it reports the objective of each evaluated
    round; the study's answer (the round the pruner stopped the trial at, if it did)
    is kept here, since only this trial's reports change it. The trial stops at that
    round: training waits for each evaluation, so ``after_evaluation`` of the round
    comes after its report.
    """

    def __init__(self, store: StudyStore, claim: Claim, metric: str) -> None:
        self._store = store
        self._claim = claim
        self._metric = metric
        self.pruned_at: int | None = None

    async def release(self, value: Any, key: ReleaseKey) -> None:
        # Round 0 is the initial model: nothing a trial's parameters trained yet.
        if isinstance(check_key(key), str) or key == 0:
            return
        value = await metric_of_round(value, self._metric, key, "the objective metric")
        self.pruned_at = await self._store.call(self._store.report, self._claim, key, value)

    async def before_round(self, round_num: int) -> StopReason | None:
        pruned = self.pruned_at is not None and self.pruned_at < round_num
        return PRUNED if pruned else None

    async def after_evaluation(self, round_num: int) -> StopReason | None:
        pruned = self.pruned_at is not None and self.pruned_at <= round_num
        return PRUNED if pruned else None


async def build_program(
    build_trial: Callable[[TrialSpec], TrialProgram | Awaitable[TrialProgram]], spec: TrialSpec
) -> TrialProgram:
    """Call the user's factory: a coroutine function on the loop, any other on a thread."""
    if inspect.iscoroutinefunction(build_trial):
        program = await build_trial(spec)
    else:
        program = await anyio.to_thread.run_sync(build_trial, spec)
        if inspect.isawaitable(program):
            program = await program
    if not isinstance(program, TrialProgram):
        raise TypeError(
            f"build_trial must return a TrialProgram, got {type(program).__name__} for trial "
            f"{spec.number}"
        )
    return program


async def run_trial(
    store: StudyStore, claim: Claim, program: TrialProgram, metric: str, directory: Path
) -> TrainingResult:
    """Train the trial to its end (or its pruning), resuming what its directory holds."""
    pruning = _Pruning(store, claim, metric)
    pruning.pruned_at = await store.call(store.pruned_at, claim)  # set before a crash
    evaluation = FileRunEvaluation(
        process=program.evaluation_process,
        data_source=program.evaluation_data_source,
        cohort_size=program.evaluation_per_round_clients,
        # One at a time, in the order started: the initial model's evaluation, which
        # overlaps rounds 1.. even as training waits, ends before round r's, so
        # evaluation.csv's rows are in round order on every run.
        max_concurrent=1,
        seed=program.seed,
        metrics_managers=[pruning],
        state_keep_total=5,
    )
    async with FileRun(directory, state_keep_total=5, evaluation=evaluation) as run:
        return await train_model(
            train_process=program.train_process,
            train_data_source=program.train_data_source,
            train_per_round_clients=program.train_per_round_clients,
            train_total_rounds=program.train_total_rounds,
            evaluation_periodicity=program.evaluation_periodicity,
            seed=program.seed,
            stopping=pruning,
            stopping_waits_for_evaluations=True,
            **run.train_model_arguments(),
        )
