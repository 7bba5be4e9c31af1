"""Differentially private aggregation: clipped client updates, Gaussian noise on the server.

:func:`dp_mean` is central, user-level differential privacy (McMahan et al., "Learning
Differentially Private Recurrent Language Models", 2018): each client's update is
clipped to an L2 norm, the clipped updates are summed, Gaussian noise is added to the
sum once a round on the server, and the sum is divided by the expected number of
clients a round. The clip is fixed or adapts to a quantile of the update norms
(Andrew et al., "Differentially Private Learning with Adaptive Clipping", 2021), as
TensorFlow Federated's ``DifferentiallyPrivateFactory.gaussian_fixed`` and
``gaussian_adaptive`` do. The privacy of the rounds is accounted by the
:class:`~programlogic.privacy.GaussianMechanism` the aggregator is given.
"""

from __future__ import annotations

import collections
import dataclasses
import math
import secrets
from collections.abc import Sequence
from typing import Any

import numpy as np

from managers.validation import check_number, check_type
from programlogic.learning._tensorflow import tf
from programlogic.learning.aggregators import (
    Aggregate,
    ModelAggregator,
    Partial,
    add_partials,
    by_client,
    client_norms,
)
from programlogic.privacy import GaussianMechanism, PrivacyAccounting, PrivacyBudgetStopping

__all__ = ["AdaptiveClipping", "DPMean", "adaptive_clipping", "dp_mean"]

SECRET_WORDS = 4
"""The noise secret's size in 32-bit words (128 bits)."""

SAMPLING_CODES = {"poisson": 0, "uniform": 1, "fixed": 2}
_MECHANISM_FIELDS = "[noise_multiplier, num_clients, clients_per_round, sampling, sensitivity]"


@dataclasses.dataclass(frozen=True)
class AdaptiveClipping:
    """A clip that tracks the ``target_quantile`` of the client update norms.

    Each round the clients whose update norm is at most the clip are counted (with
    Gaussian noise of ``count_stddev``, by default ``0.05`` times the expected clients
    a round, 0 without noise) and the clip moves geometrically:
    ``clip * exp(-learning_rate * (fraction_unclipped - target_quantile))``. The count's
    noise takes a share of the privacy: the updates get the noise multiplier ``(z**-2 -
    (2 * count_stddev)**-2) ** -0.5`` for the mechanism's ``z``, as in TFF.
    """

    initial_clip: float = 0.1
    target_quantile: float = 0.5
    learning_rate: float = 0.2
    count_stddev: float | None = None

    def describe(self) -> dict[str, Any]:
        """The settings, as a JSON-able dict."""
        return dataclasses.asdict(self)


def adaptive_clipping(
    initial_clip: float = 0.1,
    target_quantile: float = 0.5,
    learning_rate: float = 0.2,
    count_stddev: float | None = None,
) -> AdaptiveClipping:
    """An :class:`AdaptiveClipping` with TFF's ``gaussian_adaptive`` defaults, checked."""
    check_number("initial_clip", initial_clip, above=0, finite=True)
    check_number("target_quantile", target_quantile, minimum=0, maximum=1)
    check_number("learning_rate", learning_rate, minimum=0, finite=True)
    check_number("count_stddev", count_stddev, minimum=0, finite=True, allow_none=True)
    return AdaptiveClipping(
        float(initial_clip),
        float(target_quantile),
        float(learning_rate),
        None if count_stddev is None else float(count_stddev),
    )


