"""Our FedProx / unweighted FedAvg / FedSGD / clipped FedAvg rounds, in the Keras 3 environment.

    python _ours_fed_variants.py CLIENTS.npz ALGORITHM ROUNDS EPOCHS BATCH

``CLIENTS.npz`` holds ``x_0, y_0, x_1, ...``; every round trains on all of them, in
order, unshuffled, from the zero-initialized softmax regression. Prints one JSON line:
``{"losses": [...], "trainable": [[...], ...]}`` (the model after the last round).
"""

from __future__ import annotations

import functools
import json
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import anyio
import numpy as np

from programlogic import InMemoryDataSource, LocalContext
from programlogic.datasets import ClientArrays, Preprocessing
from programlogic.learning import (
    FedProx,
    FunctionalModel,
    adaptive_clipping,
    build_fed_sgd,
    build_unweighted_fed_avg,
    build_unweighted_fed_prox,
    build_weighted_fed_avg,
    build_weighted_fed_prox,
    clipping,
    dp_mean,
    sgd,
    softmax_regression,
)
from programlogic.learning.keras_model import DEFAULT_LOSS
from programlogic.privacy import GaussianMechanism

PROXIMAL_STRENGTH = 0.5
CLIP_NORM = 0.3
CLIENT_RATE, SERVER_RATE, SGD_SERVER_RATE = 0.1, 1.0, 0.5


def build(algorithm: str, features: int, classes: int, preprocess: Preprocessing):
    model_fn = functools.partial(softmax_regression, (features,), classes)
    optimizers = (sgd(CLIENT_RATE), sgd(SERVER_RATE))
    if algorithm == "weighted_fed_prox":
        return build_weighted_fed_prox(
            model_fn, PROXIMAL_STRENGTH, *optimizers, preprocess=preprocess
        )
    if algorithm == "unweighted_fed_prox":
        return build_unweighted_fed_prox(
            model_fn, PROXIMAL_STRENGTH, *optimizers, preprocess=preprocess
        )
    if algorithm.startswith("tff_sign_"):
        # TFF 0.87 adds proximal_strength * (w_server - w) to the gradient, the opposite
        # of the proximal term's gradient: our FedProx with the strength negated does
        # the same (the builders refuse a negative strength, the class takes it).
        weighting = "uniform" if algorithm.endswith("unweighted_fed_prox") else "num_examples"
        return FedProx(
            FunctionalModel(model_fn, DEFAULT_LOSS, ("sparse_categorical_accuracy",)),
            *optimizers,
            preprocess,
            0,
            None,
            proximal_strength=-PROXIMAL_STRENGTH,
            client_weighting=weighting,
        )
    if algorithm == "unweighted_fed_avg":
        return build_unweighted_fed_avg(model_fn, *optimizers, preprocess=preprocess)
    if algorithm.startswith("dp_"):
        # No noise, every client every round: TFF's gaussian_fixed / gaussian_adaptive.
        mechanism = GaussianMechanism(0.0, num_clients=5, clients_per_round=5, sampling="fixed")
        clip = adaptive_clipping(CLIP_NORM) if algorithm == "dp_adaptive_fed_avg" else CLIP_NORM
        aggregator = dp_mean(mechanism, clip, delta=1e-5)
        return build_unweighted_fed_avg(
            model_fn, *optimizers, preprocess=preprocess, model_aggregator=aggregator
        )
    if algorithm == "clipped_fed_avg":
        return build_weighted_fed_avg(
            model_fn, *optimizers, preprocess=preprocess, model_aggregator=clipping(CLIP_NORM)
        )
    if algorithm == "clipped_unweighted_fed_avg":
        return build_unweighted_fed_avg(
            model_fn, *optimizers, preprocess=preprocess, model_aggregator=clipping(CLIP_NORM)
        )
    if algorithm == "fed_sgd":
        return build_fed_sgd(model_fn, sgd(SGD_SERVER_RATE), preprocess=preprocess)
    raise SystemExit(f"unknown algorithm {algorithm!r}")


async def main(path: str, algorithm: str, rounds: int, epochs: int, batch: int) -> None:
    with np.load(path) as arrays:
        count = len([name for name in arrays.files if name.startswith("x_")])
        clients = {
            f"c{index:02d}": ClientArrays(arrays[f"x_{index}"], arrays[f"y_{index}"])
            for index in range(count)
        }
    first = next(iter(clients.values()))
    classes = int(max(int(client.y.max()) for client in clients.values())) + 1
    preprocess = Preprocessing(epochs=epochs, batch_size=batch, shuffle_buffer=0)
    process = build(algorithm, first.x.shape[1], classes, preprocess)
    handles = InMemoryDataSource(clients).all_clients()
    losses, clipped = [], []
    async with LocalContext():
        state = process.initialize()
        for _ in range(rounds):
            output = await process.next(state, handles)
            state = output.state
            losses.append(output.metrics["client_work"]["train"]["loss"])
            clipped.append(output.metrics.get("aggregator", {}).get("clipped_count", -1))
    trainable = [w.tolist() for w in process.get_model_weights(state)["trainable"]]
    print(json.dumps({"losses": losses, "trainable": trainable, "clipped": clipped}))


if __name__ == "__main__":
    path, algorithm, rounds, epochs, batch = sys.argv[1:]
    anyio.run(main, path, algorithm, int(rounds), int(epochs), int(batch))
