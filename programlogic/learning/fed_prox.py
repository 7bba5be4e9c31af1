"""FedProx: FedAvg whose client steps are pulled towards the server model."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from managers.validation import check_number
from programlogic.datasets.preprocessing import Preprocessing
from programlogic.learning.aggregators import ModelAggregator
from programlogic.learning.client_update.traced import train_group_graph
from programlogic.learning.fed_avg import WeightedFedAvg, _build_process
from programlogic.learning.keras_model import FunctionalModel
from programlogic.learning.optimizers import Optimizer

__all__ = ["FedProx", "build_unweighted_fed_prox", "build_weighted_fed_prox"]


class FedProx(WeightedFedAvg):
    """FedAvg whose clients are pulled towards the server model (Li et al., "FedProx", 2020).

    Each client step adds ``proximal_strength * (w - w_server)`` to the gradient of the
    batch loss: the gradient of ``proximal_strength / 2 * ||w - w_server||^2`` over the
    trainable weights, which pulls the client towards the server model. The reported
    loss is the batch loss alone, as in TensorFlow Federated. TFF 0.87's FedProx adds
    ``proximal_strength * (w_server - w)`` instead, the opposite sign: its numbers are
    this class's with the strength negated (which the builders refuse).

    Client deltas are averaged weighted by the examples each client trained on
    (``client_weighting="num_examples"``) or with equal weights (``"uniform"``: a client
    with no examples weighs nothing, a client whose delta is not finite neither).
    With ``proximal_strength=0`` this is FedAvg, bit for bit.

    Everything else (state, metrics, determinism, resuming, ``client_update``) is
    :class:`WeightedFedAvg`'s. Build it with :func:`build_weighted_fed_prox` or
    :func:`build_unweighted_fed_prox`.
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
        proximal_strength: float,
        client_weighting: str = "num_examples",
        model_aggregator: ModelAggregator | None = None,
        client_update: str = "auto",
    ) -> None:
        self.proximal_strength = proximal_strength
        super().__init__(
            model,
            client_optimizer,
            server_optimizer,
            preprocess,
            seed,
            clients_per_group,
            client_weighting=client_weighting,
            model_aggregator=model_aggregator,
            client_update=client_update,
        )

    def describe_configuration(self) -> dict[str, Any]:
        """FedAvg's configuration plus ``proximal_strength`` and ``client_weighting``."""
        return {
            **super().describe_configuration(),
            "proximal_strength": self.proximal_strength,
            "client_weighting": self.client_weighting,
        }

    def _group_graph(self) -> tuple[Callable[..., Any], tuple[Any, ...]]:
        return train_group_graph, (
            self.client_optimizer,
            self.proximal_strength,
            self.client_weighting,
            self.model_aggregator,
        )


def build_weighted_fed_prox(
    model_fn: Callable[[], Any],
    proximal_strength: float,
    client_optimizer: Optimizer | Any = None,
    server_optimizer: Optimizer | Any = None,
    *,
    client_weighting: str = "num_examples",
    model_aggregator: ModelAggregator | None = None,
    loss: Any = None,
    metrics: Sequence[str] = ("sparse_categorical_accuracy",),
    preprocess: Preprocessing | None = None,
    seed: int = 0,
    clients_per_group: int | None = None,
    client_update: str = "auto",
) -> FedProx:
    """A :class:`FedProx` process, TFF's ``build_weighted_fed_prox``.

    ``proximal_strength`` (a number >= 0, TFF's argument of that name) weighs the
    proximal term ``proximal_strength / 2 * ||w - w_server||^2`` of every client step;
    ``client_weighting`` is ``"num_examples"`` (default) or ``"uniform"``. The other
    arguments and defaults are :func:`~programlogic.learning.build_weighted_fed_avg`'s
    (client ``sgd(0.02)``, server ``sgd(1.0)``, as TFF's server default; the
    ``model_aggregator`` :func:`~programlogic.learning.mean`).
    """
    check_number("proximal_strength", proximal_strength, minimum=0, finite=True)
    return _build_process(
        FedProx,
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
        proximal_strength=float(proximal_strength),
    )


def build_unweighted_fed_prox(
    model_fn: Callable[[], Any],
    proximal_strength: float,
    client_optimizer: Optimizer | Any = None,
    server_optimizer: Optimizer | Any = None,
    *,
    model_aggregator: ModelAggregator | None = None,
    loss: Any = None,
    metrics: Sequence[str] = ("sparse_categorical_accuracy",),
    preprocess: Preprocessing | None = None,
    seed: int = 0,
    clients_per_group: int | None = None,
    client_update: str = "auto",
) -> FedProx:
    """A :class:`FedProx` process averaging the clients with equal weights, TFF's
    ``build_unweighted_fed_prox``: :func:`build_weighted_fed_prox` with
    ``client_weighting="uniform"``."""
    return build_weighted_fed_prox(
        model_fn,
        proximal_strength,
        client_optimizer,
        server_optimizer,
        client_weighting="uniform",
        model_aggregator=model_aggregator,
        loss=loss,
        metrics=metrics,
        preprocess=preprocess,
        seed=seed,
        clients_per_group=clients_per_group,
        client_update=client_update,
    )