@dataclasses.dataclass(frozen=True)
class DPMean(ModelAggregator):
    """The differentially private mean of the clients' updates (see the module).

    A round: each counted client's update is scaled to a global L2 norm of at most the
    clip; the scaled updates are summed (float64) in the client groups and merged; on
    the server, Gaussian noise of standard deviation ``noise_multiplier * clip *
    sensitivity_factor`` is added to each coordinate of the sum, which is divided by the
    mechanism's ``clients_per_round`` (the expected number, not the number that came,
    which would leak it). Client weights are ignored, as in TFF's DP aggregators.

    The noise comes from a generator keyed by a 128-bit secret and the round number.
    The secret is drawn from the operating system's randomness by :meth:`initialize`
    (when a run starts) and kept in the aggregator's state, so that a resumed run adds
    the same noise as the uninterrupted one; it is never released, logged or described
    (``secret=`` injects one, for tests). The state also counts the rounds run (the
    accounting: a replayed round starts from the saved count) and holds an adaptive
    clip.

    Released each round: ``privacy/{epsilon, delta, noise_multiplier, clip, rounds}``,
    epsilon for ``delta`` after the rounds run so far, computed by the mechanism
    (``train_model`` adds the rounds its privacy ledger holds of earlier noise secrets,
    when there are some: see :meth:`privacy_accounting`). Its budget stop is
    :meth:`budget_stopping`.
    """

    mechanism: GaussianMechanism
    clip: float | AdaptiveClipping
    delta: float
    secret: int | None = dataclasses.field(default=None, compare=False, repr=False)

    def initialize(self) -> dict[str, Any]:
        """A fresh secret, no rounds run and, when adaptive, the initial clip."""
        secret = secrets.randbits(32 * SECRET_WORDS) if self.secret is None else self.secret
        words = [(secret >> (32 * index)) & 0xFFFFFFFF for index in range(SECRET_WORDS)]
        state: dict[str, Any] = {
            "secret": np.array(words, dtype=np.uint32),
            "rounds": np.int64(0),
            "mechanism": self._mechanism_record(),
        }
        if isinstance(self.clip, AdaptiveClipping):
            state["clip"] = np.float64(self.clip.initial_clip)
        return state

    def check_round(self, client_ids: Sequence[str]) -> None:
        """Refuse a round that does not sample as the mechanism accounts for: a client
        twice (sampling with replacement), or, for uniform and fixed sampling, another
        number of clients than ``clients_per_round`` (ValueError)."""
        counts = collections.Counter(client_ids)
        repeated = [client for client, count in counts.items() if count > 1]
        if repeated:
            raise ValueError(
                f"a differentially private round holds client {repeated[0]!r} "
                f"{counts[repeated[0]]} times: sampling with replacement is not accounted, "
                "sample with Sampling.POISSON (or uniform, or a fixed cohort)"
            )
        expected = self.mechanism.clients_per_round
        if self.mechanism.sampling != "poisson" and len(client_ids) != expected:
            raise ValueError(
                f"a differentially private round holds {len(client_ids)} clients, but the "
                f"mechanism accounts for {self.mechanism.sampling} sampling of {expected}"
            )

    def params(self, state: dict[str, Any]) -> dict[str, Any]:
        """The round's clip, float32, for the compiled group call.

        Raises ValueError when the state's rounds ran under another mechanism: the
        accounting counts rounds of one mechanism (a run resumed with
        ``resume_with_changed_configuration=True`` and another noise or sampling would
        otherwise be accounted as if every round had had the new one).
        """
        recorded = np.asarray(state["mechanism"], dtype=np.float64)
        if int(state["rounds"]) and not np.array_equal(recorded, self._mechanism_record()):
            raise ValueError(
                f"the {int(state['rounds'])} rounds of this state ran under another privacy "
                f"mechanism ({_MECHANISM_FIELDS} = {recorded.tolist()}, now "
                f"{self._mechanism_record().tolist()}): their privacy cost is not accounted "
                "under this one; start a new run to change the mechanism"
            )
        return {"clip": np.float32(self._clip(state))}

    def _mechanism_record(self) -> np.ndarray:
        """The mechanism's accounted values, as kept in the state."""
        mechanism = self.mechanism
        return np.array(
            [
                mechanism.noise_multiplier,
                mechanism.num_clients,
                mechanism.clients_per_round,
                SAMPLING_CODES[mechanism.sampling],
                mechanism.sensitivity_factor,
            ],
            dtype=np.float64,
        )

    def fold_group(self, params: dict[str, Any], deltas: list[Any], weights: Any) -> Partial:
        """The group's clipped updates summed (float64), how many counted, and how many of
        those were within the clip, less one half each (TFF's centred count)."""
        clip = params["clip"]
        norms = client_norms(deltas)
        counted = tf.cast(weights > 0, tf.float64)
        scales = tf.cast(clip / tf.maximum(norms, clip), tf.float64) * counted
        sums = [
            tf.reduce_sum(tf.cast(delta, tf.float64) * by_client(scales, delta), axis=0)
            for delta in deltas
        ]
        within = tf.cast(norms <= clip, tf.float64) - 0.5
        return {
            "sum": sums,
            "count": tf.reduce_sum(counted),
            "below": tf.reduce_sum(within * counted),
        }

    def empty_round(self, trainable: list[np.ndarray]) -> Partial:
        """Zero sums: a round that sampled no client still adds noise and counts."""
        return {
            "sum": [np.zeros(np.shape(weight), np.float64) for weight in trainable],
            "count": 0.0,
            "below": 0.0,
        }

    def merge(self, total: Partial | None, partial: Partial) -> Partial:
        """The sums and counts added."""
        return add_partials(total, partial)

    def finalize(self, state: dict[str, Any], total: Partial | None, round_num: int) -> Aggregate:
        """The noised mean, the next state (rounds, clip) and the privacy metrics."""
        clip = self._clip(state)
        value_multiplier, count_stddev = self._noise_multipliers()
        generator = np.random.default_rng(
            np.random.SeedSequence([*(int(word) for word in state["secret"]), round_num])
        )
        expected = float(self.mechanism.clients_per_round)
        update = None
        if total is not None:
            stddev = value_multiplier * clip * self.mechanism.sensitivity_factor
            noisy = [
                each + generator.normal(0.0, stddev, each.shape) if stddev > 0 else each
                for each in total["sum"]
            ]
            update = [each / expected for each in noisy]
        rounds = int(state["rounds"]) + 1
        new_state = {**state, "rounds": np.int64(rounds)}
        if isinstance(self.clip, AdaptiveClipping) and total is not None:
            below = total["below"]
            if count_stddev > 0:
                below += generator.normal(0.0, count_stddev)
            unclipped = min(1.0, max(0.0, below / expected + 0.5))
            step = self.clip.learning_rate * (unclipped - self.clip.target_quantile)
            new_state["clip"] = np.float64(np.float32(clip * math.exp(-step)))
        privacy = {
            "epsilon": float(self.mechanism.epsilon(rounds, self.delta)),
            "delta": self.delta,
            "noise_multiplier": float(self.mechanism.noise_multiplier),
            "clip": clip,
            "rounds": rounds,
        }
        return Aggregate(update, new_state, metrics={"privacy": privacy})

    def privacy_accounting(self) -> PrivacyAccounting:
        """The accounting ``train_model`` reads: this mechanism and delta; the secret and
        the rounds run are this aggregator's state's ``"secret"`` and ``"rounds"``, and
        epsilon is released under the round's ``privacy`` metrics."""
        return PrivacyAccounting(self.mechanism, self.delta)

    def budget_stopping(self, epsilon: float) -> PrivacyBudgetStopping:
        """The budget stop of this aggregator's rounds: a
        :class:`~programlogic.privacy.PrivacyBudgetStopping` of its mechanism and delta
        that stops before the round that would spend more than ``epsilon``."""
        return self.privacy_accounting().budget_stopping(epsilon)

    def describe(self) -> dict[str, Any]:
        """The mechanism, the clip and delta (never the secret), as a JSON-able dict."""
        clip = self.clip.describe() if isinstance(self.clip, AdaptiveClipping) else self.clip
        return {
            "aggregator": "dp_mean",
            "mechanism": self.mechanism.describe(),
            "clip": clip,
            "delta": self.delta,
        }

    def _clip(self, state: dict[str, Any]) -> float:
        if isinstance(self.clip, AdaptiveClipping):
            return float(state["clip"])
        return self.clip

    def _count_stddev(self) -> float:
        """The stddev of the noise on an adaptive clip's count (0 for none)."""
        if not isinstance(self.clip, AdaptiveClipping) or self.mechanism.noise_multiplier == 0:
            return 0.0
        if self.clip.count_stddev is None:
            return 0.05 * self.mechanism.clients_per_round
        return self.clip.count_stddev

    def _noise_multipliers(self) -> tuple[float, float]:
        """The noise multiplier of the updates and the stddev of the adaptive count."""
        total = float(self.mechanism.noise_multiplier)
        count_stddev = self._count_stddev()
        if count_stddev == 0:
            return total, 0.0
        return (total**-2 - (2 * count_stddev) ** -2) ** -0.5, count_stddev


