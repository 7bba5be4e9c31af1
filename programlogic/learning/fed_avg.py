"""Federated averaging of Keras models, with compiled and vectorized client updates."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence
from typing import Any

import anyio
import numpy as np

from programlogic.context import count_dropped_clients
from programlogic.data import ClientHandle
from programlogic.datasets.preprocessing import Preprocessing, client_seed
from programlogic.learning._grouped import (
    MAX_CLIENTS_PER_GROUP as MAX_CLIENTS_PER_GROUP,
)
from programlogic.learning._grouped import (
    GroupedProcess,
    ratio,
    training_model,
    weighted_delta_sum,
)
from programlogic.learning._grouped import (
    plan_group_size as plan_group_size,
)
from programlogic.learning._tensorflow import tf
from programlogic.learning.keras_model import ClientGroup, FunctionalModel, ModelWeights
from programlogic.learning.metrics import client_sums
from programlogic.learning.optimizers import Optimizer, as_optimizer, sgd
from programlogic.process import LearningProcessOutput
from programlogic.tasks import task_group

# MAX_CLIENTS_PER_GROUP and plan_group_size live in _grouped since FedEval shares them;
# they stay importable from here, outside the public names.
__all__ = ["WeightedFedAvg", "build_weighted_fed_avg"]


@dataclasses.dataclass
class _GroupDelta:
    """The example-weighted sum of a group's finite client deltas (float64), and its weight."""

    delta_sum: list[np.ndarray]
    weight: float


@dataclasses.dataclass
class _ClientUpdate:
    """What one client sends back: whether its delta is finite and its metric sums.

    The first client of a group also carries the group's :class:`_GroupDelta`.
    """

    finite: bool
    sums: dict[str, float]
    group: _GroupDelta | None = None


@dataclasses.dataclass
class _Totals:
    """The example-weighted sum of client deltas and the summed metrics of a round."""

    delta_sum: list[np.ndarray] | None = None
    weight: float = 0.0
    sums: dict[str, float] = dataclasses.field(default_factory=dict)
    non_finite_clients: int = 0
    dropped_clients: int = 0

    def add_client(self, update: _ClientUpdate) -> None:
        """Count a client's metric sums and whether its delta is finite (scalars only)."""
        for name, value in update.sums.items():
            self.sums[name] = self.sums.get(name, 0.0) + value
        if not update.finite:
            self.non_finite_clients += 1

    def add_group(self, group: _GroupDelta) -> None:
        """Add a group's weighted delta sum: model-sized NumPy work, for a worker thread."""
        if self.delta_sum is None:
            self.delta_sum = [np.array(total, dtype=np.float64) for total in group.delta_sum]
        else:
            for total, partial in zip(self.delta_sum, group.delta_sum, strict=True):
                np.add(total, partial, out=total)
        self.weight += group.weight


