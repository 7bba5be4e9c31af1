"""The algorithms ``algorithms_vs_tff.py`` compares, described once for both sides.

Plain Python (no TensorFlow, no programlogic), so that ``_tff_algorithms.py`` imports it
in the TFF venv and ``algorithms_vs_tff.py`` in ours: both build their process from the
same :class:`Algorithm`, with the same learning rates, epochs and batch size.

Optimizers are ``(rule, learning_rate, keyword arguments)``: the rules ``sgd``, ``adam``,
``adagrad`` and ``yogi`` are ``programlogic.learning``'s functions of those names and
``tff.learning.optimizers.build_sgdm / build_adam / build_adagrad / build_yogi``, whose
keyword arguments have the same names and defaults.
"""

from __future__ import annotations

import dataclasses
from typing import Any

EPOCHS = 5
BATCH_SIZE = 5
CLIENT_RATE = 0.02
"""The TFF tutorial's configuration, as in ``fedavg_vs_tff.py``: client SGD 0.02."""

Optimizer = tuple[str, float, dict[str, Any]]


@dataclasses.dataclass(frozen=True)
class Algorithm:
    """One process to build on both sides.

    - ``builder``: ``weighted_fed_avg``, ``unweighted_fed_avg``, ``weighted_fed_prox``
      or ``fed_sgd``, TFF's ``tff.learning.algorithms.build_<builder>`` and ours;
    - ``server``: the server optimizer; ``client``: the client one (unused by FedSGD);
    - ``proximal_strength``: TFF's argument (its sign: ours takes it negated);
    - ``clip_norm``: clip each client's model delta to this L2 global norm before the
      mean (TFF's ``clipping_factory``, our ``clipping``);
    - ``private``: with ``clip_norm``, the differentially private mean without noise
      instead (TFF's ``DifferentiallyPrivateFactory.gaussian_fixed(0, clients, clip)``,
      our ``dp_mean`` of a ``GaussianMechanism(0, ...)`` of the fixed cohort), which
      averages the clipped deltas with equal weights.
    """

    name: str
    label: str
    builder: str
    server: Optimizer
    client: Optimizer = ("sgd", CLIENT_RATE, {})
    proximal_strength: float | None = None
    clip_norm: float | None = None
    private: bool = False

    @property
    def counts_clipped(self) -> bool:
        """Whether both sides report how many clients were clipped each round."""
        return self.clip_norm is not None and not self.private


ALGORITHMS: dict[str, Algorithm] = {
    algorithm.name: algorithm
    for algorithm in [
        Algorithm(
            "fedavg_sgdm",
            "FedAvg, server SGD momentum 0.9 (FedAvgM)",
            "weighted_fed_avg",
            ("sgd", 1.0, {"momentum": 0.9}),
        ),
        Algorithm(
            "fedavg_adam", "FedAvg, server Adam (FedAdam)", "weighted_fed_avg", ("adam", 0.01, {})
        ),
        Algorithm(
            "fedavg_adagrad",
            "FedAvg, server Adagrad (FedAdagrad)",
            "weighted_fed_avg",
            ("adagrad", 0.1, {}),
        ),
        Algorithm(
            "fedavg_yogi", "FedAvg, server Yogi (FedYogi)", "weighted_fed_avg", ("yogi", 0.01, {})
        ),
        Algorithm(
            "unweighted_fedavg",
            "FedAvg, clients weighted equally",
            "unweighted_fed_avg",
            ("sgd", 1.0, {}),
        ),
        Algorithm(
            "fedprox",
            "FedProx, strength 0.1 (TFF's sign)",
            "weighted_fed_prox",
            ("sgd", 1.0, {}),
            proximal_strength=0.1,
        ),
        Algorithm("fedsgd", "FedSGD, server SGD 0.1", "fed_sgd", ("sgd", 0.1, {})),
        Algorithm(
            "fedavg_clipped",
            "FedAvg, client deltas clipped to norm 1.3",
            "weighted_fed_avg",
            ("sgd", 1.0, {}),
            clip_norm=1.3,
        ),
        Algorithm(
            "dp_fixed",
            "DP FedAvg, clip 1.3, no noise (gaussian_fixed)",
            "unweighted_fed_avg",
            ("sgd", 1.0, {}),
            clip_norm=1.3,
            private=True,
        ),
    ]
}
