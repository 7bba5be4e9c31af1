"""Privacy accounting of DP federated training: a round's mechanism, its epsilon, a budget stop.

A :class:`GaussianMechanism` describes one differentially private round: the clipped
updates of the round's clients are summed on a trusted server and Gaussian noise of
standard deviation ``noise_multiplier x sensitivity_factor x clip`` is added; the
clients are sampled as ``sampling`` says. What it guarantees is central, user-level
DP (one client's whole data is the unit):

- ``"poisson"``: each client joins a round with probability ``q = k / N``
  (:attr:`programlogic.Sampling.POISSON`); accounted as ``PoissonSampledDpEvent``
  under add-or-remove-one adjacency.
- ``"uniform"``: exactly ``k`` of ``N`` without replacement, new every round;
  accounted (RDP only) as ``SampledWithoutReplacementDpEvent``, which holds under
  replace-one adjacency, whose sensitivity is twice the clip.
- ``"fixed"``: the same cohort every round, no amplification by sampling (``q = 1``);
  accounted as ``GaussianDpEvent`` under add-or-remove-one adjacency.

Sampling with replacement is refused. Epsilon is that of ``dp-accounting`` (the
``privacy`` extra) for ``rounds`` self-composed rounds, by RDP or, on request, PLD.
The amplification assumes the sampling seed is secret. The program keeps the number
of rounds run, not an accountant object, and recomputes epsilon from it, so a resumed
run continues the count. :class:`PrivacyBudgetStopping` stops training before the
round that would spend more than a budget.

One accounting: a differentially private learning process describes its accounting
with a :class:`PrivacyAccounting` (its ``privacy_accounting()``: the mechanism, delta,
and where its state counts the rounds run with its noise secret), and the budget stop
is built from it (``accounting.budget_stopping(epsilon)``, or the DP aggregator's
``budget_stopping``); ``train_model`` refuses a budget stop of another mechanism or
delta. Spent privacy is not program state: ``train_model`` keeps a
:class:`~programlogic.privacy_ledger.PrivacyLedger` of every DP round beside the
program state, which survives losing that state (see :mod:`programlogic.privacy_ledger`
for what it promises and what it does not).
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import math
from collections.abc import Mapping
from types import ModuleType
from typing import Any

import anyio

from managers.validation import check_choice, check_int, check_number, check_str, check_type
from programlogic._optional import require
from programlogic.stopping import StoppingPolicy, StopReason

__all__ = [
    "ACCOUNTANTS",
    "PRIVACY_BUDGET_EXHAUSTED",
    "SAMPLINGS",
    "GaussianMechanism",
    "PrivacyAccounting",
    "PrivacyBudgetStopping",
    "composed_epsilon",
]

logger = logging.getLogger(__name__)

SAMPLINGS = ("poisson", "uniform", "fixed")
"""The client samplings a DP run may use (with replacement is refused)."""

ACCOUNTANTS = ("rdp", "pld")
"""The ``dp-accounting`` accountants that compute epsilon: RDP, or PLD on request."""

PRIVACY_BUDGET_EXHAUSTED = StopReason("privacy_budget_exhausted")
"""The stop reason of :class:`PrivacyBudgetStopping`: the next round would exceed the budget."""

_ADD_OR_REMOVE_ONE = "add_or_remove_one"
_REPLACE_ONE = "replace_one"
_WITH_REPLACEMENT_REFUSED = (
    "sampling='with_replacement' is refused for DP runs: a client drawn twice in a round "
    "contributes twice, and dp-accounting's sampled-with-replacement accounting does not "
    "cover Gaussian noise; use 'poisson' (the default), 'uniform' or 'fixed'"
)


def _dp_accounting() -> ModuleType:
    """The ``dp_accounting`` package; an ImportError naming the extra when it is missing."""
    return require("dp_accounting", "dp-accounting", "programlogic.privacy", extra="privacy")


@dataclasses.dataclass(frozen=True)
class GaussianMechanism:
    """One DP round: Gaussian noise on the sum of the clipped updates of sampled clients.

    The noise's standard deviation is ``noise_multiplier x sensitivity_factor x clip``
    (the aggregator applies it); ``num_clients`` (N) is the population rounds sample
    from, ``clients_per_round`` (k) the expected (``"poisson"``) or exact
    (``"uniform"``, ``"fixed"``) clients of a round. The guarantee is central
    user-level DP under :attr:`adjacency`: ``(epsilon(rounds, delta), delta)`` after
    ``rounds`` rounds. A ``noise_multiplier`` of 0 gives no privacy (epsilon is
    infinite). ``accountant="pld"`` is refused with ``"uniform"`` sampling, which
    ``dp-accounting`` accounts only by RDP.
    """

    noise_multiplier: float
    num_clients: int
    clients_per_round: int
    sampling: str = "poisson"
    accountant: str = "rdp"

    def __post_init__(self) -> None:
        check_number("noise_multiplier", self.noise_multiplier, minimum=0, finite=True)
        check_int("num_clients", self.num_clients, minimum=1)
        check_int("clients_per_round", self.clients_per_round, minimum=1)
        if self.clients_per_round > self.num_clients:
            raise ValueError(
                f"clients_per_round must be at most num_clients={self.num_clients}, "
                f"got {self.clients_per_round!r}"
            )
        if self.sampling == "with_replacement":
            raise ValueError(f"{_WITH_REPLACEMENT_REFUSED}; got {self.sampling!r}")
        object.__setattr__(
            self, "sampling", str(check_choice("sampling", self.sampling, SAMPLINGS))
        )
        check_choice("accountant", self.accountant, ACCOUNTANTS)
        if self.accountant == "pld" and self.sampling == "uniform":
            raise ValueError(
                "accountant='pld' cannot account sampling='uniform': dp-accounting's PLD "
                "accountant has no sampling without replacement; use accountant='rdp' "
                f"or sampling='poisson', got accountant={self.accountant!r}"
            )
        object.__setattr__(self, "noise_multiplier", float(self.noise_multiplier))

    @property
    def sampling_probability(self) -> float:
        """The chance a client is in a round: ``k / N``, or 1.0 for a fixed cohort."""
        if self.sampling == "fixed":
            return 1.0
        return self.clients_per_round / self.num_clients

    @property
    def adjacency(self) -> str:
        """``"replace_one"`` for uniform sampling, else ``"add_or_remove_one"``."""
        return _REPLACE_ONE if self.sampling == "uniform" else _ADD_OR_REMOVE_ONE

    @property
    def sensitivity_factor(self) -> float:
        """What multiplies the clip in the noise's stddev: 2.0 under replace-one, else 1.0."""
        return 2.0 if self.adjacency == _REPLACE_ONE else 1.0

    def dp_event(self, rounds: int) -> Any:
        """The ``dp_accounting.DpEvent`` of ``rounds`` rounds (a ``SelfComposedDpEvent``)."""
        check_int("rounds", rounds, minimum=0)
        dp = _dp_accounting()
        gaussian = dp.GaussianDpEvent(self.noise_multiplier)
        if self.sampling == "poisson":
            round_event = dp.PoissonSampledDpEvent(self.sampling_probability, gaussian)
        elif self.sampling == "uniform":
            round_event = dp.SampledWithoutReplacementDpEvent(
                self.num_clients, self.clients_per_round, gaussian
            )
        else:
            round_event = gaussian
        return dp.SelfComposedDpEvent(round_event, rounds)

    def epsilon(self, rounds: int, delta: float) -> float:
        """Epsilon of ``rounds`` rounds at ``delta``: 0.0 for none, ``inf`` without noise.

        Blocking CPU work (milliseconds by RDP, up to a second or more by PLD): call it
        off the event loop. Results are cached per ``(mechanism, rounds, delta)``.
        """
        check_int("rounds", rounds, minimum=0)
        check_number("delta", delta, above=0, below=1)
        return _epsilon(self, rounds, float(delta))

    def describe(self) -> dict[str, Any]:
        """A JSON-able description (the fields and the adjacency), for fingerprints."""
        return {**dataclasses.asdict(self), "adjacency": self.adjacency}

    @classmethod
    def from_description(cls, description: Mapping[str, Any]) -> GaussianMechanism:
        """The mechanism that :meth:`describe` described (its ``adjacency`` is derived).

        Raises KeyError for a missing field, TypeError or ValueError for a bad one.
        """
        return cls(**{field.name: description[field.name] for field in dataclasses.fields(cls)})