class WeightedFedAvg(GroupedProcess):
    """Federated averaging (McMahan et al.) of a Keras model, weighted by examples.

    A round broadcasts the model, trains it on each client's batches with the client
    optimizer (each client starting from a fresh optimizer state), averages the client
    deltas ``initial - trained`` weighted by the number of examples each client trained
    on, and applies the average with the server optimizer as if it were a gradient.
    A client whose delta is not finite gets weight 0 (and is counted); a round whose
    averaged update is not finite leaves the model unchanged (``finalizer/update_non_finite``).

    Client work runs through the current federated context, a group of clients at a
    time in one compiled, vectorized TensorFlow call (XLA): clients of unequal size are
    padded with masked batches. That call also sums the group's weighted deltas (in
    float64); the round adds the group sums, in group order, through the context's
    ``run`` (off the event loop), so the sum is the same whichever group finished
    first. Groups hold ``clients_per_group`` clients, or by default the round split
    evenly over the context's ``parallelism`` (at most :data:`MAX_CLIENTS_PER_GROUP` a
    group). Each client's data is preprocessed where the work runs with the seed
    ``client_seed(seed, round, client_id)``, so for a fixed configuration a seed gives
    the same model, bit for bit, across restarts. Processes built with the same
    ``model_fn``, loss object, metrics and client optimizer share one compiled function.

    The state is ``{"round", "model": {"trainable", "non_trainable"}, "server_optimizer"}``
    with NumPy arrays, which the file state manager stores losslessly. Metrics:
    ``client_work/train/{sparse_categorical_accuracy, loss, num_examples, num_batches}``
    (example-weighted over all batches of all clients, as TensorFlow Federated reports
    them), ``client_work/train/num_non_finite_clients`` and
    ``finalizer/update_non_finite``.

    Build it with :func:`build_weighted_fed_avg`.
    """

    def __init__(
        self,
        model: FunctionalModel,
        client_optimizer: Optimizer,
        server_optimizer: Optimizer,
        preprocess: Preprocessing,
        seed: int,
        clients_per_group: int | None,
    ) -> None:
        self.client_optimizer = client_optimizer
        self.server_optimizer = server_optimizer
        self.seed = seed
        super().__init__(model, preprocess, clients_per_group)

    def describe_configuration(self) -> dict[str, Any]:
        """The model and preprocessing (see ``GroupedProcess``), both optimizers'
        hyperparameters and the seed of the client shuffles, as a JSON-able dict."""
        return {
            **super().describe_configuration(),
            "client_optimizer": self.client_optimizer.describe(),
            "server_optimizer": self.server_optimizer.describe(),
            "seed": self.seed,
        }

    def initialize(self) -> dict[str, Any]:
        """The round-0 state: the model's initial weights and a fresh server optimizer."""
        weights = self.model.initial_weights()
        return {
            "round": 0,
            "model": weights,
            "server_optimizer": self.server_optimizer.initialize(weights["trainable"]),
        }

    async def next(
        self, state: dict[str, Any], clients: Sequence[ClientHandle]
    ) -> LearningProcessOutput:
        """One round of FedAvg on ``clients``, computed through the current context."""
        context, group_size = self._plan_round(clients, "a FedAvg round")
        round_num = int(state["round"]) + 1
        broadcast = (state["model"], round_num, group_size)
        totals = _Totals()
        send, receive = anyio.create_memory_object_stream[_GroupDelta](math.inf)

        def accumulate(totals: _Totals, update: _ClientUpdate) -> _Totals:
            totals.add_client(update)
            if update.group is not None:
                send.send_nowait(update.group)
            return totals

        async def add_groups() -> None:
            # One group at a time, in client order: worker threads take the calls in
            # the order given, so at most the groups computing meanwhile wait here.
            async with receive:
                async for group in receive:
                    await context.run(totals.add_group, group)

        with count_dropped_clients() as dropped:
            async with task_group() as tasks:
                tasks.start_soon(add_groups)
                async with send:
                    await context.aggregate_clients(
                        self._train_group,
                        broadcast,
                        clients,
                        accumulate,
                        totals,
                        group_size=group_size,
                    )
        totals.dropped_clients = dropped.count
        return await context.run(self._server_step, state, totals)

    def get_model_weights(self, state: dict[str, Any]) -> ModelWeights:
        """The model weights held in ``state``."""
        return state["model"]

    def set_model_weights(self, state: dict[str, Any], weights: ModelWeights) -> dict[str, Any]:
        """A state like ``state`` holding ``weights`` (checked against the model)."""
        return {**state, "model": self.model.check_weights(weights)}

    def _train_group(
        self,
        broadcast: tuple[ModelWeights, int, int],
        client_ids: Sequence[str],
        datas: Sequence[Any],
    ) -> list[_ClientUpdate]:
        weights, round_num, group_size = broadcast
        seeds = [client_seed(self.seed, round_num, client_id) for client_id in client_ids]
        delta_sum, weight, finite, sums = self._run_group(weights, datas, seeds, group_size)
        group = _GroupDelta([total.numpy() for total in delta_sum], float(weight))
        finite = finite.numpy()
        sums = {name: value.numpy() for name, value in sums.items()}
        updates = [
            _ClientUpdate(
                finite=bool(finite[index]),
                sums=client_sums(sums, index),
            )
            for index in range(len(client_ids))
        ]
        updates[0].group = group
        return updates

    def _group_graph(self) -> tuple[Callable[..., Any], tuple[Any, ...]]:
        return _train_group_graph, (self.client_optimizer, 0.0, "num_examples")

    def _server_step(self, state: dict[str, Any], totals: _Totals) -> LearningProcessOutput:
        weights = state["model"]
        optimizer_state = state["server_optimizer"]
        trainable = weights["trainable"]
        update_non_finite = 0
        if totals.weight > 0 and totals.delta_sum is not None:
            mean_delta = [
                (total / totals.weight).astype(w.dtype)
                for total, w in zip(totals.delta_sum, trainable, strict=True)
            ]
            new_state, new_trainable = self.server_optimizer.next(
                optimizer_state, trainable, mean_delta
            )
            new_trainable = [
                np.asarray(w, dtype=old.dtype)
                for w, old in zip(new_trainable, trainable, strict=True)
            ]
            if all(np.isfinite(w).all() for w in new_trainable):
                trainable, optimizer_state = new_trainable, new_state
            else:
                update_non_finite = 1
        sums = totals.sums
        examples = sums.get("num_examples", 0.0)
        train: dict[str, Any] = {}
        train.update(self.model.metric_results(sums))
        train["loss"] = ratio(sums.get("loss_sum", 0.0), examples)
        train["num_examples"] = int(examples)
        train["num_batches"] = int(sums.get("num_batches", 0.0))
        train["num_non_finite_clients"] = totals.non_finite_clients
        train["num_dropped_clients"] = totals.dropped_clients
        new_state = {
            "round": int(state["round"]) + 1,
            "model": {"trainable": trainable, "non_trainable": weights["non_trainable"]},
            "server_optimizer": optimizer_state,
        }
        metrics = {
            "client_work": {"train": train},
            "finalizer": {"update_non_finite": update_non_finite},
        }
        return LearningProcessOutput(new_state, metrics)


