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
:class:`PrivacyLedger` of every DP round beside the program state, which survives
losing that state (see the class for what it promises and what it does not).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import hashlib
import logging
import math
import os
from collections.abc import Mapping
from pathlib import Path
from types import ModuleType
from typing import Any

import anyio
import numpy as np
import orjson

from managers._files import fsync_directory
from managers.validation import (
    check_choice,
    check_int,
    check_number,
    check_path,
    check_str,
    check_type,
)
from programlogic._optional import require
from programlogic.exceptions import PrivacyLedgerError
from programlogic.stopping import StoppingPolicy, StopReason

__all__ = [
    "ACCOUNTANTS",
    "LEDGER_SUFFIX",
    "PRIVACY_BUDGET_EXHAUSTED",
    "SAMPLINGS",
    "GaussianMechanism",
    "LedgerEntry",
    "PrivacyAccounting",
    "PrivacyBudgetStopping",
    "PrivacyLedger",
    "composed_epsilon",
    "ledger_path_beside",
    "secret_fingerprint",
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
    accounts no privacy; and it calls :meth:`count_spent_before` with what its
    :class:`PrivacyLedger` holds of earlier noise secrets (a run started over with
    ``privacy_spent_acknowledged``), so that the budget counts the total spent.
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
      only :func:`secret_fingerprint`), and ``"rounds"``, the rounds run with it: one
      a ``train_model`` round, restored with the state, so a replayed round is
      counted once;
    - ``metrics_path``: the keys leading, in a round's metrics, to the dict in which
      the process releases ``epsilon`` (``privacy/epsilon``).

    ``train_model`` then keeps the run's :class:`PrivacyLedger`, cross-checks it with
    the checkpoint it resumes from, and sets ``epsilon`` under ``metrics_path`` of each
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

    def aggregator_state(self, train_state: Any) -> Any:
        """The state at ``state_path`` in ``train_state`` (KeyError naming the path)."""
        state = train_state
        for depth, key in enumerate(self.state_path):
            try:
                state = state[key]
            except (KeyError, TypeError, IndexError):
                path = "/".join(self.state_path[: depth + 1])
                raise KeyError(
                    f"the train state has no {path!r}, where the privacy accounting "
                    "expects the DP aggregator's state"
                ) from None
        return state

    def rounds(self, train_state: Any) -> int:
        """The rounds run with the state's noise secret, as the aggregator counted them."""
        return int(self.aggregator_state(train_state)["rounds"])

    def secret_fingerprint(self, train_state: Any) -> str:
        """:func:`secret_fingerprint` of the state's noise secret."""
        return secret_fingerprint(self.aggregator_state(train_state)["secret"])

    def budget_stopping(self, epsilon: float) -> PrivacyBudgetStopping:
        """A :class:`PrivacyBudgetStopping` of this mechanism and delta, at ``epsilon``."""
        return PrivacyBudgetStopping(self.mechanism, epsilon=epsilon, delta=self.delta)


def secret_fingerprint(secret: Any) -> str:
    """A fingerprint of a noise secret (an array of integers): 32 hex digits of SHA-256.

    It names the secret in the ledger without revealing it: finding a 128-bit secret
    from it is a preimage search. Equal values give equal fingerprints whatever the
    integer dtype. Raises TypeError for an array that is not of integers, ValueError
    for an empty one.
    """
    array = np.asarray(secret)
    if array.dtype.kind not in "iu":
        raise TypeError(f"a noise secret must be an array of integers, got dtype {array.dtype}")
    if array.size == 0:
        raise ValueError("a noise secret must hold at least one integer, got an empty array")
    text = f"{list(array.shape)}:" + ",".join(str(int(word)) for word in array.ravel())
    digest = hashlib.sha256(b"programlogic.privacy secret\0" + text.encode())
    return digest.hexdigest()[:32]


LEDGER_SUFFIX = ".privacy_ledger.jsonl"
"""What :func:`ledger_path_beside` appends to the state directory's name."""

_LEDGER_FORMAT = 1
_HEADER_KEY = "programlogic_privacy_ledger"


