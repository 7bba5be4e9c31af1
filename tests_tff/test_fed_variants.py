"""Our FedProx, unweighted FedAvg, FedSGD and norm-clipped FedAvg against TFF 0.87's.

The same clients (conftest's first five), every round all of them, in order, each
client's examples repeated for 2 epochs and batched by 8 without shuffling, from the
zero-initialized softmax regression, 3 rounds: the per-round training losses and the
model after the last round agree to 1e-5 relative. TFF's FedProx adds the proximal
term's gradient with the opposite sign (see the last test): it is compared with our
FedProx given the negated strength.

``programlogic.learning`` needs Keras 3, which this environment (TF 2.14) lacks: our
side runs ``_ours_fed_variants.py`` with the Python of a Keras 3 environment,
``$PROGRAMLOGIC_KERAS3_PYTHON`` or else the repository's ``.venv`` or ``../main/.venv``.
"""

from __future__ import annotations

import collections
import json
import os
import subprocess
import sys
from pathlib import Path

import anyio
import numpy as np
import pytest
import tensorflow as tf
import tensorflow_federated as tff
from conftest import CLASSES, FEATURES, client_arrays

from programlogic.contexts.tff.context import _stop_runtime

pytestmark = pytest.mark.anyio

REPO = Path(__file__).resolve().parent.parent
OURS = Path(__file__).with_name("_ours_fed_variants.py")
ROUNDS, EPOCHS, BATCH, CLIENTS = 3, 2, 8, 5
PROXIMAL_STRENGTH = 0.5
CLIP_NORM = 0.3
"""Clips every client's delta in the first round and some in the next ones."""
CLIENT_RATE, SERVER_RATE, SGD_SERVER_RATE = 0.1, 1.0, 0.5
TOLERANCE = 1e-5


def keras3_python() -> str | None:
    candidates = [
        os.environ.get("PROGRAMLOGIC_KERAS3_PYTHON"),
        str(REPO / ".venv" / "bin" / "python"),
        str(REPO.parent / "main" / ".venv" / "bin" / "python"),
    ]
    return next((c for c in candidates if c and Path(c).exists()), None)


def softmax_model_fn() -> tff.learning.models.VariableModel:
    """Our ``softmax_regression`` in Keras 2: one zero-initialized dense layer, softmax."""
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


def tff_process(algorithm: str) -> tff.learning.templates.LearningProcess:
    algorithms, sgdm = tff.learning.algorithms, tff.learning.optimizers.build_sgdm
    optimizers = {
        "client_optimizer_fn": sgdm(learning_rate=CLIENT_RATE),
        "server_optimizer_fn": sgdm(learning_rate=SERVER_RATE),
    }
    algorithm = algorithm.removeprefix("tff_sign_")
    if algorithm == "weighted_fed_prox":
        return algorithms.build_weighted_fed_prox(
            softmax_model_fn, proximal_strength=PROXIMAL_STRENGTH, **optimizers
        )
    if algorithm == "unweighted_fed_prox":
        return algorithms.build_unweighted_fed_prox(
            softmax_model_fn, proximal_strength=PROXIMAL_STRENGTH, **optimizers
        )
    if algorithm == "unweighted_fed_avg":
        return algorithms.build_unweighted_fed_avg(softmax_model_fn, **optimizers)
    if algorithm == "dp_fixed_fed_avg":
        dp = tff.aggregators.DifferentiallyPrivateFactory.gaussian_fixed(
            noise_multiplier=0.0, clients_per_round=CLIENTS, clip=CLIP_NORM
        )
        return algorithms.build_unweighted_fed_avg(
            softmax_model_fn, model_aggregator=dp, **optimizers
        )
    if algorithm == "dp_adaptive_fed_avg":
        dp = tff.aggregators.DifferentiallyPrivateFactory.gaussian_adaptive(
            noise_multiplier=0.0, clients_per_round=CLIENTS, initial_l2_norm_clip=CLIP_NORM
        )
        return algorithms.build_unweighted_fed_avg(
            softmax_model_fn, model_aggregator=dp, **optimizers
        )
    if algorithm.startswith("clipped_"):
        inner = tff.aggregators.MeanFactory()
        if algorithm == "clipped_unweighted_fed_avg":
            inner = tff.aggregators.UnweightedMeanFactory()
        clipped = tff.aggregators.clipping_factory(CLIP_NORM, inner)
        build = (
            algorithms.build_unweighted_fed_avg
            if algorithm == "clipped_unweighted_fed_avg"
            else algorithms.build_weighted_fed_avg
        )
        return build(softmax_model_fn, model_aggregator=clipped, **optimizers)
    assert algorithm == "fed_sgd"
    return algorithms.build_fed_sgd(
        softmax_model_fn, server_optimizer_fn=sgdm(learning_rate=SGD_SERVER_RATE)
    )


