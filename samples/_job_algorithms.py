"""The main job's ``--algorithm``: which federated learning process a run trains with.

- ``fedavg``: FedAvg weighted by examples, server SGD (default learning rate 1.0: the
  new model is the mean of the client models, as in the TFF tutorial);
- ``fedprox``: FedProx, FedAvg whose client loss adds ``mu / 2 * ||w - w_server||^2``
  (``--proximal-strength`` mu, default 0.01, the middle of the range Li et al. tried),
  server SGD 1.0;
- ``fedavgm``: FedAvg with server momentum 0.9 (Hsu et al. 2019), server learning rate
  0.2 by default: with momentum 0.9 a steady step is 10 times the learning rate, so
  about twice FedAvg's;
- ``fedadam`` and ``fedyogi``: FedAvg with a server Adam or Yogi (Reddi et al. 2020),
  learning rate 0.1 and epsilon (their adaptivity tau) 1e-3 by default (on the digits,
  15 rounds: final training loss 0.19 and 0.20 with 0.1; 0.68 and 0.71 with 0.03; 1.37
  and 1.39 with 0.01).

The client optimizer is SGD with ``--client-lr`` for every algorithm.

``--aggregator`` picks how the client deltas are combined: ``mean`` (weighted by
examples, the default), or the robust ``median`` and ``trimmed_mean`` (beta 0.2), which
hold when a minority of clients send arbitrary updates; ``--clip-norm C`` first clips
each client's delta to the L2 norm C. With ``--dp-noise-multiplier`` the clients are
averaged with equal weights by ``dp_mean`` instead (see ``samples/_job_privacy.py``).
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any

__all__ = [
    "AGGREGATORS",
    "ALGORITHMS",
    "DEFAULT_PROXIMAL_STRENGTH",
    "SERVER_LEARNING_RATES",
    "build_process",
    "model_aggregator",
    "resolve_algorithm_flags",
    "server_optimizer",
]

ALGORITHMS = ("fedavg", "fedprox", "fedavgm", "fedadam", "fedyogi")
"""The values of ``--algorithm``."""

AGGREGATORS = ("mean", "median", "trimmed_mean")
"""The values of ``--aggregator``."""

TRIMMED_FRACTION = 0.2

SERVER_LEARNING_RATES = {
    "fedavg": 1.0,
    "fedprox": 1.0,
    "fedavgm": 0.2,
    "fedadam": 0.1,
    "fedyogi": 0.1,
}
"""Each algorithm's ``--server-lr`` when none is given."""

DEFAULT_PROXIMAL_STRENGTH = 0.01
"""``--proximal-strength`` of ``--algorithm fedprox`` when none is given."""

SERVER_MOMENTUM = 0.9
ADAPTIVITY = 1e-3


def resolve_algorithm_flags(
    arguments: argparse.Namespace, error: Callable[[str], Any]
) -> argparse.Namespace:
    """Fill in the algorithm's defaults (``server_lr``, ``proximal_strength``) in place;
    ``error`` (the parser's) reports a flag that does not go with the algorithm."""
    if arguments.server_lr is None:
        arguments.server_lr = SERVER_LEARNING_RATES[arguments.algorithm]
    if arguments.algorithm == "fedprox":
        if arguments.proximal_strength is None:
            arguments.proximal_strength = DEFAULT_PROXIMAL_STRENGTH
    elif arguments.proximal_strength is not None:
        error("--proximal-strength goes with --algorithm fedprox")
    return arguments


def server_optimizer(algorithm: str, learning_rate: float) -> Any:
    """The server optimizer of ``algorithm`` with ``learning_rate``."""
    from programlogic.learning import adam, sgd, yogi

    if algorithm == "fedavgm":
        return sgd(learning_rate, momentum=SERVER_MOMENTUM)
    if algorithm == "fedadam":
        return adam(learning_rate, epsilon=ADAPTIVITY)
    if algorithm == "fedyogi":
        return yogi(learning_rate, epsilon=ADAPTIVITY)
    return sgd(learning_rate)


def model_aggregator(aggregator: str, clip_norm: float | None) -> Any:
    """The model aggregator ``--aggregator`` and ``--clip-norm`` name."""
    from programlogic.learning import clipping, mean, median, trimmed_mean

    inner = {
        "mean": mean,
        "median": median,
        "trimmed_mean": lambda: trimmed_mean(TRIMMED_FRACTION),
    }[aggregator]()
    return inner if clip_norm is None else clipping(clip_norm, inner)


def build_process(
    arguments: argparse.Namespace,
    model_fn: Callable[[], Any],
    *,
    num_clients: int | None = None,
) -> Any:
    """The training process the flags name, for the model ``model_fn`` builds.

    A DP run (``--dp-noise-multiplier``) needs ``num_clients``, the number of training
    clients its rounds sample from.
    """
    from programlogic.datasets import Preprocessing
    from programlogic.learning import (
        build_unweighted_fed_avg,
        build_unweighted_fed_prox,
        build_weighted_fed_avg,
        build_weighted_fed_prox,
        sgd,
    )
    from samples._job_privacy import dp_model_aggregator

    preprocess = Preprocessing(
        epochs=arguments.epochs, batch_size=arguments.batch_size, shuffle_buffer=100
    )
    client = sgd(arguments.client_lr)
    server = server_optimizer(arguments.algorithm, arguments.server_lr)
    common = {"preprocess": preprocess, "seed": arguments.seed}
    if getattr(arguments, "dp_noise_multiplier", None) is not None:
        if num_clients is None:
            raise ValueError("a DP run needs num_clients, the number of training clients")
        aggregator = dp_model_aggregator(arguments, num_clients)
        if arguments.algorithm == "fedprox":
            return build_unweighted_fed_prox(
                model_fn,
                arguments.proximal_strength,
                client,
                server,
                model_aggregator=aggregator,
                **common,
            )
        return build_unweighted_fed_avg(
            model_fn, client, server, model_aggregator=aggregator, **common
        )
    aggregator = model_aggregator(arguments.aggregator, arguments.clip_norm)
    if arguments.algorithm == "fedprox":
        return build_weighted_fed_prox(
            model_fn,
            arguments.proximal_strength,
            client,
            server,
            model_aggregator=aggregator,
            **common,
        )
    return build_weighted_fed_avg(model_fn, client, server, model_aggregator=aggregator, **common)
