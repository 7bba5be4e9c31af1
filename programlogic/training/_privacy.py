"""How ``train_model`` accounts a differentially private run: one accounting, kept in a
privacy ledger that every start checks and every round writes before its checkpoint.

A run is differentially private when its learning process has a
``privacy_accounting()`` that returns a :class:`~programlogic.privacy.PrivacyAccounting`
(the seam, documented there). :func:`run_privacy` checks, before anything starts, that
such a run has a ledger (``privacy_ledger``, or beside a file state manager's
directory) and that its budget stops are of the aggregator's mechanism and delta; it
returns a :class:`PrivateRun`, or :data:`NO_PRIVACY` for a process without noise.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import os
from pathlib import Path
from typing import Any

import anyio

from managers.clock import Clock
from managers.validation import check_number, check_path
from managers.values import is_value_reference, materialize
from programlogic.exceptions import PrivacySpentError
from programlogic.privacy import (
    GaussianMechanism,
    PrivacyAccounting,
    PrivacyBudgetStopping,
    composed_epsilon,
)
from programlogic.privacy_ledger import (
    LedgerEntry,
    PrivacyLedger,
    ledger_path_beside,
    secret_fingerprint,
)
from programlogic.process import LearningProcessOutput
from programlogic.stopping import AnyOf
from programlogic.training.checkpoint import Checkpoint

__all__ = ["NO_PRIVACY", "NoPrivacy", "PrivateRun", "run_privacy"]

logger = logging.getLogger(__name__)

ACKNOWLEDGEMENT_TOLERANCE = 1e-3
"""How close ``privacy_spent_acknowledged`` must be to the ledger's epsilon (relative,
and absolute for small figures): the message prints six significant digits."""


class NoPrivacy:
    """The run of a process that adds no noise: nothing to account."""

    async def __aenter__(self) -> NoPrivacy:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        return None

    async def check_start(self, initial_state: Any, loaded: Checkpoint | None) -> None:
        """Nothing to check."""

    async def record(self, round_num: int, output: LearningProcessOutput) -> LearningProcessOutput:
        """``output`` as it is."""
        return output


NO_PRIVACY = NoPrivacy()
"""The :class:`NoPrivacy` of every run without a privacy accounting."""


def run_privacy(
    *,
    process: Any,
    state_manager: Any,
    stopping: Any,
    ledger: Any,
    acknowledged: Any,
    clock: Clock,
) -> PrivateRun | NoPrivacy:
    """What ``train_model`` accounts of its run, checked before anything starts.

    Raises TypeError for a ``privacy_ledger`` that is not a path or a
    ``privacy_spent_acknowledged`` that is not a number, and ValueError, before round
    1: for a budget stop of another mechanism or delta than the process's accounting
    (or with a process that accounts no privacy); for a ledger path or an
    acknowledgement given to a run that accounts no privacy; for a DP run with neither
    a ledger path nor a file state manager; for a ledger inside the state directory.
    """
    path = check_path("privacy_ledger", ledger, allow_none=True)
    check_number("privacy_spent_acknowledged", acknowledged, minimum=0, allow_none=True)
    accounting = _accounting_of(process)
    budgets = _budget_stops(stopping)
    if accounting is None:
        if budgets:
            raise ValueError(
                f"stopping holds a PrivacyBudgetStopping of {budgets[0].mechanism!r}, but "
                f"train_process ({type(process).__name__}) accounts no privacy (it has no "
                "privacy_accounting(), or it returns None): the budget would count rounds "
                "that add no noise; build the process with a DP aggregator (dp_mean) and the "
                "stop with its budget_stopping(epsilon)"
            )
        if path is not None or acknowledged is not None:
            given = "privacy_ledger" if path is not None else "privacy_spent_acknowledged"
            value = str(path) if path is not None else acknowledged
            raise ValueError(
                f"{given}={value!r} is given, but train_process ({type(process).__name__}) "
                "accounts no privacy (it has no privacy_accounting(), or it returns None)"
            )
        return NO_PRIVACY
    for budget in budgets:
        _check_budget(budget, accounting)
    directory = _state_directory(state_manager)
    if path is None:
        if directory is None:
            raise ValueError(
                f"train_process is differentially private ({accounting.mechanism!r}) and "
                f"program_state_manager ({type(state_manager).__name__}) keeps no directory "
                "beside which its privacy ledger could live: give train_model "
                "privacy_ledger=<the path of a file outside the program state>, so that "
                "the privacy spent survives losing that state"
            )
        path = ledger_path_beside(directory)
    elif directory is not None and _inside(path, directory):
        raise ValueError(
            f"privacy_ledger={str(path)!r} is inside the program state's directory "
            f"{str(directory)!r}, which is deleted with the state: put it outside"
        )
    return PrivateRun(accounting, PrivacyLedger(path), acknowledged, budgets, clock)


@dataclasses.dataclass
class PrivateRun:
    """A differentially private run: its accounting, its ledger (open inside ``async
    with``), the acknowledgement it was given, and the budget stops it tells what was
    spent before it."""

    accounting: PrivacyAccounting
    ledger: PrivacyLedger
    acknowledged: float | None
    budgets: list[PrivacyBudgetStopping]
    clock: Clock
    secret: str | None = None
    spent_before: dict[GaussianMechanism, int] = dataclasses.field(default_factory=dict)

    async def __aenter__(self) -> PrivateRun:
        await self.ledger.__aenter__()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.ledger.__aexit__(*exc_info)

    async def check_start(self, initial_state: Any, loaded: Checkpoint | None) -> None:
        """Cross-check the ledger with the state the run starts from: the checkpoint
        ``loaded``, or ``initial_state`` when there is none (starting over).

        Raises PrivacySpentError when starting over while the ledger holds rounds
        without a matching acknowledgement, or when the checkpoint's aggregator counts
        other rounds than its round (an edited checkpoint, or another run's state).
        Records the checkpoint's rounds the ledger lacks (a run begun before it
        existed). Then tells the budget stops what earlier secrets spent.
        """
        state = initial_state if loaded is None else loaded.train_state
        aggregator = await self._aggregator_state(state)
        secret = secret_fingerprint(aggregator["secret"])
        if loaded is None:
            await self._check_starting_over()
        else:
            await self._check_resuming(loaded.round_num, secret, int(aggregator["rounds"]))
        self.secret = secret
        self.spent_before = self.ledger.rounds_by_mechanism(excluding_secret=secret)
        for budget in self.budgets:
            budget.count_spent_before(self.spent_before)
        if self.spent_before:
            logger.info(
                "privacy: the budget and the released epsilon count %d rounds of earlier "
                "noise secrets from the privacy ledger %s",
                sum(self.spent_before.values()),
                self.ledger.path,
            )

    async def record(self, round_num: int, output: LearningProcessOutput) -> LearningProcessOutput:
        """Record round ``round_num`` in the ledger (fsynced; once per secret and round)
        and return ``output`` with the epsilon the ledger accounts in its metrics."""
        aggregator = await self._aggregator_state(output.state)
        secret = secret_fingerprint(aggregator["secret"])
        if secret != self.secret:
            raise ValueError(
                f"the DP aggregator's noise secret changed in round {round_num}: the "
                "privacy accounting counts the rounds of one secret a run"
            )
        rounds = int(aggregator["rounds"])
        mechanism, delta = self.accounting.mechanism, self.accounting.delta
        counts = dict(self.spent_before)
        counts[mechanism] = counts.get(mechanism, 0) + rounds
        epsilon = await anyio.to_thread.run_sync(composed_epsilon, counts, delta)
        time = int(self.clock.now().timestamp())
        entry = LedgerEntry(secret, round_num, rounds, mechanism, delta, epsilon, time)
        await self.ledger.record(entry)
        metrics = await self._with_epsilon(output.metrics, epsilon)
        return LearningProcessOutput(output.state, metrics)

    async def _check_starting_over(self) -> None:
        entries = self.ledger.entries
        acknowledged = self.acknowledged
        if not entries:
            if acknowledged is not None and not _matches(acknowledged, 0.0):
                raise self._spent_error(
                    f"privacy_spent_acknowledged={acknowledged!r}, but the privacy ledger "
                    f"{self.ledger.path} records no privacy spent: is it the ledger of the "
                    "run you mean?",
                    0.0,
                )
            return
        spent = await anyio.to_thread.run_sync(self.ledger.spent, self.accounting.delta)
        summary = self._summary(spent)
        if acknowledged is None:
            raise self._spent_error(
                f"the program state holds no checkpoint to resume, but the privacy ledger "
                f"{self.ledger.path} records {summary}: starting over would count the "
                "privacy budget from zero; to start over counting what was spent, pass "
                f"privacy_spent_acknowledged={spent:.6g} to train_model",
                spent,
            )
        if not _matches(acknowledged, spent):
            raise self._spent_error(
                f"privacy_spent_acknowledged={acknowledged!r} does not match what the "
                f"privacy ledger {self.ledger.path} records: {summary}; pass "
                f"privacy_spent_acknowledged={spent:.6g} to start over counting it",
                spent,
            )
        logger.warning(
            "starting over with %s (privacy ledger %s, acknowledged): the budget and the "
            "released epsilon count it",
            summary,
            self.ledger.path,
        )

    async def _check_resuming(self, round_num: int, secret: str, rounds: int) -> None:
        held = self.ledger.rounds_of(secret)
        recorded = [entry.rounds for number, entry in held.items() if number <= round_num]
        if rounds != round_num or rounds < max(recorded, default=0):
            spent = await anyio.to_thread.run_sync(self.ledger.spent, self.accounting.delta)
            if held:
                evidence = (
                    f", but the privacy ledger {self.ledger.path} records {len(held)} rounds "
                    f"of this run's noise secret, up to round {max(held)} "
                    f"({self._summary(spent)} in all)"
                )
            else:
                evidence = (
                    f" for {round_num} rounds trained (the privacy ledger "
                    f"{self.ledger.path} records {self._summary(spent)})"
                )
            raise self._spent_error(
                f"cannot resume from the program state of round {round_num}: its DP "
                f"aggregator has counted {rounds} rounds{evidence}: the checkpoint was "
                "edited or holds another run's state, and resuming it would under-count "
                "the privacy spent",
                spent,
            )
        missing = [number for number in range(1, rounds + 1) if number not in held]
        if not missing:
            return
        logger.warning(
            "the privacy ledger %s lacked %d of the %d rounds the checkpoint of round %d "
            "holds (a run begun before its ledger, or a ledger lost): recorded from the "
            "checkpoint",
            self.ledger.path,
            len(missing),
            rounds,
            round_num,
        )
        time = int(self.clock.now().timestamp())
        mechanism, delta = self.accounting.mechanism, self.accounting.delta
        await self.ledger.record(
            *(
                LedgerEntry(secret, number, number, mechanism, delta, None, time)
                for number in missing
            )
        )

    async def _aggregator_state(self, train_state: Any) -> Any:
        """The DP aggregator's state in ``train_state``, materialized along its path only."""
        node = train_state
        path = self.accounting.state_path
        for depth, key in enumerate(path):
            if is_value_reference(node):
                node = await node.get_value()
            try:
                node = node[key]
            except (KeyError, TypeError, IndexError):
                raise KeyError(
                    f"the train state has no {'/'.join(path[: depth + 1])!r}, where "
                    "train_process's privacy_accounting() places its DP aggregator's state"
                ) from None
        return await materialize(node)

    async def _with_epsilon(self, metrics: Any, epsilon: float) -> Any:
        """``metrics`` with ``epsilon`` at the accounting's metrics path, when it is there."""
        if is_value_reference(metrics):
            metrics = await metrics.get_value()
        return _replaced(metrics, self.accounting.metrics_path, float(epsilon))

    def _summary(self, spent: float) -> str:
        entries = self.ledger.entries
        secrets = len({entry.secret for entry in entries})
        return (
            f"epsilon {spent:.6g} at delta {self.accounting.delta:g} spent over "
            f"{len(entries)} DP rounds ({secrets} noise secret{'s' if secrets != 1 else ''}, "
            f"up to round {max(entry.round_num for entry in entries)})"
            if entries
            else f"no DP round (epsilon 0 at delta {self.accounting.delta:g})"
        )

    def _spent_error(self, message: str, spent: float) -> PrivacySpentError:
        return PrivacySpentError(
            message,
            epsilon=spent,
            delta=self.accounting.delta,
            rounds=len(self.ledger.entries),
            ledger=self.ledger.path,
        )


