"""A Keras model as pure functions of its weights, for compiled federated computations.

Federated algorithms need the model as a function ``(weights, batch) -> outputs`` so that
many clients, each with its own copy of the weights, can train inside one compiled
TensorFlow call. :class:`FunctionalModel` builds the Keras model once and runs it with
Keras 3's ``stateless_call``; weights travel as plain lists of NumPy arrays.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import numpy as np

from managers.validation import check_callable
from programlogic.datasets.arrays import ClientArrays
from programlogic.datasets.preprocessing import BatchOrder
from programlogic.learning._tensorflow import GRAPHS, keras, tf
from programlogic.learning.metrics import SummableMetric, as_loss, as_metrics

__all__ = [
    "ClientGroup",
    "FunctionalModel",
    "ModelWeights",
    "bucket",
    "stack_clients",
]

ModelWeights = dict[str, list[np.ndarray]]
"""``{"trainable": [...], "non_trainable": [...]}``: a model's weights in Keras order."""

SUPPORTED_METRICS = ("sparse_categorical_accuracy",)
"""A metric name :class:`FunctionalModel` computes besides the loss (any summable Keras
metric works: see :class:`~programlogic.learning.metrics.SummableMetric`)."""

DEFAULT_LOSS = keras.losses.SparseCategoricalCrossentropy()
"""The loss of the built-in processes when none is given.

One object, kept one through pickling, so that processes built with it can share their
compiled functions (a loss object is only known to compute the same as itself).
"""