def ledger_path_beside(state_dir: str | os.PathLike[str]) -> Path:
    """Where ``train_model`` keeps the privacy ledger of a run whose program state is in
    ``state_dir`` (a file state manager's ``root_dir``) when it is given no path: the
    file ``{state_dir name}.privacy_ledger.jsonl`` beside that directory, in its parent
    (``runs/dp/state`` -> ``runs/dp/state.privacy_ledger.jsonl``). Outside the state
    directory, so deleting that directory does not delete it."""
    directory = check_path("state_dir", state_dir)
    return directory.parent / f"{directory.name}{LEDGER_SUFFIX}"


@dataclasses.dataclass(frozen=True)
class LedgerEntry:
    """One differentially private round in a :class:`PrivacyLedger`: one JSON line.

    ``secret``: the :func:`secret_fingerprint` of the run's noise secret; ``round_num``:
    the ``train_model`` round (``"round"`` in the file); ``rounds``: the rounds the
    aggregator had counted with that secret after it; ``mechanism`` and ``delta``: the
    round's; ``epsilon``: the privacy spent in all after it at ``delta`` as
    ``train_model`` accounted it (the ledger's earlier secrets included; ``inf``
    without noise; ``None`` for rounds recorded from a checkpoint, whose figure was not
    computed); ``time``: when it was recorded (Unix seconds on the run's clock), or
    ``None``. Rounds are keyed by :attr:`key`, ``(secret, round_num)``: a round replayed
    after a crash (the same secret and round: the same noise) is counted once.
    """

    secret: str
    round_num: int
    rounds: int
    mechanism: GaussianMechanism
    delta: float
    epsilon: float | None
    time: int | None = None

    @property
    def key(self) -> tuple[str, int]:
        """``(secret, round_num)``: what makes a round count once."""
        return self.secret, self.round_num

    def to_record(self) -> dict[str, Any]:
        """The entry as the JSON object of its line."""
        epsilon = self.epsilon
        return {
            "secret": self.secret,
            "round": self.round_num,
            "rounds": self.rounds,
            "mechanism": {
                key: value for key, value in self.mechanism.describe().items() if key != "adjacency"
            },
            "delta": self.delta,
            "epsilon": "inf" if epsilon is not None and math.isinf(epsilon) else epsilon,
            "time": self.time,
        }

    @classmethod
    def from_record(cls, record: Any) -> LedgerEntry:
        """The entry a line's JSON object holds; ValueError saying what is wrong with it."""
        if not isinstance(record, dict):
            raise ValueError(f"an entry must be a JSON object, got {record!r}")
        try:
            secret = check_str("secret", record["secret"], allow_empty=False)
            round_num = check_int("round", record["round"], minimum=1)
            rounds = check_int("rounds", record["rounds"], minimum=0)
            mechanism = GaussianMechanism.from_description(record["mechanism"])
            delta = check_number("delta", record["delta"], above=0, below=1)
            epsilon = record.get("epsilon")
            if epsilon == "inf":
                epsilon = math.inf
            check_number("epsilon", epsilon, minimum=0, allow_none=True)
            time = check_int("time", record.get("time"), allow_none=True)
        except KeyError as missing:
            raise ValueError(f"an entry lacks {missing}") from None
        except TypeError as error:
            raise ValueError(str(error)) from None
        return cls(
            secret,
            round_num,
            rounds,
            mechanism,
            float(delta),
            None if epsilon is None else float(epsilon),
            time,
        )


