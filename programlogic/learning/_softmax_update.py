"""The client update of a softmax regression as a compiled loop, when the model is one.

A softmax regression (an optional flatten, one dense layer with a bias, a softmax,
sparse categorical cross-entropy) trained with plain SGD spends each local step on two
tiny products: 5 examples against a 784x10 kernel in the EMNIST tutorial. Compiled
TensorFlow pays a fixed cost for every operation of such a step, so the step's latency,
not its FLOPs, bounds a round (``bench/roofline.py``). Here a group's clients train in
the C loop of the extension ``_softmax_kernel`` (built at install), one client after
another on its transposed kernel, which stays in the core's cache. It computes what
:func:`~programlogic.learning._client_update.train_group_graph` traces for such a model
(the masked mean loss, the accuracy sums, FedProx's proximal term, an empty batch
leaving the weights alone), equal to float32 rounding; the group's deltas are folded by
the same aggregator code, compiled with XLA.

:func:`softmax_group_update` says whether a process's model and client optimizer are
one it runs; where the extension was not built, none is, and the traced graph runs.
"""

from __future__ import annotations

import functools
import logging
import math
from typing import Any

import numpy as np

from programlogic.learning._grouped import shared_compiled
from programlogic.learning._tensorflow import keras, tf
from programlogic.learning.aggregators import Mean, ModelAggregator, Partial, fold_clients
from programlogic.learning.keras_model import ClientGroup, FunctionalModel
from programlogic.learning.optimizers import SGD, Optimizer

try:
    from programlogic.learning import _softmax_kernel
except ImportError:  # pragma: no cover - an install that did not build the extension
    _softmax_kernel = None

__all__ = ["SoftmaxGroupUpdate", "softmax_group_update", "softmax_layer"]

_logger = logging.getLogger(__name__)


def softmax_layer(model: FunctionalModel) -> bool:
    """Whether ``model`` is a softmax regression the compiled loop trains: float32 layers,
    an optional ``Flatten``/``Reshape`` to a vector, a ``Dense`` layer with a bias and
    no regularizer, one softmax (its activation or a ``Softmax`` layer) unless the loss
    takes logits, sparse categorical cross-entropy, no metric but the default accuracy."""
    layers = list(model.model.layers)
    if layers and isinstance(layers[0], keras.layers.Flatten | keras.layers.Reshape):
        # A channels-first Flatten moves the channels first: not the examples' own order.
        flat = getattr(layers[0], "data_format", "channels_last") == "channels_last"
        if len(layers[0].output.shape) != 2 or not flat:
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
        and not dense.lora_enabled
        and dense.kernel_regularizer is None
        and dense.bias_regularizer is None
        and dense.activity_regularizer is None
        and all(type(layer) is keras.layers.Softmax and layer.axis == -1 for layer in rest)
        and all(w.dtype == "float32" for w in model.model.weights)
        and not model.model.non_trainable_weights
        and model.model.compute_dtype == "float32"
    )
    loss_fits = (
        type(loss) is keras.losses.SparseCategoricalCrossentropy
        and loss._fn_kwargs
        == {
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
    with these arguments as the compiled loop, or None where it does not apply (the
    extension not built, a model :func:`softmax_layer` rejects, a client optimizer
    other than SGD without momentum)."""
    plain_sgd = type(optimizer) is SGD and optimizer.momentum == 0.0
    if not (plain_sgd and softmax_layer(model)):
        return None
    if _softmax_kernel is None:
        _logger.info(
            "programlogic.learning._softmax_kernel was not built (no C compiler at "
            "install?): the softmax regression trains in the slower traced graph"
        )
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
        self._mean = aggregator if type(aggregator) is Mean else None
        self._uniform = client_weighting == "uniform"
        # Called with (params, deltas, finite, num_examples).
        self._fold = shared_compiled(
            (fold_clients, aggregator, client_weighting),
            functools.partial(fold_clients, aggregator, client_weighting=client_weighting),
        )

    def __call__(
        self, trainable: list[Any], non_trainable: list[Any], group: ClientGroup, params: Any
    ) -> tuple[Partial, np.ndarray, dict[str, np.ndarray]]:
        kernel, bias = trainable
        clients, examples = group.x.shape[:2]
        x = np.ascontiguousarray(group.x.reshape(clients, examples, -1), dtype=np.float32)
        if math.prod(group.y.shape[2:]) != 1:
            raise ValueError(
                "a softmax regression with sparse categorical cross-entropy takes one class "
                f"index an example, got labels of shape {group.y.shape[2:]} each"
            )
        labels = group.y.reshape(clients, examples).astype(np.int64)
        filled = np.flatnonzero((group.mask > 0).any(axis=(0, 2)))
        num_steps = int(filled[-1]) + 1 if len(filled) else 0
        kernel_deltas, bias_deltas, finite, client_sums = _softmax_kernel.train_group(
            x,
            labels,
            np.ascontiguousarray(group.indices, dtype=np.int64),
            np.ascontiguousarray(group.mask, dtype=np.float32),
            num_steps,
            np.ascontiguousarray(np.asarray(kernel, np.float32).T),
            np.ascontiguousarray(bias, dtype=np.float32),
            self._rate,
            self._proximal,
        )
        deltas = [kernel_deltas, bias_deltas]
        named = dict(zip(_softmax_kernel.SUMS, client_sums.T, strict=True))
        sums = {name: named[name] for name in ("loss_sum", "num_examples", "num_batches")}
        if self._metric_names:
            sums.update(zip(self._metric_names, (named["correct"], named["weighed"]), strict=True))
        if self._mean is not None:
            return self._fold_mean(deltas, finite, sums["num_examples"]), finite, sums
        partial = self._fold(params, deltas, finite, sums["num_examples"])
        return tf.nest.map_structure(np.asarray, partial), finite, sums

    def _fold_mean(self, deltas: list[np.ndarray], finite: np.ndarray, examples: Any) -> Partial:
        """:func:`~programlogic.learning.aggregators.fold_clients` into a :class:`Mean`,
        in NumPy: the compiled fold's fixed cost was measured at a tenth of a group's."""
        weights = np.asarray(examples, np.float64)
        if self._uniform or not self._mean.weighted:
            weights = (weights > 0).astype(np.float64)
        weights = np.where(finite, weights, 0.0)
        sums = []
        for delta in deltas:
            kept = np.where(finite.reshape(-1, *[1] * (delta.ndim - 1)), delta, 0)
            sums.append(np.tensordot(weights, kept.astype(np.float64), axes=1))
        return {"sum": sums, "weight": weights.sum()}