def _accounting_of(process: Any) -> PrivacyAccounting | None:
    method = getattr(process, "privacy_accounting", None)
    if method is None:
        return None
    accounting = method()
    if accounting is not None and not isinstance(accounting, PrivacyAccounting):
        raise TypeError(
            "train_process.privacy_accounting() must return a PrivacyAccounting or None, "
            f"got {type(accounting).__name__} {accounting!r}"
        )
    return accounting


def _budget_stops(policy: Any) -> list[PrivacyBudgetStopping]:
    """The budget stops in ``policy``: itself, or inside an AnyOf (nested too)."""
    if isinstance(policy, PrivacyBudgetStopping):
        return [policy]
    if isinstance(policy, AnyOf):
        return [budget for inner in policy.policies for budget in _budget_stops(inner)]
    return []


def _check_budget(budget: PrivacyBudgetStopping, accounting: PrivacyAccounting) -> None:
    differences = [
        f"{field.name} {getattr(budget.mechanism, field.name)!r} (the aggregator's: "
        f"{getattr(accounting.mechanism, field.name)!r})"
        for field in dataclasses.fields(GaussianMechanism)
        if getattr(budget.mechanism, field.name) != getattr(accounting.mechanism, field.name)
    ]
    if not math.isclose(budget.delta, accounting.delta, rel_tol=1e-9, abs_tol=0):
        differences.append(f"delta {budget.delta!r} (the aggregator's: {accounting.delta!r})")
    if differences:
        raise ValueError(
            "stopping's PrivacyBudgetStopping accounts another mechanism than "
            f"train_process's DP aggregator adds, with {', '.join(differences)}: its budget "
            "would count rounds that are not the ones run; build it with the aggregator's "
            "budget_stopping(epsilon)"
        )