class PrivacyLedger:
    """The privacy a run has spent, kept apart from its program state: an append-only,
    fsynced file of JSON lines, one :class:`LedgerEntry` a differentially private round.

    ``train_model`` keeps one for every DP run (its ``privacy_ledger`` argument, or by
    default :func:`ledger_path_beside` a file state manager's directory) and records
    each round in it before that round's checkpoint is saved, so no checkpoint, release
    or evaluation of a round exists that the ledger does not hold. On every start it
    reads the ledger and refuses (:class:`~programlogic.exceptions.PrivacySpentError`,
    naming the epsilon spent at delta and the rounds) to start over while the ledger
    holds rounds, unless told ``privacy_spent_acknowledged=<that epsilon>``, and to
    resume a checkpoint whose aggregator counts other rounds than it trained.

    What it promises: spent privacy survives losing the program state (a deleted state
    directory, every version damaged and set aside with ``on_all_damaged="start_fresh"``,
    an edited checkpoint), and the budget stop and the released epsilon count every
    round it holds, those of earlier noise secrets too. What it does not cover: deleting
    or editing the ledger itself (deleting the run's root directory deletes both), a new
    run with another ledger (another root) trained on the same data, and a ledger shared
    by runs that are not meant to share a budget. A DP run whose program state has no
    directory (a memory state manager) needs a path: without one ``train_model`` refuses
    to start.

    On disk: a first line ``{"programlogic_privacy_ledger": 1}``, then one entry a line,
    each written with one ``write`` and fsynced before :meth:`append` returns (the file
    and its directory are fsynced when created). Only rounds are appended; nothing is
    ever rewritten, except a torn last line, the trace of a crash in the middle of an
    append (a line without its newline): it is ignored when read, and cut off when
    the ledger is opened, with a warning. Any other damage (a line that is not an
    entry, a first line that is not the header) raises
    :class:`~programlogic.exceptions.PrivacyLedgerError` naming the file and the line:
    restore the file, since setting it aside forgets the privacy it records.

    Opening takes an exclusive lock (``flock``) on the file until :meth:`close`: one run
    at a time writes a ledger; another raises ``PrivacyLedgerError``. Blocking file
    work: ``async with ledger:`` opens it and :meth:`record` appends in a worker
    thread. :meth:`read` reads one without locking or repairing it.
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = check_path("path", path)
        self._entries: dict[tuple[str, int], LedgerEntry] = {}
        self._descriptor: int | None = None
        self._size = 0

    def __repr__(self) -> str:
        return f"PrivacyLedger({str(self.path)!r})"

    @property
    def entries(self) -> tuple[LedgerEntry, ...]:
        """The rounds held, in the order they were recorded (each key once)."""
        return tuple(self._entries.values())

    def __contains__(self, key: object) -> bool:
        return key in self._entries

    @classmethod
    def read(cls, path: str | os.PathLike[str]) -> tuple[LedgerEntry, ...]:
        """The entries of the ledger at ``path`` (none when there is no file), a torn last
        line ignored; read without a lock, nothing written. Blocking."""
        ledger = cls(path)
        try:
            data = ledger.path.read_bytes()
        except FileNotFoundError:
            return ()
        ledger._parse(data)
        return ledger.entries

    def open(self) -> None:
        """Create or open the file, lock it, read it and cut off a torn last line
        (blocking). Raises PrivacyLedgerError when it is damaged or locked."""
        if self._descriptor is not None:
            raise RuntimeError(f"{self!r} is already open")
        directory = self.path.parent
        if not directory.is_dir():
            directory.mkdir(parents=True, exist_ok=True)
            fsync_directory(directory.parent)
        flags = os.O_RDWR | os.O_CREAT | os.O_APPEND | getattr(os, "O_CLOEXEC", 0)
        descriptor = os.open(self.path, flags, 0o644)
        try:
            _lock(descriptor, self.path)
            with os.fdopen(os.dup(descriptor), "rb") as file:
                data = file.read()
            torn = self._parse(data)
            size = len(data) - len(torn)
            if torn:
                logger.warning(
                    "the privacy ledger %s ends with a torn line (%d bytes, a crash in the "
                    "middle of an append): ignored and cut off",
                    self.path,
                    len(torn),
                )
                os.ftruncate(descriptor, size)
                os.fsync(descriptor)
            if size == 0:
                header = orjson.dumps({_HEADER_KEY: _LEDGER_FORMAT}) + b"\n"
                _write_all(descriptor, header)
                os.fsync(descriptor)
                fsync_directory(directory)
                size = len(header)
        except BaseException:
            os.close(descriptor)
            raise
        self._descriptor, self._size = descriptor, size

    def close(self) -> None:
        """Close the file and release its lock; a no-op when it is not open."""
        descriptor, self._descriptor = self._descriptor, None
        if descriptor is not None:
            os.close(descriptor)

    async def __aenter__(self) -> PrivacyLedger:
        await anyio.to_thread.run_sync(self.open)
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        self.close()  # closing a descriptor does not block, and must happen when cancelled

    def append(self, entry: LedgerEntry) -> bool:
        """Append ``entry`` and fsync, unless its key is held (then False: counted once).

        Blocking. A failed write (a full disk) cuts the file back to where it was and
        raises. Raises RuntimeError when the ledger is not open.
        """
        check_type("entry", entry, LedgerEntry)
        if self._descriptor is None:
            raise RuntimeError(f"{self!r} is not open: open it (async with) before appending")
        if entry.key in self._entries:
            return False
        line = orjson.dumps(entry.to_record()) + b"\n"
        try:
            _write_all(self._descriptor, line)
            os.fsync(self._descriptor)
        except BaseException:
            with contextlib.suppress(OSError):
                os.ftruncate(self._descriptor, self._size)
            raise
        self._size += len(line)
        self._entries[entry.key] = entry
        return True

    async def record(self, entry: LedgerEntry) -> bool:
        """:meth:`append` in a worker thread."""
        return await anyio.to_thread.run_sync(self.append, entry)

    def rounds_by_mechanism(
        self, *, excluding_secret: str | None = None
    ) -> dict[GaussianMechanism, int]:
        """How many rounds of each mechanism the ledger holds, leaving out those of the
        noise secret whose fingerprint is ``excluding_secret``."""
        counts: dict[GaussianMechanism, int] = {}
        for entry in self._entries.values():
            if entry.secret != excluding_secret:
                counts[entry.mechanism] = counts.get(entry.mechanism, 0) + 1
        return counts

    def rounds_of(self, secret: str) -> dict[int, LedgerEntry]:
        """The rounds held of the noise secret whose fingerprint is ``secret``, by round."""
        return {
            entry.round_num: entry for entry in self._entries.values() if entry.secret == secret
        }

    def spent(self, delta: float) -> float:
        """Epsilon at ``delta`` of every round held, composed (blocking CPU work)."""
        return composed_epsilon(self.rounds_by_mechanism(), delta)

    def _parse(self, data: bytes) -> bytes:
        """Read ``data`` into the entries; returns its torn last line (``b""`` for none)."""
        end = data.rfind(b"\n") + 1
        complete, torn = data[:end], data[end:]
        lines = complete.split(b"\n")[:-1]
        self._entries = {}
        for number, line in enumerate(lines, start=1):
            try:
                record = orjson.loads(line)
            except orjson.JSONDecodeError as error:
                raise self._damaged(number, f"not JSON ({error})") from None
            if number == 1:
                self._check_header(record)
                continue
            try:
                entry = LedgerEntry.from_record(record)
            except ValueError as error:
                raise self._damaged(number, str(error)) from None
            self._entries.setdefault(entry.key, entry)
        return torn

    def _check_header(self, record: Any) -> None:
        version = record.get(_HEADER_KEY) if isinstance(record, dict) else None
        if version == _LEDGER_FORMAT:
            return
        if isinstance(version, int) and not isinstance(version, bool):
            raise PrivacyLedgerError(
                f"the privacy ledger {self.path} is in format {version}; this code reads "
                f"format {_LEDGER_FORMAT}: use a newer programlogic"
            )
        raise self._damaged(1, f"not a privacy ledger's first line ({record!r})")

    def _damaged(self, line: int, what: str) -> PrivacyLedgerError:
        return PrivacyLedgerError(
            f"the privacy ledger {self.path} is damaged at line {line}: {what}; only a torn "
            "last line (a crash in the middle of an append) is repaired: restore the file "
            "from a copy, since setting it aside forgets the privacy it records"
        )


def _lock(descriptor: int, path: Path) -> None:
    """Lock the ledger's file for this process, or raise PrivacyLedgerError."""
    import fcntl

    try:
        fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        raise PrivacyLedgerError(
            f"the privacy ledger {path} is in use by another run: one run at a time writes a ledger"
        ) from None


def _write_all(descriptor: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(descriptor, view) :]
