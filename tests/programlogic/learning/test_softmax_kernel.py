"""The C loop of a softmax regression, both builds, against the same SGD in NumPy: to
float32 rounding of float64 math, and the baseline build bit for bit against its
order of operations written out in float32."""

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from programlogic.learning.client_update.compiled import load_kernel

pytestmark = pytest.mark.anyio

BUILDS = pytest.mark.parametrize("portable", [False, True], ids=["default", "baseline"])


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


@BUILDS
@settings(max_examples=80, deadline=None)
@given(group=groups())
async def test_each_client_trains_as_float64_numpy_does(portable, group) -> None:
    kernel_deltas, bias_deltas, finite, sums = load_kernel(portable).train_group(
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


@BUILDS
async def test_shapes_that_do_not_match_are_refused(portable) -> None:
    kernel_module = load_kernel(portable)
    x = np.zeros((2, 4, 3), np.float32)
    labels = np.zeros((2, 4), np.int64)
    indices = np.zeros((2, 5, 2), np.int64)
    mask = np.ones((2, 5, 2), np.float32)
    kernel, bias = np.zeros((6, 3), np.float32), np.zeros(6, np.float32)

    narrow = np.zeros((6, 2), np.float32)
    with pytest.raises(ValueError, match="kernel must be"):
        kernel_module.train_group(x, labels, indices, mask, 5, narrow, bias, 0.1, 0.0)
    with pytest.raises(ValueError, match="same clients"):
        kernel_module.train_group(x, labels[:1], indices, mask, 5, kernel, bias, 0.1, 0.0)
    with pytest.raises(ValueError, match="num_steps"):
        kernel_module.train_group(x, labels, indices, mask, 6, kernel, bias, 0.1, 0.0)


LN2 = 0.6931471805599453
F = np.float32


def baseline_exp(x):
    """_softmax_loop.c's baseline_expf, operation by operation, in Python's doubles."""
    if math.isnan(x):
        return x
    if x > 89.0:
        return F(math.inf)
    if x < -104.0:
        return F(0.0)
    k = float(math.floor(float(x) / LN2 + 0.5))
    r = float(x) - k * LN2
    term = total = 1.0
    for n in range(1, 13):
        term = term * r / n
        total += term
    return F(math.ldexp(total, int(k)))


def baseline_log(x):
    """_softmax_loop.c's baseline_logf, operation by operation."""
    m, e = math.frexp(float(x))
    if m < 0.7071067811865476:
        m, e = m * 2.0, e - 1
    s = (m - 1.0) / (m + 1.0)
    s2, power, series = s * s, s, 0.0
    for n in range(1, 18, 2):
        series += power / n
        power *= s2
    return F(e * LN2 + 2.0 * series)


def baseline_dot(x, row):
    """_softmax_loop.c's baseline dot: 8 running sums over the features below the last
    multiple of 8 (``np.cumsum`` accumulates in order), added lane by lane, then the rest."""
    whole = len(x) // 8 * 8
    lanes = np.zeros(8, F)
    if whole:
        lanes = np.cumsum((x[:whole] * row[:whole]).reshape(-1, 8), axis=0, dtype=F)[-1]
    total = F(0)
    for lane in lanes:
        total = total + lane
    for d in range(whole, len(x)):
        total = total + x[d] * row[d]
    return total


def baseline_client(x, labels, indices, mask, steps, kernel, bias, rate, proximal):
    """One client's training in the baseline build's order, every operation in float32."""
    kernel, bias = kernel.copy(), bias.copy()
    start_kernel, start_bias = kernel.copy(), bias.copy()
    classes, features = kernel.shape
    sums = [F(0)] * 5
    rate, proximal = F(rate), F(proximal)
    for step in range(steps):
        batch, real = indices[step], mask[step]
        count = np.cumsum(real, dtype=F)[-1] if len(real) else F(0)
        if count == 0:
            continue
        divisor = count if count > 1 else F(1)
        loss_total = correct = F(0)
        errors = np.zeros((len(batch), classes), F)
        for i, weight in enumerate(real):
            if weight == 0:
                continue
            example, label = x[batch[i]], labels[batch[i]]
            out = np.array([baseline_dot(example, kernel[k]) + bias[k] for k in range(classes)], F)
            top = out[0]
            for k in range(1, classes):
                top = out[k] if out[k] > top else top
            picked, norm = out[label] - top, F(0)
            for k in range(classes):
                out[k] = baseline_exp(out[k] - top)
                norm = norm + out[k]
            best = 0
            for k in range(classes):
                out[k] = out[k] / norm
                best = k if out[k] > out[best] else best
            loss_total = loss_total + (baseline_log(norm) - picked) * weight
            correct = correct + weight if best == label else correct
            out[label] -= F(1)
            errors[i] = out * weight / divisor
        sums = [
            sums[0] + loss_total / divisor * count,
            sums[1] + count,
            sums[2] + F(1),
            sums[3] + correct,
            sums[4] + count,
        ]
        for k in range(classes):
            step_sum, bias_gradient = np.zeros(features, F), F(0)
            for i, weight in enumerate(real):
                if weight == 0:
                    continue
                bias_gradient = bias_gradient + errors[i, k]
                step_sum = step_sum + errors[i, k] * x[batch[i]]
            if proximal != 0:
                step_sum = step_sum + proximal * (kernel[k] - start_kernel[k])
                bias_gradient = bias_gradient + proximal * (bias[k] - start_bias[k])
            kernel[k] = kernel[k] - rate * step_sum
            bias[k] = bias[k] - rate * bias_gradient
    return start_kernel - kernel, start_bias - bias, sums


@settings(max_examples=30, deadline=None)
@given(group=groups())
async def test_the_baseline_build_adds_in_its_written_order_bit_for_bit(group) -> None:
    # The order the baseline build promises, so that every CPU gives the same bits.
    kernel_deltas, bias_deltas, _, sums = load_kernel(portable=True).train_group(
        group["x"], group["labels"], group["indices"], group["mask"], group["steps"],
        group["kernel"], group["bias"], group["rate"], group["proximal"],
    )  # fmt: skip

    for client in range(len(group["x"])):
        kernel_delta, bias_delta, expected_sums = baseline_client(
            group["x"][client], group["labels"][client], group["indices"][client],
            group["mask"][client], group["steps"], group["kernel"], group["bias"],
            group["rate"], group["proximal"],
        )  # fmt: skip
        np.testing.assert_array_equal(kernel_deltas[client], kernel_delta.T)
        np.testing.assert_array_equal(bias_deltas[client], bias_delta)
        np.testing.assert_array_equal(sums[client], np.array(expected_sums, F))


async def test_the_baseline_exp_and_log_are_float64s_rounded_to_float32() -> None:
    # With the test above, what the C loop's own exp and log compute (its inputs: the
    # exp of a logit minus the largest, the log of a softmax's norm).
    values = -np.geomspace(1e-6, 103, 2000).astype(F)
    exps = np.array([baseline_exp(value) for value in values])
    np.testing.assert_array_equal(exps, np.exp(values.astype(np.float64)).astype(F))
    positives = np.geomspace(1e-30, 1e30, 2000).astype(F)
    logs = np.array([baseline_log(value) for value in positives])
    np.testing.assert_array_equal(logs, np.log(positives.astype(np.float64)).astype(F))