def _state_directory(manager: Any) -> Path | None:
    """The ``root_dir`` of a state manager, or of the one it wraps as ``inner``."""
    seen: set[int] = set()
    while manager is not None and id(manager) not in seen:
        seen.add(id(manager))
        root = getattr(manager, "root_dir", None)
        if isinstance(root, str | os.PathLike):
            return Path(root)
        manager = getattr(manager, "inner", None)
    return None


def _inside(path: Path, directory: Path) -> bool:
    return Path(os.path.abspath(path)).is_relative_to(os.path.abspath(directory))


def _matches(acknowledged: float, spent: float) -> bool:
    tolerance = ACKNOWLEDGEMENT_TOLERANCE
    return math.isclose(acknowledged, spent, rel_tol=tolerance, abs_tol=tolerance)


def _replaced(metrics: Any, path: tuple[str, ...], epsilon: float) -> Any:
    """A copy of ``metrics`` with ``epsilon`` under ``path``; ``metrics`` itself when the
    dict at ``path`` is not there or holds no ``epsilon``."""
    if not path:
        if isinstance(metrics, dict) and "epsilon" in metrics:
            return {**metrics, "epsilon": epsilon}
        return metrics
    if not isinstance(metrics, dict) or path[0] not in metrics:
        return metrics
    inner = _replaced(metrics[path[0]], path[1:], epsilon)
    return metrics if inner is metrics[path[0]] else {**metrics, path[0]: inner}
