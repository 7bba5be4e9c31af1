"""The compiled client update: a softmax regression's local SGD as a C loop.

A softmax regression (an optional flatten, one dense layer with a bias, a softmax,
sparse categorical cross-entropy) trained with plain SGD spends each local step on two
tiny products: 5 examples against a 784x10 kernel in the EMNIST tutorial. Compiled
TensorFlow pays a fixed cost for every operation of such a step, so the step's latency,
not its FLOPs, bounds a round (``bench/studies/roofline.py``). Here a group's clients
train in the C loop of the extension ``_softmax_kernel`` (``_softmax_loop.c``, built at
install), one client after another on its transposed kernel, which stays in the core's
cache. It computes what :func:`~programlogic.learning.client_update.traced.train_group_graph`
traces for such a model (the masked mean loss, the accuracy sums, FedProx's proximal
term, an empty batch leaving the weights alone), equal to float32 rounding.

Two builds of the loop are installed. The default one is compiled for AVX-512, for AVX2
with FMA and for the baseline instruction set, the loader picking the widest the CPU
has, with its sums reassociated so that they vectorize: its bits are the same from run
to run on one CPU type and may differ in the last places across CPU types. The baseline
build (``_softmax_kernel_baseline``, ``client_update="portable"``) adds in a fixed order
(eight running sums in a dot product, so that even the baseline instruction set's
vectors help), without fused multiply-adds, with its own ``exp`` and ``log`` in double
precision from IEEE-754's basic operations, so that it gives the same bits on any CPU:
a local step of the tutorial's 10-client round took 53 us against the default build's
22-24 us and the traced update's 78 us (``python bench/fedavg_step_cost.py --clients 10
--client-update portable``, 2026-12-07). With the
:class:`~programlogic.learning.aggregators.Mean` aggregator the group's deltas are
summed here too (the portable update in client order, one client at a time); another
aggregator folds them with XLA, whose bits may differ across CPU types.
"""

from __future__ import annotations

import functools
import importlib
import math
from types import ModuleType
from typing import Any

import numpy as np

from programlogic.learning._grouped import shared_compiled
from programlogic.learning._tensorflow import keras, tf
from programlogic.learning.aggregators import Mean, ModelAggregator, Partial, fold_clients
from programlogic.learning.keras_model import ClientGroup, FunctionalModel
from programlogic.learning.optimizers import SGD, Optimizer

__all__ = ["SoftmaxGroupUpdate", "load_kernel", "unsupported"]

KERNELS = {False: "_softmax_kernel", True: "_softmax_kernel_baseline"}
"""The extension modules of this package by ``portable``: the default and baseline builds."""


def load_kernel(portable: bool = False) -> ModuleType:
    """The extension module of the loop (``portable``: its baseline build), whose
    ``train_group`` trains a group of clients on plain arrays.

    Raises ImportError where the install did not build it (no C compiler), naming it.
    """
    name = f"{__package__}.{KERNELS[portable]}"
    try:
        return importlib.import_module(name)
    except ImportError as error:
        raise ImportError(
            f"{name} is not installed: programlogic was installed without building its C "
            f"extensions (no C compiler?); reinstall it where a C compiler is found ({error})"
        ) from error


def unsupported(model: FunctionalModel, optimizer: Optimizer) -> str | None:
    """Why the loop cannot train ``model`` with the client ``optimizer``, or None if it can.

    It trains float32 layers: an optional ``Flatten``/``Reshape`` to a vector, a
    ``Dense`` layer with a bias and no regularizer, one softmax (its activation or a
    ``Softmax`` layer) unless the loss takes logits; sparse categorical cross-entropy;
    no metric but sparse categorical accuracy; plain SGD (no momentum).
    """
    if type(optimizer) is not SGD or optimizer.momentum != 0.0:
        name = "SGD with momentum" if type(optimizer) is SGD else type(optimizer).__name__
        return f"its client optimizer is {name}, not SGD without momentum"
    reason = _not_softmax_regression(model)
    return None if reason is None else f"it is not a softmax regression the loop trains: {reason}"


