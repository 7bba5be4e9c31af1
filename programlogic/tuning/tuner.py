"""``tune``: a hyperparameter study whose trials are ``train_model`` runs."""

from __future__ import annotations

import dataclasses
import datetime
import logging
import os
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import anyio

from managers.taskgroups import task_group
from managers.validation import (
    check_bool,
    check_callable,
    check_choice,
    check_int,
    check_path,
    check_str,
    check_timedelta,
    check_type,
)
from programlogic.context import check_in_federated_context
from programlogic.training import final_model_key
from programlogic.tuning._locks import check_storage_url
from programlogic.tuning._study import (
    ERROR,
    FINAL_ROUND,
    Claim,
    StudyStore,
    optuna,
    trial_directory,
)
from programlogic.tuning._trial import PRUNED, TrialProgram, TrialSpec, build_program, run_trial

__all__ = ["StudyProgress", "TrialSummary", "TuningResult", "tune"]

logger = logging.getLogger(__name__)

_STATES = {
    optuna.trial.TrialState.RUNNING: "running",
    optuna.trial.TrialState.WAITING: "waiting",
    optuna.trial.TrialState.COMPLETE: "complete",
    optuna.trial.TrialState.PRUNED: "pruned",
    optuna.trial.TrialState.FAIL: "failed",
}


@dataclasses.dataclass(frozen=True)
class TrialSummary:
    """A trial of the study as it stands.

    ``state``: ``"running"``, ``"complete"``, ``"pruned"`` or ``"failed"``;
    ``value``: the objective (the metric of the last round's evaluation; for a pruned
    trial the last reported one); ``intermediate_values``: train round -> the metric
    of that round's evaluation; ``final_round``: the last round trained, once it
    ended; ``model_key``: the key of its final model in the ``ModelFileReleaseManager``
    on ``directory / "models"``; ``error``: why a failed trial failed.
    """

    number: int
    state: str
    params: dict[str, Any]
    value: float | None
    intermediate_values: dict[int, float]
    directory: Path
    final_round: int | None
    error: str | None

    @property
    def model_key(self) -> str | None:
        """The final model's key, once the trial ended with one (complete or pruned)."""
        if self.final_round is None or self.state == "failed":
            return None
        return final_model_key(self.final_round)


@dataclasses.dataclass(frozen=True)
class StudyProgress:
    """How many trials are in each state, the best so far, and the trial that changed.

    ``best`` is ``None`` before a trial completes; ``trial`` is the trial this tuner
    just started (``state == "running"``) or ended, ``None`` in the first report.
    """

    running: int
    complete: int
    pruned: int
    failed: int
    best: TrialSummary | None
    trial: TrialSummary | None = None


@dataclasses.dataclass(frozen=True)
class TuningResult:
    """What ``tune`` returns: every trial, the best complete one, and Optuna's study."""

    trials: list[TrialSummary]
    best: TrialSummary | None
    study: Any
    """The ``optuna.Study``, e.g. for ``optuna.visualization``."""
    storage_seconds: float = 0.0
    """The seconds ``tune`` awaited its study's storage and locks, summed over its calls:
    the direct part of the tuner's own overhead (with ``concurrency`` above 1 the sum
    includes the calls' waits for one another)."""
    storage_calls: int = 0
    """How many calls to the study's storage and locks ``tune`` made."""