def clients() -> list[tuple[np.ndarray, np.ndarray]]:
    return list(client_arrays().values())[:CLIENTS]


def run_tff(algorithm: str) -> tuple[list[float], list[np.ndarray], list[int]]:
    process = tff_process(algorithm)
    datasets = [
        tf.data.Dataset.from_tensor_slices(collections.OrderedDict(x=x, y=y))
        .repeat(EPOCHS)
        .batch(BATCH)
        for x, y in clients()
    ]
    runtime = tff.backends.native.create_sync_local_cpp_execution_context()
    try:
        with tff.framework.get_context_stack().install(runtime):
            state = process.initialize()
            losses, clipped = [], []
            for _ in range(ROUNDS):
                output = process.next(state, datasets)
                state = output.state
                losses.append(float(output.metrics["client_work"]["train"]["loss"]))
                clipped.append(int(output.metrics["aggregator"].get("clipped_count", -1)))
            weights = process.get_model_weights(state).trainable
    finally:
        _stop_runtime(runtime)  # TFF would leave its worker process to the garbage collector
    return losses, [np.asarray(w) for w in weights], clipped


def run_ours(
    python: str, algorithm: str, tmp_path: Path
) -> tuple[list[float], list[np.ndarray], list[int]]:
    npz = tmp_path / "clients.npz"
    arrays = {}
    for index, (x, y) in enumerate(clients()):
        arrays[f"x_{index}"], arrays[f"y_{index}"] = x, y
    np.savez(npz, **arrays)
    command = [python, str(OURS), str(npz), algorithm, str(ROUNDS), str(EPOCHS), str(BATCH)]
    environment = {**os.environ, "PYTHONPATH": str(REPO)}
    done = subprocess.run(command, capture_output=True, text=True, env=environment, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    trainable = [np.asarray(w, dtype=np.float32) for w in result["trainable"]]
    return result["losses"], trainable, result["clipped"]


def python_or_skip() -> str:
    python = keras3_python()
    if python is None:
        pytest.skip("no Keras 3 environment for programlogic.learning (PROGRAMLOGIC_KERAS3_PYTHON)")
    return python


@pytest.mark.parametrize(
    "algorithm",
    [
        "tff_sign_weighted_fed_prox",
        "tff_sign_unweighted_fed_prox",
        "unweighted_fed_avg",
        "fed_sgd",
        "clipped_fed_avg",
        "clipped_unweighted_fed_avg",
        "dp_fixed_fed_avg",
        "dp_adaptive_fed_avg",
    ],
)
async def test_losses_and_model_equal_tffs(algorithm: str, tmp_path: Path) -> None:
    python = python_or_skip()
    theirs = await anyio.to_thread.run_sync(run_tff, algorithm)
    ours = await anyio.to_thread.run_sync(run_ours, python, algorithm, tmp_path)
    (their_losses, their_model, their_clipped), (our_losses, our_model, our_clipped) = theirs, ours
    np.testing.assert_allclose(our_losses, their_losses, rtol=TOLERANCE)
    if algorithm.startswith("clipped_"):
        assert our_clipped == their_clipped
        assert their_clipped[0] == CLIENTS and min(their_clipped) < CLIENTS
    for mine, reference in zip(our_model, their_model, strict=True):
        np.testing.assert_allclose(mine, reference, rtol=TOLERANCE, atol=1e-7)
    worst = max(abs(a - b) / abs(b) for a, b in zip(our_losses, their_losses, strict=True))
    model_worst = max(
        float(np.max(np.abs(m - r) / np.maximum(np.abs(r), 1e-30)))
        for m, r in zip(our_model, their_model, strict=True)
    )
    print(f"{algorithm}: losses {worst:.2e}, model {model_worst:.2e} relative", file=sys.stderr)


async def test_tffs_fed_prox_pushes_clients_away_from_the_server_model(tmp_path: Path) -> None:
    """TFF 0.87 adds ``proximal_strength * (w_server - w)`` to each client gradient, the
    negative of the proximal term's gradient; ours adds ``proximal_strength * (w -
    w_server)`` (Li et al.'s FedProx), so the same strength gives other numbers; ours
    with the strength negated gives TFF's."""
    python = python_or_skip()
    theirs, _, _ = await anyio.to_thread.run_sync(run_tff, "weighted_fed_prox")
    ours, _, _ = await anyio.to_thread.run_sync(run_ours, python, "weighted_fed_prox", tmp_path)
    mirrored, _, _ = await anyio.to_thread.run_sync(
        run_ours, python, "tff_sign_weighted_fed_prox", tmp_path
    )
    np.testing.assert_allclose(mirrored, theirs, rtol=TOLERANCE)
    assert abs(ours[0] - theirs[0]) > 1e-3, (ours, theirs)