class FunctionalModel:
    """A Keras model, its loss and its metrics, as pure TensorFlow functions of the weights.

    ``model_fn()`` must return a built ``keras.Model`` (give it an ``Input`` or call
    ``build``); it is called once, here. ``loss`` is a Keras loss object
    (``keras.losses.SparseCategoricalCrossentropy()``) or the name of one (``"mse"``); the
    loss of a batch is the mean of its per-example losses over the examples its mask
    marks, plus the model's regularization losses. ``metrics`` are Keras metrics whose
    variables sum, or their names (see :func:`~programlogic.learning.metrics.as_metrics`).

    Layers that draw random numbers in training (``Dropout``, ``GaussianNoise``) keep the
    state of their ``keras.random.SeedGenerator`` among the non-trainable weights, at
    the indices ``random_slots``. The built-in processes give each client states of its
    own (:meth:`random_states`, put in place by :meth:`seeded`); the weights a process
    keeps hold zeros there (:meth:`initial_weights`).

    It pickles as ``model_fn``, the loss, the metrics and the model's current weights
    (so ``model_fn`` must pickle too: a module-level function or a ``functools.partial``
    of one); unpickling calls ``model_fn`` again and sets those weights, so ``model_fn``
    must build the same model every time it is called.
    """

    def __init__(
        self,
        model_fn: Callable[[], Any],
        loss: Any,
        metrics: Sequence[str | SummableMetric | Any] = ("sparse_categorical_accuracy",),
    ) -> None:
        check_callable("model_fn", model_fn)
        with GRAPHS.exclusive():
            model = model_fn()
        if not isinstance(model, keras.Model):
            raise TypeError(f"model_fn must return a keras.Model, got {type(model).__name__}")
        if not model.built or not model.weights:
            raise ValueError(
                "model_fn must return a built model with weights: start it with "
                "keras.Input(shape) or call model.build(input_shape)"
            )
        loss = as_loss(loss)
        self.metrics = as_metrics(metrics)
        self.model_fn = model_fn
        self.model = model
        self.loss = loss
        self.input_shape = tuple(model.inputs[0].shape[1:]) if model.inputs else None
        self.random_slots = _seed_generator_slots(model)

    def __getstate__(self) -> dict[str, Any]:
        return {
            "model_fn": self.model_fn,
            "loss": None if self.loss is DEFAULT_LOSS else self.loss,
            "metrics": self.metrics,
            "weights": [np.array(v.numpy()) for v in self.model.weights],
        }

    def __setstate__(self, state: dict[str, Any]) -> None:
        loss = DEFAULT_LOSS if state["loss"] is None else state["loss"]
        self.__init__(state["model_fn"], loss, state["metrics"])
        for variable, value in zip(self.model.weights, state["weights"], strict=True):
            variable.assign(value)

    def describe(self) -> dict[str, Any]:
        """The model's input shape, layers, loss and metrics, as a JSON-able dict.

        Each layer by its class name, the shapes and dtypes of its weights, its dtype
        policy and, where it has them, its activation (by name), padding, strides, pool
        size, rate (dropout's) and stddev (noise's); a nested model by its own layers.
        Made of values that do not change across Keras versions (no ``to_json``, no
        generated layer names).
        """
        loss: dict[str, Any] = {"class": type(self.loss).__name__}
        if isinstance(getattr(self.loss, "from_logits", None), bool):
            loss["from_logits"] = self.loss.from_logits
        loss.update(_loss_settings(self.loss))
        return {
            "input_shape": None if self.input_shape is None else _json_value(self.input_shape),
            "layers": [_describe_layer(layer) for layer in self.model.layers],
            "loss": loss,
            "metrics": [metric.describe() for metric in self.metrics],
        }

    def initial_weights(self) -> ModelWeights:
        """The weights the model was built with, as NumPy arrays, but seed-generator
        states zero: Keras seeds them at random when none is given, and clients draw
        from their own states (:meth:`random_states`), never these."""
        non_trainable = [np.array(v.numpy()) for v in self.model.non_trainable_variables]
        for slot in self.random_slots:
            non_trainable[slot] = np.zeros_like(non_trainable[slot])
        return {
            "trainable": [np.array(v.numpy()) for v in self.model.trainable_variables],
            "non_trainable": non_trainable,
        }

    def check_weights(self, weights: Any) -> ModelWeights:
        """``weights`` as a :data:`ModelWeights` of this model, or a clear error."""
        if not isinstance(weights, dict) or set(weights) != {"trainable", "non_trainable"}:
            raise TypeError(
                "model weights must be a dict with the keys 'trainable' and 'non_trainable', "
                f"got {type(weights).__name__}"
            )
        checked: ModelWeights = {}
        for part, variables in (
            ("trainable", self.model.trainable_variables),
            ("non_trainable", self.model.non_trainable_variables),
        ):
            arrays = list(weights[part])
            if len(arrays) != len(variables):
                raise ValueError(
                    f"model weights {part!r} holds {len(arrays)} arrays, the model has "
                    f"{len(variables)}"
                )
            converted = []
            for index, (array, variable) in enumerate(zip(arrays, variables, strict=True)):
                array = np.asarray(array)
                if array.shape != tuple(variable.shape):
                    raise ValueError(
                        f"model weights {part}[{index}] ({variable.path}) has shape "
                        f"{array.shape}, the model expects {tuple(variable.shape)}"
                    )
                converted.append(array.astype(variable.dtype, copy=False))
            checked[part] = converted
        return checked

    def batch(
        self,
        trainable: Sequence[Any],
        non_trainable: Sequence[Any],
        x: Any,
        y: Any,
        indices: Any,
        mask: Any,
        *,
        training: bool,
    ) -> tuple[Any, list[Any], dict[str, Any]]:
        """One batch of a client, traced into the caller's TensorFlow graph.

        ``x`` and ``y`` are the client's examples, ``indices`` the ones that fill the
        batch (None: ``x`` and ``y`` are the batch's own) and ``mask`` which of its
        slots are real. Returns ``(loss, new_non_trainable, sums)``: the masked mean
        loss to differentiate, the non-trainable weights after the forward pass, and the
        sums the metrics are made of (``loss_sum``, ``num_examples``, each metric's
        variables).
        """
        if indices is not None:
            x, y = tf.gather(x, indices), tf.gather(y, indices)
        outputs, new_non_trainable, losses = self.model.stateless_call(
            list(trainable), list(non_trainable), x, training=training, return_losses=True
        )
        per_example = tf.cast(self.loss.call(y, outputs), tf.float32)
        per_example = tf.reduce_mean(tf.reshape(per_example, [tf.shape(mask)[0], -1]), axis=1)
        count = tf.reduce_sum(mask)
        loss = tf.reduce_sum(per_example * mask) / tf.maximum(count, 1.0)
        if losses:
            loss = loss + tf.add_n([tf.cast(extra, tf.float32) for extra in losses])
        sums = {"loss_sum": loss * count, "num_examples": count}
        for metric in self.metrics:
            sums.update(metric.batch_state(y, outputs, mask))
        return loss, list(new_non_trainable), sums

    def random_states(self, seed: int) -> np.ndarray:
        """The start states of the model's seed generators for one client, int64
        ``[generators, 2]``: a pure function of ``seed`` (its ``client_seed``), each
        generator's own.

        Each value is below 2**30: Keras' TensorFlow backend takes a state modulo
        2**31 - 2 before it draws, and the second value, which grows by one a draw,
        then stays unchanged by it for 2**30 draws.
        """
        states = np.zeros((len(self.random_slots), 2), dtype=np.int64)
        for index in range(len(self.random_slots)):
            digest = hashlib.sha256(f"{seed}/random/{index}".encode()).digest()
            states[index] = [
                int.from_bytes(digest[:4], "little") & _STATE_MASK,
                int.from_bytes(digest[4:8], "little") & _STATE_MASK,
            ]
        return states

    def seeded(self, non_trainable: Sequence[Any], states: Any) -> list[Any]:
        """``non_trainable`` with its seed-generator states replaced by ``states`` (one
        client's :meth:`random_states`), traced into the caller's graph."""
        seeded = list(non_trainable)
        for index, slot in enumerate(self.random_slots):
            dtype = self.model.non_trainable_variables[slot].dtype
            seeded[slot] = tf.cast(states[index], dtype)
        return seeded

    def metric_zeros(self) -> dict[str, Any]:
        """Zero metric states by their sum names, traced into the caller's graph."""
        return {name: zero for metric in self.metrics for name, zero in metric.zeros().items()}

    def metric_results(self, sums: dict[str, Any]) -> dict[str, float]:
        """Each metric, by name, finalized on summed states."""
        return {metric.name: metric.result(sums) for metric in self.metrics}