@functools.lru_cache(maxsize=1024)
def _epsilon(mechanism: GaussianMechanism, rounds: int, delta: float) -> float:
    """:meth:`GaussianMechanism.epsilon`, once the arguments are checked."""
    if rounds == 0:
        return 0.0
    if mechanism.noise_multiplier == 0:
        return math.inf
    dp = _dp_accounting()
    relation = (
        dp.NeighboringRelation.REPLACE_ONE
        if mechanism.adjacency == _REPLACE_ONE
        else dp.NeighboringRelation.ADD_OR_REMOVE_ONE
    )
    if mechanism.accountant == "pld":
        accountant = dp.pld.PLDAccountant(neighboring_relation=relation)
    else:
        accountant = dp.rdp.RdpAccountant(neighboring_relation=relation)
    accountant.compose(mechanism.dp_event(rounds))
    return float(accountant.get_epsilon(delta))


def composed_epsilon(rounds: Mapping[GaussianMechanism, int], delta: float) -> float:
    """Epsilon at ``delta`` of the rounds of several mechanisms composed: ``rounds`` maps
    each mechanism to how many of its rounds ran.

    One mechanism gives :meth:`GaussianMechanism.epsilon`; several are composed in one
    ``dp-accounting`` accountant (PLD when every mechanism asks for it, else RDP). Raises
    ValueError when they differ in :attr:`~GaussianMechanism.adjacency`: add-or-remove-one
    and replace-one guarantees do not compose into one epsilon. Blocking CPU work: call
    it off the event loop. Results are cached.
    """
    check_number("delta", delta, above=0, below=1)
    counts: dict[GaussianMechanism, int] = {}
    for mechanism, count in rounds.items():
        check_type("mechanism", mechanism, GaussianMechanism)
        check_int(f"rounds of {mechanism!r}", count, minimum=0)
        if count:
            counts[mechanism] = counts.get(mechanism, 0) + count
    if not counts:
        return 0.0
    if len(counts) == 1:
        [(mechanism, count)] = counts.items()
        return _epsilon(mechanism, count, float(delta))
    adjacencies = sorted({mechanism.adjacency for mechanism in counts})
    if len(adjacencies) > 1:
        raise ValueError(
            f"rounds under {' and '.join(adjacencies)} adjacency cannot be composed into one "
            f"epsilon, got {sorted(counts.items(), key=repr)!r}"
        )
    return _composed_epsilon(tuple(sorted(counts.items(), key=repr)), float(delta))


