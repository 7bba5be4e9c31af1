"""Federated averaging of Keras models, weighted by examples or unweighted."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence
from typing import Any

import anyio
import numpy as np

from managers.taskgroups import task_group
from programlogic.context import count_dropped_clients, get_context
from programlogic.data import ClientHandle
from programlogic.datasets.preprocessing import Preprocessing, client_seed
from programlogic.learning._grouped import (
    MAX_CLIENTS_PER_GROUP as MAX_CLIENTS_PER_GROUP,
)
from programlogic.learning._grouped import GroupedProcess, ratio, training_model
from programlogic.learning._grouped import (
    plan_group_size as plan_group_size,
)
from programlogic.learning._tensorflow import tf
from programlogic.learning.aggregators import (
    Mean,
    ModelAggregator,
    Partial,
    check_aggregation,
)
from programlogic.learning.client_update import check_client_update, compiled_update
from programlogic.learning.client_update.compiled import SoftmaxGroupUpdate
from programlogic.learning.client_update.traced import train_group_graph
from programlogic.learning.keras_model import FunctionalModel, ModelWeights
from programlogic.learning.metrics import client_sums
from programlogic.learning.optimizers import Optimizer, as_optimizer, sgd
from programlogic.privacy import PrivacyAccounting
from programlogic.process import LearningProcessOutput

# MAX_CLIENTS_PER_GROUP and plan_group_size live in _grouped since FedEval shares them;
# they stay importable from here, outside the public names.
__all__ = ["WeightedFedAvg", "build_unweighted_fed_avg", "build_weighted_fed_avg"]


@dataclasses.dataclass
class _ClientUpdate:
    """What one client sends back: whether its delta is finite and its metric sums.

    The first client of a group also carries the group's aggregation partial.
    """

    finite: bool
    sums: dict[str, float]
    group: Partial | None = None


@dataclasses.dataclass
class _Totals:
    """The merged aggregation partial and the summed metrics of a round.

    The last groups' partials, up to one a worker, are held back (``held``, in group
    order) for the server step to merge.
    """

    aggregator: ModelAggregator
    partial: Partial | None = None
    held: list[Partial] = dataclasses.field(default_factory=list)
    sums: dict[str, float] = dataclasses.field(default_factory=dict)
    non_finite_clients: int = 0
    dropped_clients: int = 0

    def add_client(self, update: _ClientUpdate) -> None:
        """Count a client's metric sums and whether its delta is finite (scalars only)."""
        for name, value in update.sums.items():
            self.sums[name] = self.sums.get(name, 0.0) + value
        if not update.finite:
            self.non_finite_clients += 1

    def add_group(self, partial: Partial) -> None:
        """Merge a group's partial: model-sized NumPy work, for a worker thread."""
        self.partial = self.aggregator.merge(self.partial, partial)

    def merged(self) -> Partial | None:
        """The round's partial, the ``held`` ones merged in: model-sized NumPy work, for
        a worker thread."""
        while self.held:
            self.add_group(self.held.pop(0))
        return self.partial


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
    padded with masked batches; ``client_update`` chooses how
    (:mod:`programlogic.learning.client_update`: by default a softmax regression trained
    with SGD without momentum runs a compiled C loop instead). That call also sums the group's
    weighted deltas (in float64); the round adds the group sums, in group order,
    through the context's ``run`` (off the event loop), so the sum is the same whichever
    group finished first. Groups hold ``clients_per_group`` clients, or by default the round split
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
        *,
        client_weighting: str = "num_examples",
        model_aggregator: ModelAggregator | None = None,
        client_update: str = "auto",
    ) -> None:
        self.client_optimizer = client_optimizer
        self.server_optimizer = server_optimizer
        self.seed = seed
        self.client_weighting = client_weighting
        self.model_aggregator = Mean() if model_aggregator is None else model_aggregator
        self.client_update = check_client_update(client_update)
        super().__init__(model, preprocess, clients_per_group)

    def describe_configuration(self) -> dict[str, Any]:
        """The model and preprocessing (see ``GroupedProcess``), both optimizers'
        hyperparameters, the seed of the client shuffles and, when not the defaults, the
        client weighting and the model aggregator, as a JSON-able dict.

        ``client_update`` is left out with ``clients_per_group``: a resumed run may
        compute the same update another way.
        """
        return {
            **super().describe_configuration(),
            "client_optimizer": self.client_optimizer.describe(),
            "server_optimizer": self.server_optimizer.describe(),
            "seed": self.seed,
            **self._describe_aggregation(),
        }

    def _describe_aggregation(self) -> dict[str, Any]:
        # Left out when default, so checkpoints of runs before aggregators still resume.
        described: dict[str, Any] = {}
        if self.client_weighting != "num_examples":
            described["client_weighting"] = self.client_weighting
        if self.model_aggregator != Mean():
            described["model_aggregator"] = self.model_aggregator.describe()
        return described

    def privacy_accounting(self) -> PrivacyAccounting | None:
        """The model aggregator's :class:`~programlogic.privacy.PrivacyAccounting`, for its
        state under ``"aggregator"``; None when it adds no noise (not a DP run)."""
        accounting = self.model_aggregator.privacy_accounting()
        return None if accounting is None else accounting.within("aggregator")

    def initialize(self) -> dict[str, Any]:
        """The round-0 state: the model's initial weights, a fresh server optimizer and,
        when it has one, the model aggregator's state."""
        weights = self.model.initial_weights()
        state = {
            "round": 0,
            "model": weights,
            "server_optimizer": self.server_optimizer.initialize(weights["trainable"]),
        }
        aggregator_state = self.model_aggregator.initialize()
        if aggregator_state:
            state["aggregator"] = aggregator_state
        return state

    async def next(
        self, state: dict[str, Any], clients: Sequence[ClientHandle]
    ) -> LearningProcessOutput:
        """One round of FedAvg on ``clients``, computed through the current context.

        A round without clients is refused (ValueError) unless the model aggregator
        takes one (see ``ModelAggregator.empty_round``).
        """
        # The aggregator checks its state here, for a round without clients too.
        params = self.model_aggregator.params(state.get("aggregator", {}))
        if not clients:
            empty = self.model_aggregator.empty_round(state["model"]["trainable"])
            if empty is not None:
                totals = _Totals(self.model_aggregator, partial=empty)
                return await get_context().run(self._server_step, state, totals)
        context, group_size = self._plan_round(clients, "a FedAvg round")
        self.model_aggregator.check_round([client.client_id for client in clients])
        round_num = int(state["round"]) + 1
        broadcast = (state["model"], round_num, group_size, params)
        totals = _Totals(self.model_aggregator)
        send, receive = anyio.create_memory_object_stream[Partial](math.inf)

        def accumulate(totals: _Totals, update: _ClientUpdate) -> _Totals:
            totals.add_client(update)
            if update.group is not None:
                send.send_nowait(update.group)
            return totals

        async def add_groups() -> None:
            # One group at a time, in client order: worker threads take the calls in
            # the order given, so at most the groups computing meanwhile wait here. The
            # last groups, one a worker (those that finish together), are merged by the
            # server step, in the same hand-off to a thread.
            async with receive:
                async for group in receive:
                    if len(totals.held) == context.parallelism:
                        await context.run(totals.add_group, totals.held.pop(0))
                    totals.held.append(group)

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
        broadcast: tuple[ModelWeights, int, int, dict[str, Any]],
        client_ids: Sequence[str],
        datas: Sequence[Any],
    ) -> list[_ClientUpdate]:
        weights, round_num, group_size, params = broadcast
        seeds = [client_seed(self.seed, round_num, client_id) for client_id in client_ids]
        partial, finite, sums = self._run_group(weights, datas, seeds, group_size, params)
        group = tf.nest.map_structure(np.asarray, partial)
        finite = np.asarray(finite)
        sums = {name: np.asarray(value) for name, value in sums.items()}
        updates = [
            _ClientUpdate(
                finite=bool(finite[index]),
                sums=client_sums(sums, index),
            )
            for index in range(len(client_ids))
        ]
        updates[0].group = group
        return updates

    @property
    def active_client_update(self) -> str:
        """The client update this copy of the process runs: ``"compiled"``,
        ``"portable"`` or ``"traced"`` (what ``client_update="auto"`` chose)."""
        if not isinstance(self._compiled, SoftmaxGroupUpdate):
            return "traced"
        return "portable" if self._compiled.portable else "compiled"

    def _compile(self) -> Callable[..., Any]:
        graph, config = self._group_graph()
        update = None
        if graph is train_group_graph:  # the local training FedAvg and FedProx share
            update = compiled_update(self.client_update, self.model, *config)
        return super()._compile() if update is None else update

    def _group_graph(self) -> tuple[Callable[..., Any], tuple[Any, ...]]:
        return train_group_graph, (
            self.client_optimizer,
            0.0,
            self.client_weighting,
            self.model_aggregator,
        )

    def _server_step(self, state: dict[str, Any], totals: _Totals) -> LearningProcessOutput:
        weights = state["model"]
        optimizer_state = state["server_optimizer"]
        trainable = weights["trainable"]
        update_non_finite = 0
        aggregate = self.model_aggregator.finalize(
            state.get("aggregator", {}), totals.merged(), int(state["round"]) + 1
        )
        if aggregate.update is not None:
            mean_delta = [
                np.asarray(update).astype(w.dtype)
                for update, w in zip(aggregate.update, trainable, strict=True)
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
        if aggregate.state:
            new_state["aggregator"] = aggregate.state
        metrics: dict[str, Any] = {
            "client_work": {"train": train},
            "finalizer": {"update_non_finite": update_non_finite},
        }
        if aggregate.measurements:
            metrics["aggregator"] = aggregate.measurements
        taken = set(aggregate.metrics) & set(metrics)
        if taken:
            raise ValueError(f"the model aggregator's metrics reuse the process's {sorted(taken)}")
        metrics.update(aggregate.metrics)
        return LearningProcessOutput(new_state, metrics)


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
    client_weighting: str = "num_examples",
    model_aggregator: ModelAggregator | None = None,
    client_update: str = "auto",
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
    - ``client_weighting``: each client's weight in the aggregation, ``"num_examples"``
      (default) or ``"uniform"`` (TFF's ``ClientWeighting``).
    - ``model_aggregator``: how the weighted client deltas become the round's update
      (default :func:`~programlogic.learning.mean`; see
      :mod:`programlogic.learning.aggregators`).
    - ``client_update``: how a group of clients trains, ``"auto"`` (default),
      ``"compiled"``, ``"portable"`` or ``"traced"``
      (:mod:`programlogic.learning.client_update`).
    """
    return _build_process(
        WeightedFedAvg,
        model_fn,
        client_optimizer,
        server_optimizer,
        loss=loss,
        metrics=metrics,
        preprocess=preprocess,
        seed=seed,
        clients_per_group=clients_per_group,
        client_weighting=client_weighting,
        model_aggregator=model_aggregator,
        client_update=client_update,
    )


def build_unweighted_fed_avg(
    model_fn: Callable[[], Any],
    client_optimizer: Optimizer | Any = None,
    server_optimizer: Optimizer | Any = None,
    *,
    model_aggregator: ModelAggregator | None = None,
    loss: Any = None,
    metrics: Sequence[Any] = ("sparse_categorical_accuracy",),
    preprocess: Preprocessing | None = None,
    seed: int = 0,
    clients_per_group: int | None = None,
    client_update: str = "auto",
) -> WeightedFedAvg:
    """FedAvg averaging the client deltas with equal weights, TFF's
    ``build_unweighted_fed_avg``: :func:`build_weighted_fed_avg` with
    ``client_weighting="uniform"`` (a client without examples, or whose delta is not
    finite, weighs nothing)."""
    return build_weighted_fed_avg(
        model_fn,
        client_optimizer,
        server_optimizer,
        loss=loss,
        metrics=metrics,
        preprocess=preprocess,
        seed=seed,
        clients_per_group=clients_per_group,
        client_weighting="uniform",
        model_aggregator=model_aggregator,
        client_update=client_update,
    )


def _build_process(
    process_class: type[WeightedFedAvg],
    model_fn: Callable[[], Any],
    client_optimizer: Any,
    server_optimizer: Any,
    *,
    loss: Any,
    metrics: Sequence[Any],
    preprocess: Preprocessing | None,
    seed: int,
    clients_per_group: int | None,
    client_weighting: str,
    model_aggregator: ModelAggregator | None,
    client_update: str,
    **extra: Any,
) -> Any:
    """A ``process_class`` (:class:`WeightedFedAvg` or a subclass taking the keywords
    ``extra``) from a FedAvg builder's arguments, checked and with their defaults: client
    ``sgd(0.02)``, server ``sgd(1.0)``, ``Preprocessing()``."""
    client_weighting, model_aggregator = check_aggregation(client_weighting, model_aggregator)
    preprocess = Preprocessing() if preprocess is None else preprocess
    model = training_model(model_fn, loss, metrics, preprocess, seed, clients_per_group)
    return process_class(
        model,
        as_optimizer(
            sgd(0.02) if client_optimizer is None else client_optimizer, "client_optimizer"
        ),
        as_optimizer(
            sgd(1.0) if server_optimizer is None else server_optimizer, "server_optimizer"
        ),
        preprocess,
        seed,
        clients_per_group,
        client_weighting=client_weighting,
        model_aggregator=model_aggregator,
        client_update=client_update,
        **extra,
    )
