"""The client update of a softmax regression as a Numba loop, when the model is one.

A softmax regression (an optional flatten, one dense layer with a bias, a softmax,
sparse categorical cross-entropy) trained with plain SGD spends each local step on two
tiny products: 5 examples against a 784x10 kernel in the EMNIST tutorial. Compiled
TensorFlow pays a fixed cost for every operation of such a step, so the step's latency,
not its FLOPs, bounds a round (``bench/roofline.py``). Here a client's steps run as one
Numba-compiled loop over the transposed kernel held in cache, some 2.5x faster than
the best TensorFlow or NumPy formulation of the same math on this repository's
benchmark machine. The loop computes what :func:`~programlogic.learning._client_update.
train_group_graph` traces for such a model (the masked mean loss, the accuracy sums,
FedProx's proximal term, an empty batch leaving the weights alone), equal to float32
rounding; the group's deltas are folded by the same aggregator code, compiled.

:func:`softmax_group_update` says whether a process's model and client optimizer are
one it runs; without Numba installed none is, and the traced graph runs instead.
"""

from __future__ import annotations

import functools
from typing import Any

import numpy as np

from programlogic.learning._tensorflow import CompiledFunction, keras, tf
from programlogic.learning.aggregators import ModelAggregator, Partial, fold_clients
from programlogic.learning.keras_model import ClientGroup, FunctionalModel
from programlogic.learning.optimizers import SGD, Optimizer

try:
    import numba
except ImportError:  # pragma: no cover - depends on the environment
    numba = None

__all__ = ["SoftmaxGroupUpdate", "softmax_group_update", "softmax_layer"]

# Reassociation lets the loops over features vectorize; no flag that assumes values are
# finite, since a non-finite client is detected and weighted 0, as in the traced graph.
_FASTMATH = {"reassoc", "contract"}
_SUMS = ("loss_sum", "num_examples", "num_batches", "correct", "weighed")


def _jit(fn: Any) -> Any:
    if numba is None:  # pragma: no cover - depends on the environment
        return fn
    return numba.njit(nogil=True, fastmath=_FASTMATH, cache=False)(fn)


@_jit
def _forward(x: Any, label: int, kernel: Any, bias: Any, out: Any) -> tuple[float, int]:
    """One example's softmax probabilities (into ``out``), cross-entropy and argmax; a
    label outside the classes gives a NaN loss and NaN probabilities."""
    classes, features = kernel.shape
    for k in range(classes):
        total = np.float32(0.0)
        for d in range(features):
            total += x[d] * kernel[k, d]
        out[k] = total + bias[k]
    best = 0
    for k in range(1, classes):
        if out[k] > out[best]:
            best = k
    if label < 0 or label >= classes:
        out[:] = np.nan
        return np.nan, best
    top = out[best]
    picked = out[label] - top
    norm = np.float32(0.0)
    for k in range(classes):
        out[k] = np.exp(out[k] - top)
        norm += out[k]
    loss = np.log(norm) - picked
    for k in range(classes):
        out[k] = out[k] / norm
    return loss, best