def _train_group_graph(
    model: FunctionalModel,
    optimizer: Optimizer,
    proximal_strength: float,
    client_weighting: str,
    trainable: list[Any],
    non_trainable: list[Any],
    group: ClientGroup,
) -> tuple[list[Any], Any, Any, dict[str, Any]]:
    """A group's weighted delta sum, its weight, and each client's finiteness and sums.

    A nonzero ``proximal_strength`` adds ``proximal_strength * (w - w_server)`` to each
    client gradient (FedProx); ``client_weighting`` as in :func:`weighted_delta_sum`.
    """

    def train_client(data: tuple[Any, ...]) -> tuple[list[Any], Any, dict[str, Any]]:
        x, y, batch_indices, mask, random_states = data
        start = list(trainable)

        def step(index: Any, carry: tuple[Any, ...]) -> tuple[Any, ...]:
            weights, others, optimizer_state, sums = carry
            with tf.GradientTape() as tape:
                tape.watch(weights)
                loss, new_others, batch_sums = model.batch(
                    weights, others, x, y, batch_indices[index], mask[index], training=True
                )
            gradients = [
                tf.zeros_like(w) if g is None else g
                for w, g in zip(weights, tape.gradient(loss, weights), strict=True)
            ]
            if proximal_strength:
                gradients = [
                    g + proximal_strength * (w - w0)
                    for g, w, w0 in zip(gradients, weights, start, strict=True)
                ]
            new_state, new_weights = optimizer.next(optimizer_state, weights, gradients)
            has_data = batch_sums["num_examples"] > 0
            batch_sums["num_batches"] = tf.cast(has_data, tf.float32)

            def keep_if_empty(new: Any, old: Any) -> Any:
                return tf.where(has_data, tf.cast(new, tf.convert_to_tensor(old).dtype), old)

            return (
                tf.nest.map_structure(keep_if_empty, new_weights, weights),
                tf.nest.map_structure(keep_if_empty, new_others, others),
                tf.nest.map_structure(keep_if_empty, new_state, optimizer_state),
                {name: sums[name] + batch_sums[name] for name in sums},
            )

        initial_sums = {
            **{name: tf.constant(0.0) for name in ("loss_sum", "num_examples", "num_batches")},
            **model.metric_zeros(),
        }
        carry = (
            start,
            model.seeded(non_trainable, random_states),
            tf.nest.map_structure(tf.convert_to_tensor, optimizer.initialize(start)),
            initial_sums,
        )
        num_batches = tf.shape(mask)[0]
        index = tf.constant(0)
        _, (trained, _, _, sums) = tf.while_loop(
            lambda i, _: i < num_batches,
            lambda i, c: (i + 1, step(i, c)),
            (index, carry),
        )
        delta = [before - after for before, after in zip(start, trained, strict=True)]
        finite = tf.reduce_all([tf.reduce_all(tf.math.is_finite(d)) for d in delta])
        return delta, finite, sums

    deltas, finite, sums = tf.vectorized_map(train_client, tuple(group))
    delta_sum, weight = weighted_delta_sum(deltas, finite, sums["num_examples"], client_weighting)
    return delta_sum, weight, finite, sums