_STATE_MASK = 2**30 - 1
"""Keeps each value of a derived seed-generator state below 2**30."""


def _seed_generator_slots(model: Any) -> tuple[int, ...]:
    """Where the states of the model's seed generators are among its non-trainable
    variables, in that order."""
    states = {
        id(generator.state)
        for layer in model._flatten_layers(include_self=True, recursive=True)
        for generator in getattr(layer, "_seed_generators", ())
    }
    return tuple(
        index
        for index, variable in enumerate(model.non_trainable_variables)
        if id(variable) in states
    )


def _loss_settings(loss: Any) -> dict[str, Any]:
    """The loss's configuration values that differ from its class's defaults.

    Keras' loss wrappers leave some arguments (``Huber``'s ``delta``) out of their
    config and keep them as keyword arguments of their function: those count too.
    """

    def settings(each: Any) -> dict[str, Any]:
        found = dict(getattr(each, "_fn_kwargs", None) or {})
        found.update(each.get_config())
        return found

    try:
        default = settings(type(loss)())
    except TypeError:
        default = {}
    return {
        key: _json_value(value)
        for key, value in sorted(settings(loss).items())
        if key not in ("name", "from_logits") and default.get(key, object()) != value
    }


_LAYER_SETTINGS = ("activation", "padding", "strides", "pool_size", "rate", "stddev")
"""Layer attributes that change what a layer computes without changing its weights."""