@_jit
def _train_client(
    x: Any,
    labels: Any,
    indices: Any,
    mask: Any,
    num_steps: int,
    kernel: Any,
    bias: Any,
    rate: float,
    proximal: float,
    sums: Any,
) -> None:
    """One client's local SGD on the transposed ``kernel`` [classes, features] and
    ``bias``, in place; ``sums`` gets :data:`_SUMS`."""
    classes, features = kernel.shape
    slots = indices.shape[1]
    start_kernel, start_bias = kernel.copy(), bias.copy()
    errors = np.zeros((slots, classes), np.float32)
    step_sum = np.zeros(features, np.float32)
    for step in range(num_steps):
        count = np.float32(0.0)
        for i in range(slots):
            count += mask[step, i]
        if count == 0:
            continue
        divisor = max(count, np.float32(1.0))
        loss_total = np.float32(0.0)
        correct = np.float32(0.0)
        for i in range(slots):
            weight = mask[step, i]
            errors[i, :] = 0
            if weight == 0:
                continue
            row = indices[step, i]
            label = labels[row]
            loss, best = _forward(x[row], label, kernel, bias, errors[i])
            loss_total += loss * weight
            if best == label:
                correct += weight
            if 0 <= label < classes:
                errors[i, label] -= 1
            for k in range(classes):
                errors[i, k] = errors[i, k] * weight / divisor
        for k in range(classes):
            step_sum[:] = 0
            bias_gradient = np.float32(0.0)
            for i in range(slots):
                if mask[step, i] != 0:
                    error = errors[i, k]
                    bias_gradient += error
                    example = x[indices[step, i]]
                    for d in range(features):
                        step_sum[d] += error * example[d]
            if proximal != 0:
                for d in range(features):
                    step_sum[d] += proximal * (kernel[k, d] - start_kernel[k, d])
                bias_gradient += proximal * (bias[k] - start_bias[k])
            for d in range(features):
                kernel[k, d] -= rate * step_sum[d]
            bias[k] -= rate * bias_gradient
        sums[0] += loss_total / divisor * count
        sums[1] += count
        sums[2] += 1
        sums[3] += correct
        sums[4] += count


@_jit
def _train_group(
    x: Any,
    labels: Any,
    indices: Any,
    mask: Any,
    num_steps: int,
    kernel: Any,
    bias: Any,
    rate: float,
    proximal: float,
) -> tuple[Any, Any, Any, Any]:
    """Every client's deltas (``start - trained``: kernels transposed), finiteness and
    :data:`_SUMS`, from the shared start ``kernel`` (transposed) and ``bias``."""
    clients = x.shape[0]
    kernel_deltas = np.empty((clients, *kernel.shape), np.float32)
    bias_deltas = np.empty((clients, bias.shape[0]), np.float32)
    finite = np.ones(clients, np.bool_)
    sums = np.zeros((clients, len(_SUMS)), np.float32)
    for c in range(clients):
        trained_kernel, trained_bias = kernel.copy(), bias.copy()
        _train_client(
            x[c], labels[c], indices[c], mask[c], num_steps,
            trained_kernel, trained_bias, rate, proximal, sums[c],
        )  # fmt: skip
        kernel_deltas[c] = kernel - trained_kernel
        bias_deltas[c] = bias - trained_bias
        finite[c] = np.isfinite(kernel_deltas[c]).all() and np.isfinite(bias_deltas[c]).all()
    return kernel_deltas, bias_deltas, finite, sums


def _fold_graph(
    aggregator: ModelAggregator,
    client_weighting: str,
    params: dict[str, Any],
    deltas: list[Any],
    finite: Any,
    num_examples: Any,
) -> Partial:
    return fold_clients(aggregator, params, deltas, finite, num_examples, client_weighting)


def softmax_layer(model: FunctionalModel) -> bool:
    """Whether ``model`` is a softmax regression this loop computes: float32 layers,
    an optional ``Flatten``/``Reshape`` to a vector, a ``Dense`` layer with a bias and
    no regularizer, one softmax (its activation or a ``Softmax`` layer) unless the loss
    takes logits, sparse categorical cross-entropy, no metric but the default accuracy."""
    layers = list(model.model.layers)
    if layers and isinstance(layers[0], keras.layers.Flatten | keras.layers.Reshape):
        if len(layers[0].output.shape) != 2:
            return False
        layers = layers[1:]
    if not layers or type(layers[0]) is not keras.layers.Dense:
        return False
    dense, rest = layers[0], layers[1:]
    activation = getattr(dense.activation, "__name__", None)
    softmaxes = (activation == "softmax") + len(rest)
    loss = model.loss
    plain = (
        dense.use_bias
        and activation in ("linear", "softmax")
        and not any(isinstance(layer, keras.layers.Dense) and layer.lora_enabled for layer in layers)
        and all(r is None for r in (dense.kernel_regularizer, dense.bias_regularizer))
        and dense.activity_regularizer is None
        and all(type(layer) is keras.layers.Softmax and layer.axis == -1 for layer in rest)
        and all(w.dtype == "float32" for w in model.model.weights)
        and not model.model.non_trainable_weights
        and model.model.compute_dtype == "float32"
    )
    loss_fits = (
        type(loss) is keras.losses.SparseCategoricalCrossentropy
        and loss._fn_kwargs == {
            "from_logits": loss._fn_kwargs.get("from_logits"),
            "ignore_class": None,
            "axis": -1,
        }
        and softmaxes == (0 if loss._fn_kwargs["from_logits"] else 1)
    )
    metrics_fit = all(
        type(metric.metric) is keras.metrics.SparseCategoricalAccuracy for metric in model.metrics
    )
    return bool(plain and loss_fits and metrics_fit and len(model.metrics) <= 1)


