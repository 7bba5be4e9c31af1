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
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import math
from types import ModuleType
from typing import Any

import anyio

from managers.validation import check_choice, check_int, check_number, check_type
from programlogic._optional import require
from programlogic.stopping import StoppingPolicy, StopReason

__all__ = [
    "ACCOUNTANTS",
    "PRIVACY_BUDGET_EXHAUSTED",
    "SAMPLINGS",
    "GaussianMechanism",
    "PrivacyBudgetStopping",
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


class PrivacyBudgetStopping(StoppingPolicy):
    """Stops training before the round that would take epsilon past ``epsilon``.

    ``before_round(r)`` answers :data:`PRIVACY_BUDGET_EXHAUSTED` when
    ``mechanism.epsilon(r, delta) > epsilon``: round ``r - 1``, the last within the
    budget, is then the final model. The answer is a pure function of ``r``, so a
    resumed run stops at the same round. Epsilon is computed in a worker thread.
    """

    def __init__(self, mechanism: GaussianMechanism, *, epsilon: float, delta: float) -> None:
        check_type("mechanism", mechanism, GaussianMechanism)
        check_number("epsilon", epsilon, above=0, finite=True)
        check_number("delta", delta, above=0, below=1)
        self.mechanism = mechanism
        self.epsilon = float(epsilon)
        self.delta = float(delta)

    async def before_round(self, round_num: int) -> StopReason | None:
        check_int("round_num", round_num, minimum=0)
        spent = await anyio.to_thread.run_sync(self.mechanism.epsilon, round_num, self.delta)
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
        """The most rounds whose epsilon is within the budget (blocking, a search over rounds)."""
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
        return self.mechanism.epsilon(rounds, self.delta) <= self.epsilon