def dp_mean(
    mechanism: GaussianMechanism,
    clip: float | AdaptiveClipping,
    *,
    delta: float,
    secret: int | None = None,
) -> DPMean:
    """A :class:`DPMean` for ``mechanism`` (a
    :class:`~programlogic.privacy.GaussianMechanism`: the noise multiplier, the expected
    clients a round and how they are sampled), with a fixed ``clip`` (a positive
    number) or :func:`adaptive_clipping`, reporting epsilon for ``delta`` (in (0, 1)).

    Raises ValueError when an adaptive clip's count noise is too small for the
    mechanism's noise multiplier (``noise_multiplier >= 2 * count_stddev``).
    """
    check_type("mechanism", mechanism, GaussianMechanism)
    if not isinstance(clip, AdaptiveClipping):
        clip = float(check_number("clip", clip, above=0, finite=True))
    check_number("delta", delta, above=0, below=1)
    check_type("secret", secret, int, allow_none=True)
    aggregator = DPMean(mechanism, clip, float(delta), secret)
    count_stddev = aggregator._count_stddev()
    if count_stddev and mechanism.noise_multiplier >= 2 * count_stddev:
        raise ValueError(
            f"adaptive clipping's count_stddev {count_stddev} is too small for the noise "
            f"multiplier {mechanism.noise_multiplier}: it must be above half of it (pass "
            f"adaptive_clipping(count_stddev=...) above {mechanism.noise_multiplier / 2:g}; "
            "by default it is 0.05 x clients_per_round)"
        )
    return aggregator
