"""Federated evaluation of Keras models: the process an EvaluationManager runs."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from managers.validation import check_type
from programlogic.data import ClientHandle
from programlogic.datasets.preprocessing import Preprocessing
from programlogic.learning._grouped import (
    GroupedProcess,
    check_clients_per_group,
    functional_model,
    ratio,
)
from programlogic.learning._tensorflow import tf
from programlogic.learning.fed_avg import WeightedFedAvg
from programlogic.learning.keras_model import ClientGroup, FunctionalModel, ModelWeights
from programlogic.learning.metrics import client_sums
from programlogic.process import LearningProcessOutput

__all__ = ["FederatedEvaluation", "build_fed_eval"]


@dataclasses.dataclass
class _Sums:
    values: dict[str, float] = dataclasses.field(default_factory=dict)

    def add(self, other: dict[str, float]) -> _Sums:
        for name, value in other.items():
            self.values[name] = self.values.get(name, 0.0) + value
        return self


class FederatedEvaluation(GroupedProcess):
    """Evaluates the model weights its state holds on the clients of each round.

    Each client's data is batched once, in order (``preprocess``), and run through the
    model in inference mode; clients go through the current federated context in
    compiled, vectorized groups, as in :class:`~programlogic.learning.WeightedFedAvg`,
    each client padded to its group's whole batches: groups whose clients fill as many
    batches share one compiled shape, whichever clients a round puts together.
    Metrics, example-weighted over all clients (the names of
    ``tff.learning.algorithms.build_fed_eval``):
    ``client_work/eval/current_round_metrics/{sparse_categorical_accuracy, loss,
    num_examples}`` for the round, and the same under ``total_rounds_metrics`` over
    every round since the weights were set.

    The process pickles (its compiled function is found again or rebuilt on
    unpickling), so distributed contexts ship it to their workers. Evaluations built
    with the same ``model_fn``, loss object (the default one, or one object passed each
    time) and metrics share one compiled function, so a program may build a new one for
    every evaluation without compiling again. Build it with :func:`build_fed_eval`.
    """

    def initialize(self) -> dict[str, Any]:
        """A state holding the model's initial weights and empty totals."""
        return {"model": self.model.initial_weights(), "totals": self._zero_sums()}

    async def next(
        self, state: dict[str, Any], clients: Sequence[ClientHandle]
    ) -> LearningProcessOutput:
        """Evaluate the state's weights on ``clients``."""
        context, group_size = self._plan_round(clients, "an evaluation round")
        sums = await context.aggregate_clients(
            self._evaluate_group,
            (state["model"], group_size),
            clients,
            lambda total, client: total.add(client),
            _Sums(),
            group_size=group_size,
        )
        totals = {
            name: np.asarray(state["totals"][name], dtype=np.float64) + sums.values.get(name, 0.0)
            for name in state["totals"]
        }
        totals = {name: float(v) if v.ndim == 0 else v for name, v in totals.items()}
        metrics = {
            "client_work": {
                "eval": {
                    "current_round_metrics": self._finalize(sums.values),
                    "total_rounds_metrics": self._finalize(totals),
                }
            }
        }
        return LearningProcessOutput({"model": state["model"], "totals": totals}, metrics)

    def get_model_weights(self, state: dict[str, Any]) -> ModelWeights:
        """The model weights under evaluation."""
        return state["model"]

    def set_model_weights(self, state: dict[str, Any], weights: ModelWeights) -> dict[str, Any]:
        """A state evaluating ``weights``, with its totals cleared."""
        return {"model": self.model.check_weights(weights), "totals": self._zero_sums()}

    def _zero_sums(self) -> dict[str, Any]:
        zeros: dict[str, Any] = {"loss_sum": 0.0, "num_examples": 0.0}
        for metric in self.model.metrics:
            for name, (shape, _) in zip(metric.state_names(), metric.shapes, strict=True):
                zeros[name] = 0.0 if shape == () else np.zeros(shape)
        return zeros

    def _finalize(self, sums: dict[str, float]) -> dict[str, Any]:
        examples = sums.get("num_examples", 0.0)
        finished: dict[str, Any] = self.model.metric_results(sums)
        finished["loss"] = ratio(sums.get("loss_sum", 0.0), examples)
        finished["num_examples"] = int(examples)
        return finished

    def _evaluate_group(
        self,
        broadcast: tuple[ModelWeights, int],
        client_ids: Sequence[str],
        datas: Sequence[Any],
    ) -> list[dict[str, float]]:
        weights, group_size = broadcast
        sums = self._run_group(weights, datas, [0] * len(datas), group_size, whole_batches=True)
        arrays = {name: np.asarray(value) for name, value in sums.items()}
        return [client_sums(arrays, index) for index in range(len(client_ids))]

    def _group_graph(self) -> tuple[Callable[..., Any], tuple[()]]:
        return _evaluate_group_graph, ()


