"""Federated SGD: one server step a round on the clients' mean gradient at the server model."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from programlogic.datasets.preprocessing import Preprocessing
from programlogic.learning._grouped import GroupedProcess, training_model
from programlogic.learning._tensorflow import tf
from programlogic.learning.aggregators import (
    ModelAggregator,
    Partial,
    check_aggregation,
    fold_clients,
)
from programlogic.learning.client_update.traced import batch_gradients, training_zeros
from programlogic.learning.fed_avg import WeightedFedAvg
from programlogic.learning.keras_model import ClientGroup, FunctionalModel
from programlogic.learning.optimizers import Optimizer, as_optimizer, sgd

__all__ = ["FedSGD", "build_fed_sgd"]


class FedSGD(WeightedFedAvg):
    """Federated SGD (McMahan et al.), TensorFlow Federated 0.87's ``build_fed_sgd``.

    Each client computes the gradient of the loss at the server model over all its
    batches, the mean over its examples (each batch's gradient weighted by its number
    of examples), without changing the model; the server averages the client gradients
    weighted by their example counts and applies the mean with the server optimizer.
    A client whose gradient is not finite (one with no examples among them) weighs
    nothing. State and metrics are :class:`WeightedFedAvg`'s (the loss and metrics are
    those of the server model on the clients' batches); there is no client optimizer.

    Build it with :func:`build_fed_sgd`.
    """

    def __init__(
        self,
        model: FunctionalModel,
        server_optimizer: Optimizer,
        preprocess: Preprocessing,
        seed: int,
        clients_per_group: int | None,
        *,
        model_aggregator: ModelAggregator | None = None,
    ) -> None:
        super().__init__(
            model,
            sgd(0.0),
            server_optimizer,
            preprocess,
            seed,
            clients_per_group,
            model_aggregator=model_aggregator,
            client_update="traced",  # its graph computes gradients, no local training
        )

    def describe_configuration(self) -> dict[str, Any]:
        """The model and preprocessing, the server optimizer, the seed and a model
        aggregator other than the mean, as a JSON-able dict."""
        return {
            **GroupedProcess.describe_configuration(self),
            "algorithm": "fed_sgd",
            "server_optimizer": self.server_optimizer.describe(),
            "seed": self.seed,
            **self._describe_aggregation(),
        }

    def _group_graph(self) -> tuple[Callable[..., Any], tuple[Any, ...]]:
        return _sgd_group_graph, (self.model_aggregator,)


def _sgd_group_graph(
    model: FunctionalModel,
    aggregator: ModelAggregator,
    trainable: list[Any],
    non_trainable: list[Any],
    group: ClientGroup,
    params: dict[str, Any],
) -> tuple[Partial, Any, dict[str, Any]]:
    """The group's client mean gradients, example-weighted and folded by ``aggregator``,
    and each client's finiteness and sums."""

    def client_gradient(data: tuple[Any, ...]) -> tuple[list[Any], Any, dict[str, Any]]:
        x, y, batch_indices, mask, random_states = data
        weights = list(trainable)

        def step(index: Any, carry: tuple[Any, ...]) -> tuple[Any, ...]:
            gradient_sum, others, sums = carry
            gradients, new_others, batch_sums = batch_gradients(
                model, weights, others, x, y, batch_indices[index], mask[index]
            )
            count = batch_sums["num_examples"]
            has_data = count > 0
            new_others = [
                tf.where(has_data, tf.cast(new, old.dtype), old)
                for new, old in zip(new_others, others, strict=True)
            ]
            return (
                [total + count * g for total, g in zip(gradient_sum, gradients, strict=True)],
                new_others,
                {name: sums[name] + batch_sums[name] for name in sums},
            )

        carry = (
            [tf.zeros_like(w) for w in weights],
            [tf.convert_to_tensor(w) for w in model.seeded(non_trainable, random_states)],
            training_zeros(model),
        )
        num_batches = tf.shape(mask)[0]
        _, (gradient_sum, _, sums) = tf.while_loop(
            lambda i, _: i < num_batches,
            lambda i, c: (i + 1, step(i, c)),
            (tf.constant(0), carry),
        )
        mean = [total / sums["num_examples"] for total in gradient_sum]
        finite = tf.reduce_all([tf.reduce_all(tf.math.is_finite(g)) for g in mean])
        return mean, finite, sums

    gradients, finite, sums = tf.vectorized_map(client_gradient, tuple(group))
    partial = fold_clients(
        aggregator, params, gradients, finite, sums["num_examples"], "num_examples"
    )
    return partial, finite, sums


def build_fed_sgd(
    model_fn: Callable[[], Any],
    server_optimizer: Optimizer | Any = None,
    *,
    loss: Any = None,
    metrics: Sequence[str] = ("sparse_categorical_accuracy",),
    preprocess: Preprocessing | None = None,
    seed: int = 0,
    clients_per_group: int | None = None,
    model_aggregator: ModelAggregator | None = None,
) -> FedSGD:
    """A :class:`FedSGD` learning process for the Keras model ``model_fn`` builds.

    - ``server_optimizer``: applies the mean client gradient (default ``sgd(0.1)``, TFF's
      default); a Keras optimizer is converted by
      :func:`~programlogic.learning.optimizers.as_optimizer`.
    - ``preprocess``: the batches a client's gradient is computed over (default
      ``Preprocessing(epochs=1, batch_size=20, shuffle_buffer=0)``: each example once).
    - ``loss``, ``metrics``, ``seed``, ``clients_per_group``, ``model_aggregator`` (of
      the example-weighted client gradients): as
      :func:`~programlogic.learning.build_weighted_fed_avg`'s.
    """
    _, model_aggregator = check_aggregation("num_examples", model_aggregator)
    server_optimizer = as_optimizer(
        sgd(0.1) if server_optimizer is None else server_optimizer, "server_optimizer"
    )
    if preprocess is None:
        preprocess = Preprocessing(epochs=1, batch_size=20, shuffle_buffer=0)
    model = training_model(model_fn, loss, metrics, preprocess, seed, clients_per_group)
    return FedSGD(
        model,
        server_optimizer,
        preprocess,
        seed,
        clients_per_group,
        model_aggregator=model_aggregator,
    )
