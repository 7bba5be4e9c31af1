"""Our functional optimizers step as ``tff.learning.optimizers`` (0.87) do.

For each optimizer and a few hyperparameter settings (TFF's defaults among them), 20
steps from the same float32 weights on the same fixed-seed gradients give the same
weights: ours on NumPy arrays (the server step) and on TensorFlow tensors (the
compiled client step), theirs as TFF runs them.

``programlogic.learning`` needs Keras 3, which this environment (TF 2.14) lacks, but
its ``optimizers`` module needs only NumPy: it is loaded here from its file.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_federated as tff

pytestmark = pytest.mark.anyio

_PATH = Path(__file__).resolve().parent.parent / "programlogic" / "learning" / "optimizers.py"
_SPEC = importlib.util.spec_from_file_location("programlogic_optimizers_alone", _PATH)
ours = importlib.util.module_from_spec(_SPEC)
sys.modules[_SPEC.name] = ours
_SPEC.loader.exec_module(ours)

STEPS = 20
TOLERANCE = 1e-6
builders = tff.learning.optimizers

# (id, our optimizer, TFF's optimizer)
PAIRS = [
    ("sgd-defaults", ours.sgd(), builders.build_sgdm()),
    ("sgd", ours.sgd(0.3), builders.build_sgdm(0.3)),
    ("sgdm", ours.sgd(0.05, momentum=0.9), builders.build_sgdm(0.05, momentum=0.9)),
    ("adam-defaults", ours.adam(0.001), builders.build_adam(0.001)),
    (
        "adam",
        ours.adam(0.05, beta_1=0.5, beta_2=0.9, epsilon=1e-3),
        builders.build_adam(0.05, beta_1=0.5, beta_2=0.9, epsilon=1e-3),
    ),
    ("adagrad-defaults", ours.adagrad(0.01), builders.build_adagrad(0.01)),
    (
        "adagrad",
        ours.adagrad(0.2, initial_preconditioner_value=0.0, epsilon=1e-4),
        builders.build_adagrad(0.2, initial_preconditioner_value=0.0, epsilon=1e-4),
    ),
    ("yogi-defaults", ours.yogi(0.01), builders.build_yogi(0.01)),
    (
        "yogi",
        ours.yogi(0.1, beta_1=0.5, beta_2=0.9, epsilon=1e-6, initial_preconditioner_value=0.5),
        builders.build_yogi(
            0.1, beta_1=0.5, beta_2=0.9, epsilon=1e-6, initial_preconditioner_value=0.5
        ),
    ),
    ("rmsprop-defaults", ours.rmsprop(0.01), builders.build_rmsprop(0.01)),
    (
        "rmsprop",
        ours.rmsprop(0.1, decay=0.5, epsilon=1e-3),
        builders.build_rmsprop(0.1, decay=0.5, epsilon=1e-3),
    ),
]


def problem() -> tuple[list[np.ndarray], list[list[np.ndarray]]]:
    """float32 weights of two shapes and STEPS gradients for them, of varied sizes."""
    rng = np.random.default_rng(7)
    weights = [rng.standard_normal((4, 3)), rng.standard_normal(3)]
    gradients = []
    for step in range(STEPS):
        scale = 10.0 ** rng.uniform(-3, 1)  # from small to large steps
        gradients.append([rng.standard_normal(w.shape) * scale for w in weights])
        if step == 5:  # a step where some coordinates see no gradient
            gradients[-1][1][:] = 0.0
    as32 = [w.astype(np.float32) for w in weights]
    return as32, [[g.astype(np.float32) for g in step] for step in gradients]


def run_tff(optimizer, weights, gradients) -> list[list[np.ndarray]]:
    weights = [tf.constant(w) for w in weights]
    state = optimizer.initialize([tf.TensorSpec.from_tensor(w) for w in weights])
    history = []
    for step in gradients:
        state, weights = optimizer.next(state, weights, [tf.constant(g) for g in step])
        history.append([np.asarray(w) for w in weights])
    return history


def run_ours(optimizer, weights, gradients, convert) -> list[list[np.ndarray]]:
    weights = [convert(w) for w in weights]
    state = optimizer.initialize(weights)
    history = []
    for step in gradients:
        state, weights = optimizer.next(state, weights, [convert(g) for g in step])
        history.append([np.asarray(w) for w in weights])
    return history


def relative_error(actual: np.ndarray, expected: np.ndarray) -> float:
    """The largest difference, relative to the coordinate (or 1 near zero)."""
    scale = np.maximum(np.abs(expected.astype(np.float64)), 1.0)
    return float(np.max(np.abs(actual.astype(np.float64) - expected) / scale))


@pytest.mark.parametrize("backend", ["numpy", "tensorflow"])
@pytest.mark.parametrize(
    ("ours_optimizer", "tff_optimizer"), [p[1:] for p in PAIRS], ids=[p[0] for p in PAIRS]
)
async def test_twenty_steps_give_tff_weights(ours_optimizer, tff_optimizer, backend) -> None:
    weights, gradients = problem()
    convert = np.asarray if backend == "numpy" else tf.constant
    expected = run_tff(tff_optimizer, weights, gradients)
    actual = run_ours(ours_optimizer, weights, gradients, convert)

    worst = 0.0
    for step, (mine, theirs) in enumerate(zip(actual, expected, strict=True)):
        for a, e in zip(mine, theirs, strict=True):
            assert a.dtype == np.float32 and a.shape == e.shape
            worst = max(worst, relative_error(a, e))
        assert worst <= TOLERANCE, f"step {step + 1}: relative error {worst:.3g}"
    # The weights moved: the comparison is not of weights that stayed put.
    assert relative_error(expected[-1][0], weights[0]) > 1e-3
    print(f"largest relative error over {STEPS} steps: {worst:.3g}")