async def tune(
    *,
    search_space: Callable[[Any], Any],
    build_trial: Callable[[TrialSpec], TrialProgram | Awaitable[TrialProgram]],
    metric: str,
    direction: str,
    num_trials: int,
    root: str | os.PathLike[str],
    concurrency: int = 1,
    storage: str | None = None,
    study_name: str = "study",
    seed: int = 0,
    sampler: Callable[[int], Any] | None = None,
    pruner: Any = None,
    fail_fast: bool = False,
    poll_interval: datetime.timedelta = datetime.timedelta(seconds=5),
    on_progress: Callable[[StudyProgress], Any] | None = None,
) -> TuningResult:
    """Run a study of ``num_trials`` trials, ``concurrency`` at a time, resuming it if begun.

    Runs in the current federated context, which the trials share. A trial:

    1. gets its parameters from ``search_space(trial)``, a function of an
       ``optuna.Trial`` that calls its ``suggest_*`` methods (on a worker thread); a
       bound of ``suggest_float`` or ``suggest_int`` that is NaN or infinite fails the
       trial with a ValueError naming the parameter and the bound;
    2. gets a :class:`TrialProgram` from ``build_trial(TrialSpec(number, params,
       directory))`` (a coroutine function, or a function run on a worker thread);
    3. is a ``train_model`` run with file program state, CSV metrics
       (``metrics.csv``, ``evaluation.csv``), evaluation state and the final model
       under ``<root>/trials/<number>/``;
    4. reports ``metric`` (a path in the evaluation metrics, see
       :mod:`managers.structure`) of each evaluated round to the study, with the train
       round as the step (not round 0's: the initial model owes nothing to the trial's
       parameters, and its value would be every trial's best-so-far for the pruner);
       the ``pruner`` (Optuna's, ``MedianPruner()`` by default) decides on each
       report, and a pruned trial stops at that round with stop reason ``"pruned"``;
    5. ends complete, with the last round's metric as its value, or pruned, or failed
       (its program raised: the error is kept in its user attribute ``"error"`` and the
       study goes on, unless ``fail_fast``, which raises it). A last round's metric that
       is NaN (a diverging training) fails the trial with a ValueError saying so, as
       Optuna's own ``optimize`` does: a study cannot rank NaN, and "pruned" would say
       the pruner stopped it early, which it did not; samplers learn nothing from a
       failed trial.

    The study lives in Optuna's RDB ``storage`` (any SQLAlchemy URL of SQLite or
    PostgreSQL; ``sqlite:///<root>/study.db`` by default) under ``study_name``, maximizing
    or minimizing (``direction``). ``sampler(seed)`` makes an Optuna sampler
    (``TPESampler(seed=seed)`` by default); it is made afresh for every suggestion, seeded
    by ``(seed, trial number, parameter)``, so suggestions do not depend on what ran in
    this process before.

    Crash safety: run the same call again after any crash (kill -9 included). Ended
    trials stay as they are; a trial that was running resumes from its own checkpoint
    with its parameters; the study never holds more than ``num_trials`` trials. A
    tuner holds a lock on each trial it runs (a file lock beside SQLite, an advisory
    lock in PostgreSQL) that dies with it: tuners sharing a study (and ``root``) split
    its trials, and take over the running trials of one that died, checking for them
    every ``poll_interval`` once there is no other work. A trial directory that holds
    files before the study created its trial (the study's database emptied or
    replaced, or its newest commits lost in a power cut) is refused with a RuntimeError
    naming it and what to do, and so is a running trial whose run ended but whose last
    evaluation the study has no record of: a trial never takes over a run it did not
    make, nor ends without a value. ``tune`` returns when no trial
    is left to run or running. ``on_progress(StudyProgress)`` is called (on the event
    loop) once the study is open, then whenever a trial of this tuner starts (its
    parameters suggested, so the report shows them) or ends.

    Raises what the storage or the locks raise (a failure of the tuner itself): a
    SQLite study database that is damaged raises a RuntimeError naming the file, one
    this process cannot write a PermissionError naming it. With ``fail_fast``, raises
    a trial's error. The trials that were running are then left to resume.
    """
    check_callable("search_space", search_space)
    check_callable("build_trial", build_trial)
    check_str("metric", metric, allow_empty=False)
    direction = check_choice("direction", direction, ["maximize", "minimize"])
    check_int("num_trials", num_trials, minimum=1)
    root_path = Path(check_path("root", root))
    check_int("concurrency", concurrency, minimum=1)
    check_str("storage", storage, allow_empty=False, allow_none=True)
    if storage is not None:
        check_storage_url(storage)
    check_str("study_name", study_name, allow_empty=False)
    check_int("seed", seed, minimum=0)
    check_callable("sampler", sampler, allow_none=True)
    check_type("pruner", pruner, optuna.pruners.BasePruner, allow_none=True)
    check_bool("fail_fast", fail_fast)
    check_timedelta("poll_interval", poll_interval, minimum=datetime.timedelta(0))
    check_callable("on_progress", on_progress, allow_none=True)
    check_in_federated_context()

    store = StudyStore(
        url=storage or f"sqlite:///{root_path.absolute() / 'study.db'}",
        study_name=study_name,
        direction=direction,
        root=root_path,
        seed=seed,
        metric=metric,
        make_sampler=sampler or (lambda seed: optuna.samplers.TPESampler(seed=seed)),
        pruner=optuna.pruners.MedianPruner() if pruner is None else pruner,
    )
    tuner = _Tuner(store, search_space, build_trial, metric, root_path, fail_fast, on_progress)
    try:
        await store.call(store.open)
        await tuner.progress(None)
        async with task_group() as slots:
            for _ in range(concurrency):
                slots.start_soon(tuner.run_slot, num_trials, poll_interval)
        trials = [_summary(trial, root_path) for trial in await store.call(store.trials)]
    finally:
        with anyio.CancelScope(shield=True):
            await store.call(store.close)
    return TuningResult(
        trials=trials,
        best=_best(trials, direction),
        study=store.study,
        storage_seconds=store.seconds,
        storage_calls=store.calls,
    )