def build_weighted_fed_avg(
    model_fn: Callable[[], Any],
    client_optimizer: Optimizer | Any = None,
    server_optimizer: Optimizer | Any = None,
    *,
    loss: Any = None,
    metrics: Sequence[Any] = ("sparse_categorical_accuracy",),
    preprocess: Preprocessing | None = None,
    seed: int = 0,
    clients_per_group: int | None = None,
) -> WeightedFedAvg:
    """A :class:`WeightedFedAvg` learning process for the Keras model ``model_fn`` builds.

    - ``client_optimizer``: the local update rule (default ``sgd(0.02)``, the tutorial's);
      ``server_optimizer``: applies the averaged delta (default ``sgd(1.0)``: the new
      model is the weighted mean of the client models; ``adam``, ``yogi``, ``adagrad``
      make FedAdam, FedYogi, FedAdagrad, ``sgd`` with momentum FedAvgM). Either may be a
      Keras SGD, Adam, Adagrad or RMSprop, converted by
      :func:`~programlogic.learning.optimizers.as_optimizer`.
    - ``loss``: a Keras loss or its name (default ``SparseCategoricalCrossentropy()``);
      ``metrics``: Keras metrics whose variables sum, or their names
      (:class:`~programlogic.learning.metrics.SummableMetric`), reported on the round's
      summed metric variables.
    - ``preprocess``: turns a client's arrays into batches (default
      ``Preprocessing(epochs=5, batch_size=20, shuffle_buffer=100)``).
    - ``seed``: seeds every client's shuffle with ``(seed, round, client id)``.
    - ``clients_per_group``: how many clients train in one compiled vectorized call
      (default: the round split evenly over the context's workers, see
      :func:`plan_group_size`).
    """
    client_optimizer, server_optimizer = _fed_avg_optimizers(client_optimizer, server_optimizer)
    preprocess = Preprocessing() if preprocess is None else preprocess
    model = training_model(model_fn, loss, metrics, preprocess, seed, clients_per_group)
    return WeightedFedAvg(
        model, client_optimizer, server_optimizer, preprocess, seed, clients_per_group
    )


def _fed_avg_optimizers(
    client_optimizer: Any, server_optimizer: Any
) -> tuple[Optimizer, Optimizer]:
    """FedAvg's client and server optimizers: those given (converted by
    :func:`~programlogic.learning.optimizers.as_optimizer`) or ``sgd(0.02)`` and
    ``sgd(1.0)``."""
    return (
        as_optimizer(
            sgd(0.02) if client_optimizer is None else client_optimizer, "client_optimizer"
        ),
        as_optimizer(
            sgd(1.0) if server_optimizer is None else server_optimizer, "server_optimizer"
        ),
    )
