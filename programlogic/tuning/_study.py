"""The study as a tuner sees it: Optuna's RDB storage, the trial locks, seeded suggestions.

Everything here blocks (SQLAlchemy, the locks): :class:`StudyStore` runs it on one
worker thread of its own, one call at a time, so a tuner's storage traffic never blocks
the event loop and never races itself.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import hashlib
import logging
import math
import numbers
import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import anyio
import anyio.to_thread

from programlogic._optional import require
from programlogic.tuning._locks import TrialLocks, check_storage_url, open_locks

optuna = require("optuna", "optuna", "programlogic.tuning", extra="tuning")
sqlalchemy = require("sqlalchemy", "SQLAlchemy", "programlogic.tuning", extra="tuning")

__all__ = ["Claim", "StudyStore", "derived_seed", "trial_directory"]

logger = logging.getLogger(__name__)

PRUNED_AT = "programlogic:pruned_at"
"""A trial's system attribute: the first step whose report made the pruner stop it."""
SETTINGS = "programlogic:settings"
"""The study's system attribute: what a rerun of the study must share (seed, metric)."""
ERROR = "error"
"""A failed trial's user attribute: its error, as ``Type: message``."""
FINAL_ROUND = "final_round"
"""A finished trial's user attribute: the last round it trained."""


def trial_directory(root: Path, number: int) -> Path:
    """Where trial ``number`` of a study under ``root`` keeps its files."""
    return root / "trials" / str(number)


def derived_seed(seed: int, *labels: object) -> int:
    """A 32-bit seed that is a pure function of ``seed`` and ``labels``."""
    text = "/".join(["tuning", str(seed), *map(str, labels)])
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:4], "little")


@dataclasses.dataclass(frozen=True)
class Claim:
    """A trial a tuner took: new (to suggest for) or resumed (its tuner is gone)."""

    number: int
    trial_id: int
    resumed: bool


class _SeededSampler(optuna.samplers.BaseSampler):
    """A sampler made afresh for each suggestion, seeded by (study seed, trial, parameter).

    A sampler's random state lives in its process; building it again from a pure
    function of the study seed for every suggestion makes a rerun after a crash suggest
    what the first run would have, down to a trial interrupted halfway through its
    suggestions.
    """

    def __init__(self, make: Callable[[int], Any], seed: int, number: int) -> None:
        self._make = make
        self._seed = seed
        self._number = number

    def _fresh(self, label: str) -> Any:
        return self._make(derived_seed(self._seed, self._number, label))

    def infer_relative_search_space(self, study: Any, trial: Any) -> dict[str, Any]:
        return self._fresh("relative").infer_relative_search_space(study, trial)

    def sample_relative(self, study: Any, trial: Any, search_space: Any) -> dict[str, Any]:
        return self._fresh("relative").sample_relative(study, trial, search_space)

    def sample_independent(
        self, study: Any, trial: Any, param_name: str, param_distribution: Any
    ) -> Any:
        sampler = self._fresh(f"param/{param_name}")
        return sampler.sample_independent(study, trial, param_name, param_distribution)

    def before_trial(self, study: Any, trial: Any) -> None:
        self._fresh("before_trial").before_trial(study, trial)

    def after_trial(self, study: Any, trial: Any, state: Any, values: Any) -> None:
        self._fresh("after_trial").after_trial(study, trial, state, values)


class _CheckedTrial(optuna.Trial):
    """An ``optuna.Trial`` whose numeric suggestions refuse bounds that are not finite.

    Optuna passes a NaN or infinite bound on to numpy, which fails with an error that
    names neither the parameter nor the bound (``OverflowError: Range exceeds valid
    bounds``); a search space's mistake then reads as a bug of the tuner.
    """

    def suggest_float(
        self,
        name: str,
        low: float,
        high: float,
        *,
        step: float | None = None,
        log: bool = False,
    ) -> float:
        _check_finite_bounds(name, low, high)
        return super().suggest_float(name, low, high, step=step, log=log)

    def suggest_int(
        self, name: str, low: int, high: int, *, step: int = 1, log: bool = False
    ) -> int:
        _check_finite_bounds(name, low, high)
        return super().suggest_int(name, low, high, step=step, log=log)


