"""Our FedAvg's summed-state metrics against TFF 0.87's on the same clients and weights.

TFF runs here; ours runs in the project's Keras 3 environment, whose Python
``PROGRAMLOGIC_KERAS3_PYTHON`` names (the test is skipped without it), on the same
arrays written to an ``.npz``. Batches are in order (no shuffle) so both see the same.
"""

from __future__ import annotations

import collections
import json
import os
import subprocess
from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_federated as tff

pytestmark = pytest.mark.anyio

OURS = Path(__file__).resolve().parent / "_ours_metrics.py"
FEATURES, CLASSES, BATCH, ROUNDS = 6, 5, 4, 2


def clients_and_weights() -> tuple[list[tuple[np.ndarray, np.ndarray]], np.ndarray, np.ndarray]:
    rng = np.random.default_rng(7)
    clients = []
    for size in (9, 4, 15, 6):
        y = rng.integers(0, CLASSES, size).astype(np.int32)
        x = (rng.normal(size=(size, FEATURES)) + 0.5 * y[:, None]).astype(np.float32)
        clients.append((x, y))
    kernel = (rng.normal(size=(FEATURES, CLASSES)) * 0.3).astype(np.float32)
    bias = (rng.normal(size=CLASSES) * 0.1).astype(np.float32)
    return clients, kernel, bias


def tff_rounds(clients, kernel, bias) -> list[dict]:
    spec = collections.OrderedDict(
        x=tf.TensorSpec([None, FEATURES], tf.float32), y=tf.TensorSpec([None], tf.int32)
    )

    def model_fn() -> tff.learning.models.VariableModel:
        # Initializers, not set_weights: TFF initializes the variables in its own graph.
        dense = tf.keras.layers.Dense(
            CLASSES,
            kernel_initializer=tf.keras.initializers.Constant(kernel),
            bias_initializer=tf.keras.initializers.Constant(bias),
        )
        keras_model = tf.keras.Sequential(
            [tf.keras.layers.InputLayer(input_shape=(FEATURES,)), dense]
        )
        return tff.learning.models.from_keras_model(
            keras_model,
            loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
            input_spec=spec,
            metrics=[
                tf.keras.metrics.SparseCategoricalAccuracy(),
                tf.keras.metrics.SparseTopKCategoricalAccuracy(k=3),
            ],
        )

    process = tff.learning.algorithms.build_weighted_fed_avg(
        model_fn,
        client_optimizer_fn=tff.learning.optimizers.build_sgdm(learning_rate=0.1),
        server_optimizer_fn=tff.learning.optimizers.build_sgdm(learning_rate=1.0),
    )
    datasets = [
        tf.data.Dataset.from_tensor_slices(collections.OrderedDict(x=x, y=y)).batch(BATCH)
        for x, y in clients
    ]
    state, rounds = process.initialize(), []
    for _ in range(ROUNDS):
        output = process.next(state, datasets)
        state = output.state
        rounds.append(output.metrics["client_work"]["train"])
    return rounds


async def test_sparse_accuracy_and_top_k_equal_tffs(tmp_path: Path) -> None:
    python = os.environ.get("PROGRAMLOGIC_KERAS3_PYTHON")
    if not python:
        pytest.skip("set PROGRAMLOGIC_KERAS3_PYTHON to a Python with programlogic and Keras 3")
    clients, kernel, bias = clients_and_weights()
    path = tmp_path / "clients.npz"
    arrays = {f"x_{i}": x for i, (x, _) in enumerate(clients)}
    arrays.update({f"y_{i}": y for i, (_, y) in enumerate(clients)})
    np.savez(path, kernel=kernel, bias=bias, batch_size=BATCH, **arrays)
    env = {**os.environ, "PYTHONPATH": str(OURS.parent.parent)}
    done = subprocess.run(
        [python, str(OURS), str(path), str(ROUNDS)],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    ours = json.loads(done.stdout.strip().splitlines()[-1])

    theirs = tff_rounds(clients, kernel, bias)
    for mine, expected in zip(ours, theirs, strict=True):
        for name in ("sparse_categorical_accuracy", "sparse_top_k_categorical_accuracy", "loss"):
            assert mine[name] == pytest.approx(float(expected[name]), abs=1e-6), name
        assert mine["num_examples"] == int(expected["num_examples"])
    # The top-3 accuracy is not trivially 1: the check compares informative values.
    assert all(0 < each["sparse_top_k_categorical_accuracy"] < 1 for each in ours)
