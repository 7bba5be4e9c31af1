"""The C loop of a softmax regression against the same SGD written in float64 NumPy."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from programlogic.learning import _softmax_kernel

pytestmark = pytest.mark.anyio


def reference_client(x, labels, indices, mask, steps, kernel, bias, rate, proximal):
    """One client's training, in float64: the masked mean cross-entropy's gradient, SGD
    with the proximal term; returns the trained (transposed) kernel, bias and the sums."""
    kernel, bias = kernel.astype(np.float64), bias.astype(np.float64)
    start_kernel, start_bias = kernel.copy(), bias.copy()
    loss_sum = examples = batches = correct = 0.0
    for step in range(steps):
        real = mask[step] > 0
        count = mask[step].sum()
        if count == 0:
            continue
        rows = indices[step][real]
        weights = mask[step][real]
        logits = x[rows].astype(np.float64) @ kernel.T + bias
        logits -= logits.max(axis=1, keepdims=True)
        probabilities = np.exp(logits) / np.exp(logits).sum(axis=1, keepdims=True)
        picked = probabilities[np.arange(len(rows)), labels[rows]]
        loss_sum += (-np.log(picked) * weights).sum()
        correct += (weights * (probabilities.argmax(axis=1) == labels[rows])).sum()
        errors = probabilities
        errors[np.arange(len(rows)), labels[rows]] -= 1
        errors *= (weights / max(count, 1.0))[:, None]
        kernel_gradient = errors.T @ x[rows] + proximal * (kernel - start_kernel)
        bias_gradient = errors.sum(axis=0) + proximal * (bias - start_bias)
        kernel -= rate * kernel_gradient
        bias -= rate * bias_gradient
        examples += count
        batches += 1
    return kernel, bias, [loss_sum, examples, batches, correct, examples]


@st.composite
def groups(draw):
    clients = draw(st.integers(1, 3))
    features = draw(st.integers(1, 40))
    classes = draw(st.integers(2, 12))
    examples = draw(st.integers(1, 12))
    batches = draw(st.integers(0, 6))
    slots = draw(st.integers(1, 7))
    seed = draw(st.integers(0, 2**32 - 1))
    rng = np.random.default_rng(seed)
    return {
        "x": rng.normal(size=(clients, examples, features)).astype(np.float32),
        "labels": rng.integers(0, classes, (clients, examples)).astype(np.int64),
        "indices": rng.integers(0, examples, (clients, batches, slots)).astype(np.int64),
        "mask": (rng.random((clients, batches, slots)) < 0.7).astype(np.float32),
        "steps": draw(st.integers(0, batches)),
        "kernel": rng.normal(scale=0.3, size=(classes, features)).astype(np.float32),
        "bias": rng.normal(scale=0.1, size=classes).astype(np.float32),
        "rate": draw(st.sampled_from([0.0, 0.05, 0.3])),
        "proximal": draw(st.sampled_from([0.0, 0.5])),
    }


@settings(max_examples=80, deadline=None)
@given(groups())
async def test_each_client_trains_as_float64_numpy_does(group) -> None:
    kernel_deltas, bias_deltas, finite, sums = _softmax_kernel.train_group(
        group["x"], group["labels"], group["indices"], group["mask"], group["steps"],
        group["kernel"], group["bias"], group["rate"], group["proximal"],
    )  # fmt: skip

    assert finite.all()
    for client in range(len(group["x"])):
        kernel, bias, expected_sums = reference_client(
            group["x"][client], group["labels"][client], group["indices"][client],
            group["mask"][client], group["steps"], group["kernel"], group["bias"],
            group["rate"], group["proximal"],
        )  # fmt: skip
        np.testing.assert_allclose(kernel_deltas[client], (group["kernel"] - kernel).T, atol=1e-4)
        np.testing.assert_allclose(bias_deltas[client], group["bias"] - bias, atol=1e-4)
        np.testing.assert_allclose(sums[client], expected_sums, rtol=1e-4, atol=1e-4)


async def test_shapes_that_do_not_match_are_refused() -> None:
    x = np.zeros((2, 4, 3), np.float32)
    labels = np.zeros((2, 4), np.int64)
    indices = np.zeros((2, 5, 2), np.int64)
    mask = np.ones((2, 5, 2), np.float32)
    kernel, bias = np.zeros((6, 3), np.float32), np.zeros(6, np.float32)

    narrow = np.zeros((6, 2), np.float32)
    with pytest.raises(ValueError, match="kernel must be"):
        _softmax_kernel.train_group(x, labels, indices, mask, 5, narrow, bias, 0.1, 0.0)
    with pytest.raises(ValueError, match="same clients"):
        _softmax_kernel.train_group(x, labels[:1], indices, mask, 5, kernel, bias, 0.1, 0.0)
    with pytest.raises(ValueError, match="num_steps"):
        _softmax_kernel.train_group(x, labels, indices, mask, 6, kernel, bias, 0.1, 0.0)
