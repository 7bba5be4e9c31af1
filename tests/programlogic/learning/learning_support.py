"""Data and NumPy references shared by the tests of ``programlogic.learning``.

Everything here is written without the library under test: a softmax regression's
forward pass, cross-entropy and gradient, SGD (with momentum), Adam, Adagrad, Yogi and
RMSprop, and FedAvg on top of them, all in float64 NumPy, so the compiled TensorFlow
code can be checked against arithmetic a reader can follow.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from programlogic import ClientHandle
from programlogic.datasets import ClientArrays

FEATURES = 8
CLASSES = 3
CLIENT_SIZES = {"a": 3, "b": 7, "c": 12}
"""Ragged clients: with batches of 4 over 2 epochs they hold 2, 4 and 6 batches."""


def make_client(count: int, seed: int, *, nan_at: int | None = None) -> ClientArrays:
    """``count`` random examples of FEATURES features and CLASSES labels, read-only.

    Read-only arrays make any in-place change by the library an error.
    """
    rng = np.random.default_rng(seed)
    x = rng.random((count, FEATURES), dtype=np.float32)
    if nan_at is not None:
        x[nan_at, 0] = np.nan
    y = rng.integers(0, CLASSES, count).astype(np.int32)
    x.setflags(write=False)
    y.setflags(write=False)
    return ClientArrays(x, y)


@functools.cache
def ragged_clients() -> dict[str, ClientArrays]:
    return {cid: make_client(count, seed) for seed, (cid, count) in enumerate(CLIENT_SIZES.items())}


def _same(data: Any) -> Any:
    return data


def handles(clients: Mapping[str, ClientArrays]) -> list[ClientHandle]:
    """A handle per client, in the mapping's order."""
    return [ClientHandle(cid, functools.partial(_same, data)) for cid, data in clients.items()]