def softmax_group_update(
    model: FunctionalModel,
    optimizer: Optimizer,
    proximal_strength: float,
    client_weighting: str,
    aggregator: ModelAggregator,
) -> SoftmaxGroupUpdate | None:
    """The group update of :func:`~programlogic.learning._client_update.train_group_graph`
    with these arguments as a Numba loop, or None where it does not apply (no Numba, a
    model :func:`softmax_layer` rejects, a client optimizer other than momentum-free SGD)."""
    if numba is None or not softmax_layer(model):
        return None
    if type(optimizer) is not SGD or optimizer.momentum != 0.0:
        return None
    return SoftmaxGroupUpdate(
        model, optimizer.learning_rate, proximal_strength, client_weighting, aggregator
    )


class SoftmaxGroupUpdate:
    """A group's local training on a softmax regression, called like the compiled group
    function: ``(trainable, non_trainable, group, params) -> (partial, finite, sums)``."""

    def __init__(
        self,
        model: FunctionalModel,
        learning_rate: float,
        proximal_strength: float,
        client_weighting: str,
        aggregator: ModelAggregator,
    ) -> None:
        self._rate = np.float32(learning_rate)
        self._proximal = np.float32(proximal_strength)
        self._metric_names = [name for metric in model.metrics for name in metric.state_names()]
        self._fold = CompiledFunction(
            functools.partial(_fold_graph, aggregator, client_weighting)
        )

    def __call__(
        self, trainable: list[Any], non_trainable: list[Any], group: ClientGroup, params: Any
    ) -> tuple[Partial, np.ndarray, dict[str, np.ndarray]]:
        kernel, bias = trainable
        clients, examples = group.x.shape[:2]
        x = np.ascontiguousarray(group.x.reshape(clients, examples, -1), dtype=np.float32)
        labels = np.asarray(group.y).reshape(clients, examples).astype(np.int64)
        filled = np.flatnonzero((group.mask > 0).any(axis=(0, 2)))
        num_steps = int(filled[-1]) + 1 if len(filled) else 0
        kernel_deltas, bias_deltas, finite, client_sums = _train_group(
            x,
            labels,
            np.ascontiguousarray(group.indices, dtype=np.int64),
            np.ascontiguousarray(group.mask, dtype=np.float32),
            num_steps,
            np.ascontiguousarray(np.asarray(kernel, np.float32).T),
            np.asarray(bias, np.float32).copy(),
            self._rate,
            self._proximal,
        )
        deltas = [np.ascontiguousarray(kernel_deltas.transpose(0, 2, 1)), bias_deltas]
        named = dict(zip(_SUMS, client_sums.T, strict=True))
        sums = {name: named[name] for name in _SUMS[:3]}
        if self._metric_names:
            sums.update(zip(self._metric_names, (named["correct"], named["weighed"]), strict=True))
        partial = self._fold(params, deltas, finite, sums["num_examples"])
        return tf.nest.map_structure(np.asarray, partial), finite, sums