def _evaluate_group_graph(
    model: FunctionalModel,
    trainable: list[Any],
    non_trainable: list[Any],
    group: ClientGroup,
) -> dict[str, Any]:
    """Each client's metric sums, for a group of clients."""

    def evaluate_client(data: tuple[Any, ...]) -> dict[str, Any]:
        x, y, batch_indices, mask, _ = data  # no draws: training=False

        def step(index: Any, sums: dict[str, Any]) -> tuple[Any, dict[str, Any]]:
            batch = batch_indices[index]
            _, _, batch_sums = model.batch(
                trainable, non_trainable, x, y, batch, mask[index], training=False
            )
            return index + 1, {name: sums[name] + batch_sums[name] for name in sums}

        initial = {
            "loss_sum": tf.constant(0.0),
            "num_examples": tf.constant(0.0),
            **model.metric_zeros(),
        }
        _, sums = tf.while_loop(
            lambda index, _: index < tf.shape(mask)[0], step, (tf.constant(0), initial)
        )
        return sums

    return tf.vectorized_map(evaluate_client, tuple(group))


def build_fed_eval(
    model_fn: Callable[[], Any],
    *,
    loss: Any = None,
    metrics: Sequence[Any] = ("sparse_categorical_accuracy",),
    preprocess: Preprocessing | None = None,
    clients_per_group: int | None = None,
    train_process: WeightedFedAvg | None = None,
) -> FederatedEvaluation:
    """A :class:`FederatedEvaluation` of the Keras model ``model_fn`` builds.

    ``loss`` (a Keras loss or its name) defaults to ``SparseCategoricalCrossentropy()``;
    ``metrics`` are Keras metrics whose variables sum, or their names, as for
    :func:`~programlogic.learning.build_weighted_fed_avg`. ``preprocess`` must keep
    every example exactly once (one epoch). When it is not given, it is derived from
    ``train_process``, the process that trains the model, with
    :meth:`Preprocessing.for_evaluation` (the training's feature shape and batch size,
    one epoch, no shuffle), so examples reach the model in the shape it trained on;
    without either it is one epoch in batches of 100, no shuffle.

    Example::

        process = build_weighted_fed_avg(model_fn, preprocess=Preprocessing(feature_shape=(784,)))
        evaluation = build_fed_eval(model_fn, train_process=process)
    """
    check_type("train_process", train_process, WeightedFedAvg, allow_none=True)
    if preprocess is None:
        if train_process is not None:
            preprocess = train_process.preprocess.for_evaluation()
        else:
            preprocess = Preprocessing(epochs=1, batch_size=100, shuffle_buffer=0)
    check_type("preprocess", preprocess, Preprocessing)
    if preprocess.epochs != 1:
        raise ValueError(
            f"an evaluation sees every example once: preprocess.epochs must be 1, "
            f"got {preprocess.epochs}"
        )
    check_clients_per_group(clients_per_group)
    model = functional_model(model_fn, loss, metrics)
    return FederatedEvaluation(model, preprocess, clients_per_group)