class _Tuner:
    """The slots of one ``tune`` call: each takes a trial, runs it, takes the next."""

    def __init__(
        self,
        store: StudyStore,
        search_space: Callable[[Any], Any],
        build_trial: Callable[[TrialSpec], Any],
        metric: str,
        root: Path,
        fail_fast: bool,
        on_progress: Callable[[StudyProgress], Any] | None,
    ) -> None:
        self._store = store
        self._search_space = search_space
        self._build_trial = build_trial
        self._metric = metric
        self._root = root
        self._fail_fast = fail_fast
        self._on_progress = on_progress

    async def run_slot(self, num_trials: int, poll_interval: datetime.timedelta) -> None:
        while True:
            claim = await self._store.call(self._store.claim, num_trials)
            if claim is False:
                return
            if claim is True:
                await anyio.sleep(poll_interval.total_seconds())
                continue
            try:
                await self._run(claim)
            finally:
                with anyio.CancelScope(shield=True):
                    await self._release(claim.number)
            await self.progress(claim.number)

    async def _release(self, number: int) -> None:
        try:
            await self._store.call(self._store.release, number)
        except Exception as error:
            if self._store.failure is error:
                raise
            # The tuner failed already (its database, say): that first error is raised.
            logger.debug(
                "could not release trial %d after the tuner failed", number, exc_info=error
            )

    async def _run(self, claim: Claim) -> None:
        store = self._store
        directory = trial_directory(self._root, claim.number)
        logger.info("%s trial %d", "resuming" if claim.resumed else "starting", claim.number)
        try:
            params = await store.call(store.suggest, claim, self._search_space)
        except Exception as error:
            await self._fail(claim, error)
            return
        await self.progress(claim.number)  # started, with the parameters it uses
        try:
            program = await build_program(
                self._build_trial, TrialSpec(claim.number, params, directory)
            )
            result = await run_trial(store, claim, program, self._metric, directory)
            pruned = result.stop_reason == PRUNED
            state = optuna.trial.TrialState.PRUNED if pruned else optuna.trial.TrialState.COMPLETE
            await store.call(store.finish, claim, state, result.round_num)
        except Exception as error:
            await self._fail(claim, error)
            return
        logger.info(
            "trial %d ended %s at round %d", claim.number, result.stop_reason, result.round_num
        )

    async def _fail(self, claim: Claim, error: Exception) -> None:
        """Record ``error`` as the trial's, or raise it: the tuner's own, or ``fail_fast``."""
        store = self._store
        if store.failure is not None:
            raise store.failure from None
        logger.error("trial %d failed", claim.number, exc_info=error)
        failed = optuna.trial.TrialState.FAIL
        await store.call(store.finish, claim, failed, None, f"{type(error).__name__}: {error}")
        if self._fail_fast:
            raise error

    async def progress(self, number: int | None) -> None:
        """Tell ``on_progress`` where the study stands, and which trial changed."""
        if self._on_progress is None:
            return
        trials = [
            _summary(trial, self._root) for trial in await self._store.call(self._store.trials)
        ]
        changed = next((trial for trial in trials if trial.number == number), None)
        counts = {
            state: sum(trial.state == state for trial in trials) for state in _STATES.values()
        }
        direction = self._store.study.direction.name.lower()
        best = _best(trials, direction)
        self._on_progress(
            StudyProgress(
                running=counts["running"],
                complete=counts["complete"],
                pruned=counts["pruned"],
                failed=counts["failed"],
                best=best,
                trial=changed,
            )
        )


def _summary(trial: Any, root: Path) -> TrialSummary:
    return TrialSummary(
        number=trial.number,
        state=_STATES[trial.state],
        params=dict(trial.params),
        value=trial.value,
        intermediate_values=dict(trial.intermediate_values),
        directory=trial_directory(root, trial.number),
        final_round=trial.user_attrs.get(FINAL_ROUND),
        error=trial.user_attrs.get(ERROR),
    )


def _best(trials: list[TrialSummary], direction: str) -> TrialSummary | None:
    """The best complete trial (the lowest number among equals), or None."""
    complete = [trial for trial in trials if trial.state == "complete"]
    if not complete:
        return None
    if direction == "maximize":
        return max(complete, key=lambda trial: (trial.value, -trial.number))
    return min(complete, key=lambda trial: (trial.value, trial.number))