def _not_softmax_regression(model: FunctionalModel) -> str | None:
    layers = list(model.model.layers)
    if layers and isinstance(layers[0], keras.layers.Flatten | keras.layers.Reshape):
        # A channels-first Flatten moves the channels first: not the examples' own order.
        if getattr(layers[0], "data_format", "channels_last") != "channels_last":
            return "its Flatten layer is channels-first"
        if len(layers[0].output.shape) != 2:
            return f"its {type(layers[0]).__name__} layer does not make a vector an example"
        layers = layers[1:]
    if not layers or type(layers[0]) is not keras.layers.Dense:
        return "its first layer (past a flatten) is no Dense layer"
    dense, rest = layers[0], layers[1:]
    activation = getattr(dense.activation, "__name__", None)
    if activation not in ("linear", "softmax"):
        return f"its Dense layer's activation is {activation}, not softmax or linear"
    if any(type(layer) is not keras.layers.Softmax or layer.axis != -1 for layer in rest):
        return "it has layers after its Dense layer other than one Softmax over the last axis"
    if not dense.use_bias or dense.lora_enabled:
        return "its Dense layer has no bias or has LoRA enabled"
    regularizers = (dense.kernel_regularizer, dense.bias_regularizer, dense.activity_regularizer)
    if any(regularizer is not None for regularizer in regularizers):
        return "its Dense layer has a regularizer"
    weights = model.model.weights
    if model.model.compute_dtype != "float32" or any(w.dtype != "float32" for w in weights):
        return "it does not compute in float32"
    if model.model.non_trainable_weights:
        return "it has non-trainable weights"
    loss = model.loss
    if type(loss) is not keras.losses.SparseCategoricalCrossentropy:
        return f"its loss is {type(loss).__name__}, not SparseCategoricalCrossentropy"
    logits = loss._fn_kwargs.get("from_logits")
    if loss._fn_kwargs != {"from_logits": logits, "ignore_class": None, "axis": -1}:
        return "its loss sets ignore_class or an axis other than the last"
    softmaxes = (activation == "softmax") + len(rest)
    if softmaxes != (0 if logits else 1):
        return (
            f"it applies {softmaxes} softmax(es) to a loss "
            f"{'on logits' if logits else 'on probabilities'}"
        )
    if len(model.metrics) > 1 or any(
        type(metric.metric) is not keras.metrics.SparseCategoricalAccuracy
        for metric in model.metrics
    ):
        return "its metrics are other than one SparseCategoricalAccuracy"
    return None


class SoftmaxGroupUpdate:
    """A group's local training on a softmax regression, called like the traced group
    function: ``(trainable, non_trainable, group, params) -> (partial, finite, sums)``.

    ``portable`` runs the baseline build and sums a :class:`Mean`'s deltas client by
    client (see the module's docstring). Raises ImportError where the build is missing.
    """

    def __init__(
        self,
        model: FunctionalModel,
        learning_rate: float,
        proximal_strength: float,
        client_weighting: str,
        aggregator: ModelAggregator,
        *,
        portable: bool = False,
    ) -> None:
        self._kernel = load_kernel(portable)
        self.portable = portable
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
        kernel_deltas, bias_deltas, finite, client_sums = self._kernel.train_group(
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
        named = dict(zip(self._kernel.SUMS, client_sums.T, strict=True))
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
            kept = kept.astype(np.float64)
            if self.portable:
                # BLAS picks its kernel, and with it its order of additions, by CPU type.
                total = np.zeros(kept.shape[1:])
                for weight, client in zip(weights, kept, strict=True):
                    total += weight * client
                sums.append(total)
            else:
                sums.append(np.tensordot(weights, kept, axes=1))
        return {"sum": sums, "weight": weights.sum()}