def _check_finite_bounds(name: str, low: object, high: object) -> None:
    for which, bound in (("low", low), ("high", high)):
        if isinstance(bound, numbers.Real) and not math.isfinite(bound):
            raise ValueError(
                f"the search space's parameter {name!r} has the {which} bound {bound!r}, "
                f"not a finite number (bounds {low!r} to {high!r})"
            )


class _TrialCodeError(Exception):
    """Carries an error of a trial's own code out of the store's thread."""

    def __init__(self, error: Exception) -> None:
        super().__init__(error)
        self.error = error


class StudyStore:
    """One tuner's handle on the study: its storage, its locks and its running trials."""

    def __init__(
        self,
        *,
        url: str,
        study_name: str,
        direction: str,
        root: Path,
        seed: int,
        metric: str,
        make_sampler: Callable[[int], Any],
        pruner: Any,
    ) -> None:
        self._url = url
        self._study_name = study_name
        self._direction = direction
        self._root = root
        self._seed = seed
        self._metric = metric
        self._make_sampler = make_sampler
        self._pruner = pruner
        self._limiter = anyio.CapacityLimiter(1)
        self._locks: TrialLocks | None = None
        self._storage: Any = None
        self._study: Any = None
        self._trial_studies: dict[int, Any] = {}
        self._active: set[int] = set()
        self.failure: BaseException | None = None
        """The first error of the storage or the locks: a failure of the tuner itself."""
        self.seconds = 0.0
        """The seconds awaited in :meth:`call`, summed (waits for one another included)."""
        self.calls = 0
        """How many :meth:`call` calls were made."""

    async def call(self, function: Callable[..., Any], *args: Any) -> Any:
        """Run ``function(*args)`` on the store's thread; remember an error as the tuner's."""
        start = time.perf_counter()
        try:
            return await anyio.to_thread.run_sync(function, *args, limiter=self._limiter)
        except _TrialCodeError as error:
            raise error.error from None
        except Exception as error:
            if self.failure is None:
                self.failure = error
            raise
        finally:
            self.seconds += time.perf_counter() - start
            self.calls += 1

    # Everything below runs on the store's thread, through call().

    def open(self) -> None:
        """Connect, take the locks' connection, create the study or check the one there."""
        sqlite = check_storage_url(self._url) == "sqlite"
        database = None
        if self._url.startswith("sqlite:///"):
            database = Path(self._url.removeprefix("sqlite:///"))
            database.parent.mkdir(parents=True, exist_ok=True)
        self._locks = open_locks(self._url, self._study_name, self._root)
        settings = {"seed": self._seed, "metric": self._metric}
        with self._locks.lock_study(), _named_database_errors(database, self._root):
            # The first tuner creates the tables, alone.
            self._storage = optuna.storages.RDBStorage(
                self._url,
                # Several tuners may share one SQLite file: wait for its lock, not fail.
                engine_kwargs={"connect_args": {"timeout": 60}}
                if sqlite
                else {"pool_pre_ping": True},
            )
            if sqlite:
                sqlalchemy.event.listen(self._storage.engine, "connect", _sqlite_write_ahead)
                self._storage.engine.dispose()  # the connections made so far lack it
            self._study = optuna.create_study(
                storage=self._storage,
                study_name=self._study_name,
                direction=self._direction,
                pruner=self._pruner,
                load_if_exists=True,
            )
            saved = self._storage.get_study_system_attrs(self._study._study_id).get(SETTINGS)
            if saved is None:
                self._storage.set_study_system_attr(self._study._study_id, SETTINGS, settings)
        _check_same_study(self._study, self._direction, saved, settings)

    def close(self) -> None:
        """Release the locks (the running trials become free to take over)."""
        if self._locks is not None:
            self._locks.close()
        if self._storage is not None:
            self._storage.remove_session()
            self._storage.engine.dispose()

    @property
    def study(self) -> Any:
        """The ``optuna.Study``."""
        return self._study

    def claim(self, num_trials: int) -> Claim | bool:
        """Take the next trial to run: a running one whose tuner is gone, else a new one.

        ``True`` when there is nothing to take now but trials held by other tuners may
        become free; ``False`` when the study has nothing left to run.
        """
        assert self._locks is not None
        with self._locks.lock_study():
            # The storage itself, not the study's cache, which may hold a trial as
            # running after another tuner ended it.
            trials = self._storage.get_all_trials(self._study._study_id, deepcopy=False)
            running = [
                trial
                for trial in trials
                if trial.state == optuna.trial.TrialState.RUNNING
                and trial.number not in self._active
            ]
            for trial in sorted(running, key=lambda trial: trial.number):
                if not self._locks.try_lock_trial(trial.number):
                    continue
                # Its tuner may have ended it and let go between the read and the lock.
                if self._storage.get_trial(trial._trial_id).state.is_finished():
                    self._locks.unlock_trial(trial.number)
                    continue
                self._active.add(trial.number)
                return Claim(trial.number, trial._trial_id, resumed=True)
            if len(trials) < num_trials:
                # Optuna numbers a study's trials in the order they are created.
                self._check_no_unknown_run(len(trials))
                trial_id = self._storage.create_new_trial(self._study._study_id)
                number = self._storage.get_trial_number_from_id(trial_id)
                if not self._locks.try_lock_trial(number):
                    raise RuntimeError(f"trial {number} was locked before it was created")
                self._active.add(number)
                return Claim(number, trial_id, resumed=False)
            return bool(running)

    def _check_no_unknown_run(self, number: int) -> None:
        """Refuse to create trial ``number`` when its directory holds files already: a
        run the study has no record of, which the new trial would resume as its own."""
        directory = trial_directory(self._root, number)
        if not directory.is_dir() or not any(directory.iterdir()):
            return
        raise RuntimeError(
            f"trial {number}'s directory {directory} holds a run that the study "
            f"{self._study_name!r} has no record of (its database was emptied or replaced, "
            "or lost its newest commits in a power cut), which a new trial would take as "
            f"its own; to go on from what the study records, move {directory} away (and "
            "the directories of the trials after it); to keep those runs, restore the "
            "study database they belong to; or give tune another root"
        )

    def release(self, number: int) -> None:
        """Let go of trial ``number``: finished, or left for a later tuner to resume."""
        assert self._locks is not None
        self._active.discard(number)
        self._trial_studies.pop(number, None)
        self._locks.unlock_trial(number)

    def trial_study(self, number: int) -> Any:
        """The study as trial ``number`` sees it: sampled with that trial's seeded sampler."""
        study = self._trial_studies.get(number)
        if study is None:
            study = optuna.load_study(
                study_name=self._study_name,
                storage=self._storage,
                sampler=_SeededSampler(self._make_sampler, self._seed, number),
                pruner=self._pruner,
            )
            self._trial_studies[number] = study
        return study

    def suggest(self, claim: Claim, search_space: Callable[[Any], Any]) -> dict[str, Any]:
        """Run ``search_space`` on the trial; the parameters already suggested are kept."""
        study = self.trial_study(claim.number)
        study.get_trials(deepcopy=False)  # Optuna's storage cache learns of the new trial
        trial = _CheckedTrial(study, claim.trial_id)
        try:
            search_space(trial)
        except Exception as error:  # the user's code: the trial fails, not the tuner
            raise _TrialCodeError(error) from error
        return dict(trial.params)

    def report(self, claim: Claim, step: int, value: float) -> int | None:
        """Record ``value`` at ``step`` once, deciding on pruning before recording it.

        The decision is saved first, so a report replayed after a crash (the step not
        recorded yet) decides again, and one recorded is never decided twice. Returns
        the step the trial was pruned at, if it was.
        """
        trial = self._storage.get_trial(claim.trial_id)
        pruned_at = trial.system_attrs.get(PRUNED_AT)
        if step in trial.intermediate_values:
            return pruned_at
        trial.intermediate_values = {**trial.intermediate_values, step: value}
        study = self.trial_study(claim.number)
        if study.pruner.prune(study, trial) and (pruned_at is None or step < pruned_at):
            pruned_at = step
            self._storage.set_trial_system_attr(claim.trial_id, PRUNED_AT, step)
        self._storage.set_trial_intermediate_value(claim.trial_id, step, value)
        return pruned_at

    def pruned_at(self, claim: Claim) -> int | None:
        """The step at which trial ``claim`` was pruned, or None."""
        return self._storage.get_trial_system_attrs(claim.trial_id).get(PRUNED_AT)

    def finish(
        self,
        claim: Claim,
        state: Any,
        final_round: int | None = None,
        error: str | None = None,
    ) -> None:
        """Tell the study the trial ended: complete, pruned or failed.

        A complete trial whose objective is NaN raises the ValueError its trial fails
        with (as a trial's error), recording nothing: Optuna cannot rank a NaN, and a
        pruned trial is one the pruner stopped early.
        """
        study = self.trial_study(claim.number)
        values = None
        if state == optuna.trial.TrialState.COMPLETE and final_round is not None:
            intermediate = self._storage.get_trial(claim.trial_id).intermediate_values
            if final_round not in intermediate:
                raise self._unreported_error(claim.number, final_round)
            if math.isnan(intermediate[final_round]):
                raise _TrialCodeError(
                    ValueError(
                        f"the objective {self._metric!r} of trial {claim.number} is nan at "
                        f"its last round {final_round}, which a study cannot rank: the "
                        "trial failed (did its training diverge?)"
                    )
                )
            values = [intermediate[final_round]]
        if error is not None:
            self._storage.set_trial_user_attr(claim.trial_id, ERROR, error)
        if final_round is not None:
            self._storage.set_trial_user_attr(claim.trial_id, FINAL_ROUND, final_round)
        study.tell(claim.number, values, state=state)

    def _unreported_error(self, number: int, final_round: int) -> RuntimeError:
        directory = trial_directory(self._root, number)
        return RuntimeError(
            f"trial {number}'s run in {directory} ended at round {final_round}, but the "
            f"study {self._study_name!r} has no record of its evaluation (its database "
            "lost its newest commits, as in a power cut, or was replaced by an older "
            f"copy), so the trial has no value; move {directory} away to run the trial "
            "again from its start, or restore the study database the run belongs to"
        )

    def trials(self) -> list[Any]:
        """Every trial of the study (``optuna.trial.FrozenTrial``), in number order."""
        return self._study.get_trials(deepcopy=True)