@functools.cache
def _known_weights(seed: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    kernel = (rng.standard_normal((FEATURES, CLASSES)) * 0.5).astype(np.float32)
    bias = (rng.standard_normal(CLASSES) * 0.1).astype(np.float32)
    return kernel, bias


def known_weights(seed: int = 100) -> dict[str, list[np.ndarray]]:
    """Non-zero float32 weights for ``softmax_regression((FEATURES,), CLASSES)``, as copies."""
    kernel, bias = _known_weights(seed)
    return {"trainable": [kernel.copy(), bias.copy()], "non_trainable": []}


# The model and its loss, by hand.


def probabilities(weights: list[np.ndarray], x: np.ndarray) -> np.ndarray:
    kernel, bias = (np.asarray(w, dtype=np.float64) for w in weights)
    logits = np.asarray(x, dtype=np.float64) @ kernel + bias
    logits -= logits.max(axis=1, keepdims=True)
    exp = np.exp(logits)
    return exp / exp.sum(axis=1, keepdims=True)


def per_example(weights: list[np.ndarray], x: np.ndarray, y: np.ndarray):
    """The cross-entropy and correctness of each example."""
    p = probabilities(weights, x)
    rows = np.arange(len(y))
    return -np.log(p[rows, y]), p.argmax(axis=1) == y


def gradient(weights: list[np.ndarray], x: np.ndarray, y: np.ndarray) -> list[np.ndarray]:
    """The gradient of the batch's mean cross-entropy with respect to (kernel, bias)."""
    error = probabilities(weights, x)
    error[np.arange(len(y)), y] -= 1.0
    error /= len(y)
    return [np.asarray(x, dtype=np.float64).T @ error, error.sum(axis=0)]


# Optimizers, by hand: (initialize(weights) -> state, step(state, weights, grads)).

HandOptimizer = tuple[Callable[[list], Any], Callable[[Any, list, list], tuple[Any, list]]]


def hand_sgd(rate: float, momentum: float = 0.0) -> HandOptimizer:
    def initialize(weights: list) -> Any:
        return [np.zeros_like(w, dtype=np.float64) for w in weights]

    def step(velocity: Any, weights: list, grads: list) -> tuple[Any, list]:
        velocity = [momentum * v + g for v, g in zip(velocity, grads, strict=True)]
        return velocity, [w - rate * v for w, v in zip(weights, velocity, strict=True)]

    return initialize, step


def hand_adam(
    rate: float, beta_1: float = 0.9, beta_2: float = 0.999, epsilon: float = 1e-7
) -> HandOptimizer:
    def initialize(weights: list) -> Any:
        zeros = [np.zeros_like(w, dtype=np.float64) for w in weights]
        return 0, zeros, zeros

    def step(state: Any, weights: list, grads: list) -> tuple[Any, list]:
        t, first, second = state
        t += 1
        first = [beta_1 * m + (1 - beta_1) * g for m, g in zip(first, grads, strict=True)]
        second = [beta_2 * v + (1 - beta_2) * g**2 for v, g in zip(second, grads, strict=True)]
        # Kingma and Ba's efficient form (end of their section 2): the bias corrections
        # folded into the step size, epsilon added to the uncorrected sqrt(v).
        step_size = rate * np.sqrt(1 - beta_2**t) / (1 - beta_1**t)
        new = [
            w - step_size * m / (np.sqrt(v) + epsilon)
            for w, m, v in zip(weights, first, second, strict=True)
        ]
        return (t, first, second), new

    return initialize, step


def hand_adagrad(rate: float, initial: float = 0.1, epsilon: float = 1e-7) -> HandOptimizer:
    def initialize(weights: list) -> Any:
        return [np.full_like(w, initial, dtype=np.float64) for w in weights]

    def step(squares: Any, weights: list, grads: list) -> tuple[Any, list]:
        squares = [s + g**2 for s, g in zip(squares, grads, strict=True)]
        new = [
            w - rate * g / np.sqrt(s + epsilon)
            for w, g, s in zip(weights, grads, squares, strict=True)
        ]
        return squares, new

    return initialize, step


def hand_yogi(
    rate: float,
    beta_1: float = 0.9,
    beta_2: float = 0.999,
    epsilon: float = 1e-3,
    initial: float = 1e-6,
) -> HandOptimizer:
    def initialize(weights: list) -> Any:
        first = [np.zeros_like(w, dtype=np.float64) for w in weights]
        return 0, first, [np.full_like(w, initial, dtype=np.float64) for w in weights]

    def step(state: Any, weights: list, grads: list) -> tuple[Any, list]:
        t, first, second = state
        t += 1
        first = [beta_1 * m + (1 - beta_1) * g for m, g in zip(first, grads, strict=True)]
        # Zaheer et al.: v moves toward g**2 by (1 - beta_2) g**2, whatever their gap.
        second = [
            v - (1 - beta_2) * np.sign(v - g**2) * g**2 for v, g in zip(second, grads, strict=True)
        ]
        step_size = rate * np.sqrt(1 - beta_2**t) / (1 - beta_1**t)
        new = [
            w - step_size * m / (np.sqrt(v) + epsilon)
            for w, m, v in zip(weights, first, second, strict=True)
        ]
        return (t, first, second), new

    return initialize, step


def hand_rmsprop(rate: float, decay: float = 0.9, epsilon: float = 1e-7) -> HandOptimizer:
    def initialize(weights: list) -> Any:
        return [np.zeros_like(w, dtype=np.float64) for w in weights]

    def step(mean_squares: Any, weights: list, grads: list) -> tuple[Any, list]:
        mean_squares = [
            decay * s + (1 - decay) * g**2 for s, g in zip(mean_squares, grads, strict=True)
        ]
        new = [
            w - rate * g / (np.sqrt(s) + epsilon)
            for w, g, s in zip(weights, grads, mean_squares, strict=True)
        ]
        return mean_squares, new

    return initialize, step


# FedAvg, by hand.


def train_client(
    weights: list[np.ndarray],
    data: ClientArrays,
    optimizer: HandOptimizer,
    *,
    epochs: int,
    batch_size: int,
) -> dict[str, Any]:
    """One client's local training, on its examples epoch after epoch, unshuffled."""
    initialize, step = optimizer
    order = np.tile(np.arange(len(data.y)), epochs)
    trained = [np.asarray(w, dtype=np.float64) for w in weights]
    state = initialize(trained)
    loss_sum = correct = 0.0
    num_batches = 0
    for start in range(0, len(order), batch_size):
        batch = order[start : start + batch_size]
        x, y = data.x[batch], data.y[batch]
        losses, right = per_example(trained, x, y)
        loss_sum += losses.sum()
        correct += right.sum()
        num_batches += 1
        state, trained = step(state, trained, gradient(trained, x, y))
    return {
        "delta": [np.asarray(w, np.float64) - t for w, t in zip(weights, trained, strict=True)],
        "num_examples": len(order),
        "loss_sum": loss_sum,
        "correct": correct,
        "num_batches": num_batches,
    }


def fed_avg(
    weights: list[np.ndarray],
    rounds: list[list[ClientArrays]],
    client_optimizer: HandOptimizer,
    server_optimizer: HandOptimizer,
    *,
    epochs: int,
    batch_size: int,
) -> list[tuple[list[np.ndarray], dict[str, float]]]:
    """The model and train metrics after each round of example-weighted FedAvg."""
    initialize, step = server_optimizer
    weights = [np.asarray(w, dtype=np.float64) for w in weights]
    state = initialize(weights)
    history = []
    for clients in rounds:
        results = [
            train_client(weights, data, client_optimizer, epochs=epochs, batch_size=batch_size)
            for data in clients
        ]
        examples = sum(r["num_examples"] for r in results)
        mean_delta = [
            sum(r["num_examples"] * r["delta"][i] for r in results) / examples
            for i in range(len(weights))
        ]
        state, weights = step(state, weights, mean_delta)
        metrics = {
            "loss": sum(r["loss_sum"] for r in results) / examples,
            "sparse_categorical_accuracy": sum(r["correct"] for r in results) / examples,
            "num_examples": examples,
            "num_batches": sum(r["num_batches"] for r in results),
        }
        history.append((weights, metrics))
    return history


def assert_same_state(actual: Any, expected: Any, path: str = "state") -> None:
    """``actual`` has ``expected``'s containers, scalar types, dtypes and bits."""
    assert type(actual) is type(expected), f"{path}: {type(actual)} != {type(expected)}"
    if isinstance(expected, dict):
        assert list(actual) == list(expected), f"{path}: keys {list(actual)} != {list(expected)}"
        for key in expected:
            assert_same_state(actual[key], expected[key], f"{path}[{key!r}]")
    elif isinstance(expected, list | tuple):
        assert len(actual) == len(expected), f"{path}: length {len(actual)} != {len(expected)}"
        for index, (a, e) in enumerate(zip(actual, expected, strict=True)):
            assert_same_state(a, e, f"{path}[{index}]")
    elif isinstance(expected, np.ndarray):
        assert (actual.dtype, actual.shape) == (expected.dtype, expected.shape), path
        assert actual.tobytes() == expected.tobytes(), f"{path}: values differ"
    else:
        assert actual == expected, f"{path}: {actual!r} != {expected!r}"
