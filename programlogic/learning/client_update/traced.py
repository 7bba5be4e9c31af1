"""The traced client update: local training of a group of clients as one XLA call.

:func:`train_group_graph` is the ``client_update="traced"`` group update of
:class:`~programlogic.learning.fed_avg.WeightedFedAvg` and FedProx: any Keras model,
any client optimizer, the group's clients vectorized with ``tf.vectorized_map`` over a
``tf.while_loop`` of their steps, compiled with XLA. :func:`batch_gradients` and
:func:`training_zeros` are the steps FedSGD's graph shares.
"""

from __future__ import annotations

import math
from typing import Any

from programlogic.learning._tensorflow import tf
from programlogic.learning.aggregators import ModelAggregator, Partial, fold_clients
from programlogic.learning.keras_model import ClientGroup, FunctionalModel
from programlogic.learning.optimizers import Optimizer

__all__ = ["batch_gradients", "train_group_graph", "training_zeros"]


def batch_gradients(
    model: FunctionalModel,
    trainable: list[Any],
    non_trainable: list[Any],
    x: Any,
    y: Any,
    indices: Any,
    mask: Any,
) -> tuple[list[Any], list[Any], dict[str, Any]]:
    """A training batch, traced: the gradients of its loss with respect to ``trainable``
    (zeros for a weight the loss does not reach), the non-trainable weights after it, and
    its sums (:meth:`FunctionalModel.batch`'s, with ``num_batches``: 1 if the batch holds
    an example, 0 for padding)."""
    with tf.GradientTape() as tape:
        tape.watch(trainable)
        loss, new_non_trainable, sums = model.batch(
            trainable, non_trainable, x, y, indices, mask, training=True
        )
    gradients = [
        tf.zeros_like(w) if g is None else g
        for w, g in zip(trainable, tape.gradient(loss, trainable), strict=True)
    ]
    sums["num_batches"] = tf.cast(sums["num_examples"] > 0, tf.float32)
    return gradients, new_non_trainable, sums


def training_zeros(model: FunctionalModel) -> dict[str, Any]:
    """Zero sums of training batches by name, traced: ``loss_sum``, ``num_examples``,
    ``num_batches`` and each metric's."""
    return {
        **{name: tf.constant(0.0) for name in ("loss_sum", "num_examples", "num_batches")},
        **model.metric_zeros(),
    }


GATHER_AHEAD_BYTES = 32 * 2**20
"""The most bytes of a group's batches that :func:`train_group_graph` gathers before its
first step, all at once, rather than batch by batch inside its loop.

Why: inside the compiled loop a gather was measured to cost some 25 us a step whatever
the group's size, a third of a 5-client step of the tutorial's model, while the copy
ahead takes 8.8 MB for such a group. Check it with ``python bench/fedavg_step_cost.py
--gather-ahead-bytes 0`` against the default: the cost of a step with and without.
Above the bound (large groups of large examples) the copy's memory would outweigh it.
"""


def _gathered_ahead(group: ClientGroup) -> bool:
    """Whether ``group``'s batches, copied out of its examples, fit in
    :data:`GATHER_AHEAD_BYTES`."""
    example_bytes = sum(math.prod(part.shape[2:]) * part.dtype.size for part in (group.x, group.y))
    return math.prod(group.indices.shape) * example_bytes <= GATHER_AHEAD_BYTES


def _steps_with_data(mask: Any) -> Any:
    """How many of a group's batches its clients train on: up to the last that any of
    them fills (those after it are padding, and would change nothing)."""
    filled = tf.reduce_any(mask > 0, axis=[0, 2])
    return tf.reduce_max(tf.where(filled, tf.range(1, tf.shape(filled)[0] + 1), 0))


def train_group_graph(
    model: FunctionalModel,
    optimizer: Optimizer,
    proximal_strength: float,
    client_weighting: str,
    aggregator: ModelAggregator,
    trainable: list[Any],
    non_trainable: list[Any],
    group: ClientGroup,
    params: dict[str, Any],
) -> tuple[Partial, Any, dict[str, Any]]:
    """A group's aggregation partial, and each client's finiteness and sums.

    A nonzero ``proximal_strength`` adds ``proximal_strength * (w - w_server)`` to each
    client gradient (FedProx); ``client_weighting`` and ``aggregator`` (with its round
    ``params``) as in :func:`~programlogic.learning.aggregators.fold_clients`.
    """

    gathered_ahead = _gathered_ahead(group)
    num_steps = _steps_with_data(group.mask)

    def train_client(data: tuple[Any, ...]) -> tuple[list[Any], Any, dict[str, Any]]:
        x, y, batch_indices, mask, random_states = data
        start = list(trainable)
        if gathered_ahead:
            x, y = tf.gather(x, batch_indices), tf.gather(y, batch_indices)

        def step(index: Any, carry: tuple[Any, ...]) -> tuple[Any, ...]:
            weights, others, optimizer_state, sums = carry
            batch = (x[index], y[index], None) if gathered_ahead else (x, y, batch_indices[index])
            gradients, new_others, batch_sums = batch_gradients(
                model, weights, others, *batch, mask[index]
            )
            if proximal_strength:
                gradients = [
                    g + proximal_strength * (w - w0)
                    for g, w, w0 in zip(gradients, weights, start, strict=True)
                ]
            new_state, new_weights = optimizer.next(optimizer_state, weights, gradients)
            has_data = batch_sums["num_examples"] > 0

            def keep_if_empty(new: Any, old: Any) -> Any:
                return tf.where(has_data, tf.cast(new, tf.convert_to_tensor(old).dtype), old)

            return (
                tf.nest.map_structure(keep_if_empty, new_weights, weights),
                tf.nest.map_structure(keep_if_empty, new_others, others),
                tf.nest.map_structure(keep_if_empty, new_state, optimizer_state),
                {name: sums[name] + batch_sums[name] for name in sums},
            )

        carry = (
            start,
            model.seeded(non_trainable, random_states),
            tf.nest.map_structure(tf.convert_to_tensor, optimizer.initialize(start)),
            training_zeros(model),
        )
        index = tf.constant(0)
        _, (trained, _, _, sums) = tf.while_loop(
            lambda i, _: i < num_steps,
            lambda i, c: (i + 1, step(i, c)),
            (index, carry),
        )
        delta = [before - after for before, after in zip(start, trained, strict=True)]
        finite = tf.reduce_all([tf.reduce_all(tf.math.is_finite(d)) for d in delta])
        return delta, finite, sums

    deltas, finite, sums = tf.vectorized_map(train_client, tuple(group))
    partial = fold_clients(
        aggregator, params, deltas, finite, sums["num_examples"], client_weighting
    )
    return partial, finite, sums
