"""The bare SGD math of one FedAvg round, written several ways, for ``roofline.py``.

Every formulation trains all the clients it is given side by side, from the same start
weights, for the round's dependent steps, then averages their weights: no data
gathering (the batches are slices of arrays laid out ahead), no metrics, no
aggregation beyond the mean. Each ``build_*`` returns ``run(clients)``, which trains
the clients ``clients`` (a slice of the data's leading axis) for one round.

- ``numpy``: a Python loop over steps, each step batched over clients (``matmul`` over
  a leading client axis); OpenBLAS limited to one thread.
- ``xla_matmul``: ``tf.function(jit_compile=True)``, a ``tf.while_loop`` over steps,
  batched ``tf.matmul``.
- ``xla_bmr``: the same with broadcast-multiply-reduce in place of the products.
- ``xla_unrolled``: the steps unrolled in the compiled graph (slow to compile).
- ``keras_vmap`` (any model): ``tf.vectorized_map`` over clients of a ``tf.while_loop``
  over steps, gradients by ``tf.GradientTape`` through the Keras model: the shape of
  the library's compiled client loop, without its gathering and metrics.
- ``keras_map`` (any model): the same with ``tf.map_fn`` over clients, one at a time.
- ``c_loop``: the library's compiled C loop of the softmax regression
  (``programlogic.learning.client_update.compiled``), client after client, each client's steps
  in one call; its batches index the examples in order, every slot real.

The first four and ``c_loop`` are the softmax layer's math written by hand (zero start weights, as
the tutorial's); the last two take the model from ``programlogic.learning.models``.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

LEARNING_RATE = 0.02

Run = Callable[[slice], Any]


@contextlib.contextmanager
def blas_threads(limit: int) -> Iterator[None]:
    """OpenBLAS (NumPy's) limited to ``limit`` threads, when threadpoolctl is installed."""
    try:
        from threadpoolctl import threadpool_limits
    except ImportError:  # pragma: no cover - scikit-learn brings it
        yield
        return
    with threadpool_limits(limits=limit, user_api="blas"):
        yield


def softmax_data(clients: int, examples: int, features: int, classes: int) -> dict[str, Any]:
    """Uniform features, labels one-hot and as integers, seed 0: ``x`` [N, m, D]."""
    rng = np.random.default_rng(0)
    x = rng.random((clients, examples, features), dtype=np.float32)
    labels = rng.integers(0, classes, (clients, examples)).astype(np.int32)
    return {"x": x, "labels": labels, "y": np.eye(classes, dtype=np.float32)[labels]}


def build_numpy(data: dict[str, Any], steps: int, batch: int) -> Run:
    x, y = data["x"], data["y"]
    per_epoch = x.shape[1] // batch

    def run(clients: slice) -> Any:
        xs, ys = x[clients], y[clients]
        w = np.zeros((xs.shape[0], xs.shape[2], ys.shape[2]), np.float32)
        b = np.zeros((xs.shape[0], 1, ys.shape[2]), np.float32)
        scale = np.float32(LEARNING_RATE / batch)
        with blas_threads(1):
            for step in range(steps):
                start = (step % per_epoch) * batch
                xb, yb = xs[:, start : start + batch], ys[:, start : start + batch]
                logits = np.matmul(xb, w)
                logits += b
                logits -= logits.max(axis=2, keepdims=True)
                p = np.exp(logits)
                p /= p.sum(axis=2, keepdims=True)
                p -= yb
                p *= scale
                w -= np.matmul(xb.transpose(0, 2, 1), p)
                b -= p.sum(axis=1, keepdims=True)
        return w.mean(axis=0), b.mean(axis=0)

    return run


def _tf() -> Any:
    import tensorflow as tf

    import programlogic.learning  # noqa: F401  (TensorFlow as the library loads it)

    return tf


def _softmax_step(tf: Any, product: str, xb: Any, yb: Any, w: Any, b: Any) -> tuple[Any, Any]:
    """One SGD step of the softmax layer for every client: ``xb`` [N, B, D], ``w`` [N, D, K]."""
    if product == "matmul":
        logits = tf.matmul(xb, w) + b
    else:
        logits = tf.reduce_sum(xb[:, :, :, None] * w[:, None, :, :], axis=2) + b
    g = (tf.nn.softmax(logits) - yb) * (LEARNING_RATE / xb.shape[1])
    if product == "matmul":
        dw = tf.matmul(xb, g, transpose_a=True)
    else:
        dw = tf.reduce_sum(xb[:, :, :, None] * g[:, :, None, :], axis=1)
    return w - dw, b - tf.reduce_sum(g, axis=1, keepdims=True)


def _batched(data: dict[str, Any], batch: int) -> tuple[Any, Any]:
    """``x`` and one-hot ``y`` as [steps of an epoch, N, B, ...]: a step slices the front."""
    x, y = data["x"], data["y"]
    n, m = x.shape[:2]
    shape = (n, m // batch, batch)
    return (
        np.ascontiguousarray(x.reshape(*shape, -1).transpose(1, 0, 2, 3)),
        np.ascontiguousarray(y.reshape(*shape, -1).transpose(1, 0, 2, 3)),
    )


def build_xla(data: dict[str, Any], steps: int, batch: int, product: str, unroll: bool) -> Run:
    tf = _tf()
    xs, ys = _batched(data, batch)
    per_epoch = xs.shape[0]

    @tf.function(jit_compile=True, autograph=False)
    def train(x: Any, y: Any) -> Any:
        n, features, classes = x.shape[1], x.shape[3], y.shape[3]
        w, b = tf.zeros([n, features, classes]), tf.zeros([n, 1, classes])
        if unroll:
            for step in range(steps):
                w, b = _softmax_step(tf, product, x[step % per_epoch], y[step % per_epoch], w, b)
        else:

            def body(i: Any, w: Any, b: Any) -> tuple[Any, Any, Any]:
                index = i % per_epoch
                return (i + 1, *_softmax_step(tf, product, x[index], y[index], w, b))

            _, w, b = tf.while_loop(lambda i, *_: i < steps, body, (tf.constant(0), w, b))
        return tf.reduce_mean(w, axis=0), tf.reduce_mean(b, axis=0)

    def run(clients: slice) -> Any:
        return [t.numpy() for t in train(xs[:, clients], ys[:, clients])]

    return run


def build_keras(data: dict[str, Any], steps: int, batch: int, model: Any, over_clients: str) -> Run:
    """The Keras model's own forward pass and gradients, clients by ``over_clients``."""
    tf = _tf()
    import keras

    x, labels = data["x"], data["labels"]
    n, m = x.shape[:2]
    xs = x.reshape(n, m // batch, batch, -1)
    ys = labels.reshape(n, m // batch, batch)
    per_epoch = xs.shape[1]
    start = [v.value for v in model.trainable_variables]
    fixed = [v.value for v in model.non_trainable_variables]

    def client(inputs: tuple[Any, Any]) -> list[Any]:
        x, y = inputs

        def body(i: Any, weights: list[Any]) -> tuple[Any, list[Any]]:
            index = i % per_epoch
            with tf.GradientTape() as tape:
                tape.watch(weights)
                outputs, _ = model.stateless_call(weights, fixed, x[index], training=True)
                loss = tf.reduce_mean(
                    keras.losses.sparse_categorical_crossentropy(y[index], outputs)
                )
            gradients = tape.gradient(loss, weights)
            return i + 1, [w - LEARNING_RATE * g for w, g in zip(weights, gradients, strict=True)]

        _, trained = tf.while_loop(lambda i, _: i < steps, body, (tf.constant(0), list(start)))
        return trained

    @tf.function(jit_compile=True, autograph=False)
    def train(x: Any, y: Any) -> Any:
        if over_clients == "vmap":
            trained = tf.vectorized_map(client, (x, y))
        else:
            signature = [tf.TensorSpec(w.shape, w.dtype) for w in start]
            trained = tf.map_fn(client, (x, y), fn_output_signature=signature)
        return [tf.reduce_mean(w, axis=0) for w in trained]

    def run(clients: slice) -> Any:
        return [t.numpy() for t in train(xs[clients], ys[clients])]

    return run


def build_c_loop(data: dict[str, Any], steps: int, batch: int) -> Run:
    from programlogic.learning.client_update.compiled import load_kernel

    kernel_module = load_kernel()

    x, labels = data["x"], data["labels"].astype(np.int64)
    n, m, features = x.shape
    classes = data["y"].shape[2]
    per_epoch = m // batch
    order = np.arange(per_epoch * batch, dtype=np.int64).reshape(per_epoch, batch)
    indices = np.ascontiguousarray(
        np.broadcast_to(np.tile(order, (-(-steps // per_epoch), 1))[:steps], (n, steps, batch))
    )
    mask = np.ones((n, steps, batch), np.float32)
    kernel, bias = np.zeros((classes, features), np.float32), np.zeros(classes, np.float32)

    def run(clients: slice) -> Any:
        kernel_deltas, bias_deltas, _, _ = kernel_module.train_group(
            x[clients], labels[clients], indices[clients], mask[clients], steps,
            kernel, bias, LEARNING_RATE, 0.0,
        )  # fmt: skip
        return kernel_deltas.mean(axis=0), bias_deltas.mean(axis=0)

    return run


SOFTMAX_FORMULATIONS: dict[str, Callable[..., Run]] = {
    "numpy": build_numpy,
    "xla_matmul": functools.partial(build_xla, product="matmul", unroll=False),
    "xla_bmr": functools.partial(build_xla, product="bmr", unroll=False),
    "xla_unrolled": functools.partial(build_xla, product="matmul", unroll=True),
    "c_loop": build_c_loop,
}
"""The hand-written formulations of the softmax layer: ``build(data, steps, batch)``."""

KERAS_FORMULATIONS = {"keras_vmap": "vmap", "keras_map": "map"}
"""The formulations through a Keras model, any model: ``build_keras(..., over_clients)``."""
