"""TFF 0.87's side of ``algorithms_vs_tff.py``: its processes, timed round by round.

Run with the Python of the TFF venv (``../shared/anchors/setup_tff_venv.sh``):

    python bench/_tff_algorithms.py --clients FILE.npz --rounds R --algorithms NAME...
    python bench/_tff_algorithms.py --clients FILE.npz --rounds R --serve

With ``--serve`` it reads the names from stdin, one a line, and answers each line as
soon as it is done (``algorithms_vs_tff.py`` alternates TFF's runs with its own without
importing TensorFlow and TFF again for each algorithm); it ends at the end of stdin.

``FILE.npz`` holds ``x_0, y_0, x_1, ...`` (float32 [m, 784], int32 [m]). For each
algorithm of ``_algorithms.ALGORITHMS`` named, in order: builds TFF's process for the
784->10 softmax regression (zero init) with ``tff.learning.algorithms`` and
``tff.learning.optimizers``, initializes it, then runs R rounds on all the clients,
each client's examples repeated for the epochs and batched without shuffling, timing
each ``next`` call. Prints one JSON line per algorithm: ``algorithm``, ``build_init_s``,
``round_s``, ``loss`` (``client_work/train/loss`` of each round) and, for clipped
aggregation, ``clipped_count`` (clients whose delta was clipped, each round).
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import sys
import time
from typing import Any

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff
from _algorithms import ALGORITHMS, BATCH_SIZE, EPOCHS, Algorithm, Optimizer

FEATURES, CLASSES = 784, 10
BUILD_OPTIMIZER = {
    "sgd": tff.learning.optimizers.build_sgdm,
    "adam": tff.learning.optimizers.build_adam,
    "adagrad": tff.learning.optimizers.build_adagrad,
    "yogi": tff.learning.optimizers.build_yogi,
}


def load_datasets(path: str) -> list[tf.data.Dataset]:
    """Each client's examples repeated EPOCHS times and batched, in their order."""
    with np.load(path) as arrays:
        count = len([name for name in arrays.files if name.startswith("x_")])
        pairs = [(arrays[f"x_{i}"], arrays[f"y_{i}"].reshape(-1)) for i in range(count)]
    return [
        tf.data.Dataset.from_tensor_slices(
            collections.OrderedDict(x=x.astype(np.float32), y=y.astype(np.int32))
        )
        .repeat(EPOCHS)
        .batch(BATCH_SIZE)
        for x, y in pairs
    ]


def model_fn() -> tff.learning.models.VariableModel:
    """Our ``softmax_regression((784,), 10)`` in Keras 2: zero-initialized dense, softmax."""
    keras_model = tf.keras.Sequential(
        [
            tf.keras.layers.InputLayer(input_shape=(FEATURES,)),
            tf.keras.layers.Dense(CLASSES, kernel_initializer="zeros"),
            tf.keras.layers.Softmax(),
        ]
    )
    return tff.learning.models.from_keras_model(
        keras_model,
        loss=tf.keras.losses.SparseCategoricalCrossentropy(),
        input_spec=collections.OrderedDict(
            x=tf.TensorSpec([None, FEATURES], tf.float32), y=tf.TensorSpec([None], tf.int32)
        ),
        metrics=[tf.keras.metrics.SparseCategoricalAccuracy()],
    )


def optimizer(spec: Optimizer) -> tff.learning.optimizers.Optimizer:
    rule, learning_rate, keywords = spec
    return BUILD_OPTIMIZER[rule](learning_rate, **keywords)


def build(algorithm: Algorithm, num_clients: int) -> tff.learning.templates.LearningProcess:
    """TFF's process for ``algorithm``, every round on ``num_clients`` clients."""
    algorithms = tff.learning.algorithms
    server = optimizer(algorithm.server)
    if algorithm.builder == "fed_sgd":
        return algorithms.build_fed_sgd(model_fn, server_optimizer_fn=server)
    keywords: dict[str, Any] = {
        "client_optimizer_fn": optimizer(algorithm.client),
        "server_optimizer_fn": server,
    }
    if algorithm.private:
        keywords["model_aggregator"] = tff.aggregators.DifferentiallyPrivateFactory.gaussian_fixed(
            noise_multiplier=0.0, clients_per_round=num_clients, clip=algorithm.clip_norm
        )
    elif algorithm.clip_norm is not None:
        keywords["model_aggregator"] = tff.aggregators.clipping_factory(
            algorithm.clip_norm, tff.aggregators.MeanFactory()
        )
    if algorithm.builder == "weighted_fed_avg":
        return algorithms.build_weighted_fed_avg(model_fn, **keywords)
    if algorithm.builder == "unweighted_fed_avg":
        return algorithms.build_unweighted_fed_avg(model_fn, **keywords)
    if algorithm.builder == "weighted_fed_prox":
        return algorithms.build_weighted_fed_prox(
            model_fn, proximal_strength=algorithm.proximal_strength, **keywords
        )
    raise SystemExit(f"_tff_algorithms: unknown builder {algorithm.builder!r}")


def run(algorithm: Algorithm, datasets: list[tf.data.Dataset], rounds: int) -> dict[str, Any]:
    start = time.perf_counter()
    process = build(algorithm, len(datasets))
    state = process.initialize()
    result: dict[str, Any] = {
        "algorithm": algorithm.name,
        "build_init_s": time.perf_counter() - start,
        "round_s": [],
        "loss": [],
    }
    for _ in range(rounds):
        start = time.perf_counter()
        output = process.next(state, datasets)
        result["round_s"].append(time.perf_counter() - start)
        state = output.state
        result["loss"].append(float(output.metrics["client_work"]["train"]["loss"]))
        if algorithm.counts_clipped:
            clipped = output.metrics["aggregator"]["clipped_count"]
            result.setdefault("clipped_count", []).append(int(clipped))
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", required=True, help=".npz of x_0, y_0, x_1, ...")
    parser.add_argument("--rounds", type=int, required=True)
    names = parser.add_mutually_exclusive_group(required=True)
    names.add_argument("--algorithms", nargs="+", choices=list(ALGORITHMS))
    names.add_argument(
        "--serve", action="store_true", help="read algorithm names from stdin, one a line"
    )
    arguments = parser.parse_args()
    datasets = load_datasets(arguments.clients)
    for name in sys.stdin if arguments.serve else arguments.algorithms:
        name = name.strip()
        if name not in ALGORITHMS:
            raise SystemExit(f"_tff_algorithms: unknown algorithm {name!r}")
        print(json.dumps(run(ALGORITHMS[name], datasets, arguments.rounds)), flush=True)


if __name__ == "__main__":
    main()