@contextlib.contextmanager
def _named_database_errors(database: Path | None, root: Path) -> Iterator[None]:
    """Raise what SQLite says about the study ``database`` file as an error naming it."""
    try:
        yield
    except sqlalchemy.exc.DatabaseError as error:
        if database is None:
            raise
        cause = str(getattr(error, "orig", None) or error)
        effective = os.access in os.supports_effective_ids
        writable = all(
            os.access(path, os.W_OK, effective_ids=effective)
            for path in (database, database.parent)
            if path.exists()
        )
        if not writable:
            raise PermissionError(
                errno.EACCES,
                f"cannot open the study database read-write ({cause}): it or its "
                "directory is read-only for this process, and SQLite writes both (its "
                "write-ahead log lives beside it); make them writable, or copy the study "
                "to a writable place and give tune that copy",
                str(database),
            ) from error
        if "not a database" in cause or "malformed" in cause:
            raise RuntimeError(
                f"cannot open the study database {database}: it is damaged ({cause}); "
                "restore it from a backup, or move it away to start the study afresh "
                f"(and move {root / 'trials'} too, whose trials it recorded)"
            ) from error
        raise RuntimeError(f"cannot open the study database {database}: {cause}") from error


def _sqlite_write_ahead(connection: Any, record: Any) -> None:
    # A write-ahead log synced at checkpoints: a commit survives the process's death
    # (kill -9); a power cut may lose the newest commits, never the file's consistency,
    # and a trial found running again resumes from its checkpoint. A commit costs
    # a third less than with a synced rollback journal.
    cursor = connection.cursor()
    cursor.execute("PRAGMA journal_mode=WAL")
    cursor.execute("PRAGMA synchronous=NORMAL")
    cursor.close()


def _check_same_study(
    study: Any, direction: str, saved: dict[str, Any] | None, settings: dict[str, Any]
) -> None:
    if study.direction.name.lower() != direction:
        raise ValueError(
            f"the study {study.study_name!r} maximizes or minimizes as "
            f"{study.direction.name.lower()!r}, not as the given direction {direction!r}"
        )
    if saved is not None and saved != settings:
        changed = {
            key: (saved[key], settings[key]) for key in settings if saved[key] != settings[key]
        }
        details = ", ".join(
            f"{key} {old!r} in the study, {new!r} given" for key, (old, new) in changed.items()
        )
        raise ValueError(
            f"the study {study.study_name!r} was run with other settings: {details}; "
            "use another study name (or root) for a new study"
        )