@functools.lru_cache(maxsize=256)
def _composed_epsilon(rounds: tuple[tuple[GaussianMechanism, int], ...], delta: float) -> float:
    """:func:`composed_epsilon` of several mechanisms of one adjacency, once checked."""
    if any(mechanism.noise_multiplier == 0 for mechanism, _ in rounds):
        return math.inf
    dp = _dp_accounting()
    relation = (
        dp.NeighboringRelation.REPLACE_ONE
        if rounds[0][0].adjacency == _REPLACE_ONE
        else dp.NeighboringRelation.ADD_OR_REMOVE_ONE
    )
    if all(mechanism.accountant == "pld" for mechanism, _ in rounds):
        accountant = dp.pld.PLDAccountant(neighboring_relation=relation)
    else:
        accountant = dp.rdp.RdpAccountant(neighboring_relation=relation)
    for mechanism, count in rounds:
        accountant.compose(mechanism.dp_event(count))
    return float(accountant.get_epsilon(delta))


class PrivacyBudgetStopping(StoppingPolicy):
    """Stops training before the round that would take epsilon past ``epsilon``.

    ``before_round(r)`` answers :data:`PRIVACY_BUDGET_EXHAUSTED` when ``r`` rounds of
    ``mechanism``, composed with the rounds spent before this run
    (:attr:`spent_before`), would spend more than ``epsilon`` at ``delta``: round
    ``r - 1``, the last within the budget, is then the final model. The answer is a pure
    function of ``r`` and of what was spent before, so a resumed run stops at the same
    round. Epsilon is computed in a worker thread.

    Build it from the DP aggregator, whose mechanism and delta it must share:
    ``dp_mean(...).budget_stopping(epsilon)`` or
    ``process.privacy_accounting().budget_stopping(epsilon)``. ``train_model`` refuses,
    before round 1, a budget stop (given as ``stopping``, or inside an
    :class:`~programlogic.stopping.AnyOf`) whose mechanism or delta differs from its
    learning process's :class:`PrivacyAccounting`, or one given with a process that
    accounts no privacy; and it calls :meth:`count_spent_before` with what its privacy
    ledger (:class:`~programlogic.privacy_ledger.PrivacyLedger`) holds of earlier noise
    secrets (a run started over with ``privacy_spent_acknowledged``), so that the
    budget counts the total spent.
    """

    def __init__(self, mechanism: GaussianMechanism, *, epsilon: float, delta: float) -> None:
        check_type("mechanism", mechanism, GaussianMechanism)
        check_number("epsilon", epsilon, above=0, finite=True)
        check_number("delta", delta, above=0, below=1)
        self.mechanism = mechanism
        self.epsilon = float(epsilon)
        self.delta = float(delta)
        self.spent_before: dict[GaussianMechanism, int] = {}

    def count_spent_before(self, rounds: Mapping[GaussianMechanism, int]) -> None:
        """Count ``rounds`` (rounds run before this run, by mechanism) in every answer from
        now on, replacing what was counted before; ``{}`` counts nothing.

        ``train_model`` calls it before round 1 with the rounds its privacy ledger holds
        of noise secrets other than the run's own.
        """
        check_type("rounds", rounds, Mapping)
        counted: dict[GaussianMechanism, int] = {}
        for mechanism, count in rounds.items():
            check_type("mechanism", mechanism, GaussianMechanism)
            check_int(f"rounds of {mechanism!r}", count, minimum=0)
            if count:
                counted[mechanism] = count
        self.spent_before = counted

    def spent(self, rounds: int) -> float:
        """Epsilon at ``delta`` after ``rounds`` rounds of this run, with what was spent
        before (blocking CPU work, cached)."""
        check_int("rounds", rounds, minimum=0)
        counts = dict(self.spent_before)
        counts[self.mechanism] = counts.get(self.mechanism, 0) + rounds
        return composed_epsilon(counts, self.delta)

    async def before_round(self, round_num: int) -> StopReason | None:
        check_int("round_num", round_num, minimum=0)
        spent = await anyio.to_thread.run_sync(self.spent, round_num)
        if spent <= self.epsilon:
            return None
        logger.info(
            "privacy budget: round %d would spend epsilon %.6g > %.6g (delta %.3g); stopping",
            round_num,
            spent,
            self.epsilon,
            self.delta,
        )
        return PRIVACY_BUDGET_EXHAUSTED

    def rounds_within_budget(self) -> int:
        """The most rounds of this run whose epsilon, with what was spent before, is
        within the budget (blocking, a search over rounds)."""
        if not self._within(0):
            return 0
        within, beyond = 0, 1
        while self._within(beyond):
            within, beyond = beyond, beyond * 2
        while beyond - within > 1:
            middle = (within + beyond) // 2
            if self._within(middle):
                within = middle
            else:
                beyond = middle
        return within

    def _within(self, rounds: int) -> bool:
        return self.spent(rounds) <= self.epsilon