def _describe_layer(layer: Any) -> dict[str, Any]:
    described: dict[str, Any] = {"class": type(layer).__name__}
    inner = getattr(layer, "layers", None)
    if isinstance(inner, list):
        described["layers"] = [_describe_layer(each) for each in inner]
    else:
        described["weights"] = [
            [[int(size) for size in v.shape], str(v.dtype)] for v in layer.weights
        ]
    policy = getattr(layer, "dtype_policy", None)
    if policy is not None:
        described["dtype_policy"] = str(getattr(policy, "name", policy))
    for setting in _LAYER_SETTINGS:
        value = getattr(layer, setting, None)
        if value is not None:
            described[setting] = _json_value(value)
    return described


def _json_value(value: Any) -> Any:
    """``value`` as JSON: functions by name, sequences as lists, other values as str."""
    if value is None or isinstance(value, bool | int | float | str):
        return value
    if isinstance(value, list | tuple):
        return [_json_value(each) for each in value]
    return getattr(value, "__name__", None) or type(value).__name__


def bucket(count: int) -> int:
    """The smallest size >= ``count`` among 1..8 and m * 2**e (m in 4..7), for compiled shapes.

    Padding ragged client data up to a few sizes keeps the number of compiled programs
    small while wasting under a quarter of the work.
    """
    if count <= 8:
        return max(count, 1)
    exponent = math.floor(math.log2(count)) - 2
    mantissa = math.ceil(count / 2**exponent)
    return mantissa * 2**exponent


class ClientGroup(NamedTuple):
    """A group of clients stacked for one compiled call.

    ``x`` float32 ``[group, examples, *features]`` and ``y`` ``[group, examples, ...]`` hold
    each client's examples once; ``indices`` int32 ``[group, batches, batch_size]`` say
    which example fills each batch slot, and ``mask`` (same shape, float32) which slots
    are real; ``random_states`` int64 ``[group, generators, 2]`` holds each client's
    :meth:`FunctionalModel.random_states` (zeros for padding clients). Clients are
    padded up to common, bucketed sizes and the group with empty clients up to its size,
    so that a compiled group function sees few distinct shapes (see :func:`stack_clients`).
    """

    x: np.ndarray
    y: np.ndarray
    indices: np.ndarray
    mask: np.ndarray
    random_states: np.ndarray


def stack_clients(
    examples: Sequence[ClientArrays],
    orders: Sequence[BatchOrder],
    group_size: int,
    random_states: Sequence[np.ndarray] = (),
    *,
    whole_batches: bool = False,
) -> ClientGroup:
    """The clients' ``examples``, batch ``orders`` and ``random_states`` (none: a model
    without seed generators) stacked into one :class:`ClientGroup`.

    The batches are padded to the :func:`bucket` of the most a client has, and the
    examples to the bucket of the most a client has or, with ``whole_batches``, to the
    group's batch slots (for clients whose batches hold each example at most once, as an
    evaluation's): the group's shape then depends on its batches alone.
    """
    num_generators = len(random_states[0]) if len(random_states) else 0
    first_x, first_order = examples[0].x, orders[0]
    num_batches = bucket(max(len(order.mask) for order in orders))
    if whole_batches:
        num_examples = num_batches * first_order.mask.shape[1]
    else:
        num_examples = bucket(max(len(client.y) for client in examples))
    group = ClientGroup(
        x=np.zeros((group_size, num_examples, *first_x.shape[1:]), dtype=np.float32),
        y=np.zeros((group_size, num_examples, *examples[0].y.shape[1:]), dtype=examples[0].y.dtype),
        indices=np.zeros((group_size, num_batches, *first_order.indices.shape[1:]), dtype=np.int32),
        mask=np.zeros((group_size, num_batches, *first_order.mask.shape[1:]), dtype=np.float32),
        random_states=np.zeros((group_size, num_generators, 2), dtype=np.int64),
    )
    for index, (client, order) in enumerate(zip(examples, orders, strict=True)):
        group.x[index, : len(client.y)] = client.x
        group.y[index, : len(client.y)] = client.y
        group.indices[index, : len(order.mask)] = order.indices
        group.mask[index, : len(order.mask)] = order.mask
    for index, states in enumerate(random_states):
        group.random_states[index] = states
    return group