@dataclasses.dataclass(frozen=True)
class PrivacyAccounting:
    """How a differentially private learning process accounts its rounds: the seam
    ``train_model`` reads.

    A learning process is differentially private for ``train_model`` when it has a
    plain (sync) method ``privacy_accounting()`` that returns one of these (``None``
    for a process that adds no noise). The built-in processes return their model
    aggregator's (:meth:`programlogic.learning.DPMean.privacy_accounting`, nested
    with :meth:`within`). It says:

    - ``mechanism`` and ``delta``: what each round adds (the noise, the sampling) and the
      delta epsilon is reported at;
    - ``state_path``: the keys leading, in the train state, to the state of the
      aggregator that adds the noise. That state holds ``"secret"``, the noise secret
      (an integer array drawn when a run starts, never released: the ledger keeps
      only its :func:`~programlogic.privacy_ledger.secret_fingerprint`), and
      ``"rounds"``, the rounds run with it: one a ``train_model`` round, restored with
      the state, so a replayed round is counted once;
    - ``metrics_path``: the keys leading, in a round's metrics, to the dict in which
      the process releases ``epsilon`` (``privacy/epsilon``).

    ``train_model`` then keeps the run's privacy ledger
    (:class:`~programlogic.privacy_ledger.PrivacyLedger`), cross-checks it with the
    checkpoint it resumes from, and sets ``epsilon`` under ``metrics_path`` of each
    round to the one accounting's figure: the state's rounds of ``mechanism``
    composed with the rounds the ledger holds of earlier noise secrets (there are
    some only when a run was started over with ``privacy_spent_acknowledged``);
    without them it is ``mechanism.epsilon(rounds, delta)``, what the aggregator
    released. The budget stop is built here too: :meth:`budget_stopping`.
    """

    mechanism: GaussianMechanism
    delta: float
    state_path: tuple[str, ...] = ()
    metrics_path: tuple[str, ...] = ("privacy",)

    def __post_init__(self) -> None:
        check_type("mechanism", self.mechanism, GaussianMechanism)
        check_number("delta", self.delta, above=0, below=1)
        for name in ("state_path", "metrics_path"):
            keys = check_type(name, getattr(self, name), tuple)
            for key in keys:
                check_str(f"{name} key", key)
        object.__setattr__(self, "delta", float(self.delta))

    def within(self, *keys: str) -> PrivacyAccounting:
        """This accounting for a state nested under ``keys`` (a process holding the
        aggregator's state under ``"aggregator"`` returns ``within("aggregator")``)."""
        return dataclasses.replace(self, state_path=(*keys, *self.state_path))

    def budget_stopping(self, epsilon: float) -> PrivacyBudgetStopping:
        """A :class:`PrivacyBudgetStopping` of this mechanism and delta, at ``epsilon``."""
        return PrivacyBudgetStopping(self.mechanism, epsilon=epsilon, delta=self.delta)
