"""The program the ServerApp runs: FedAvg on the digits writers, its state under a root.

It is the commonest program (FileRun: file state, CSV metrics, an evaluation on the
held-out writers, the final Keras model), written against whichever federated context
is current, so the same code runs on Flower's nodes (``server``) and, for a check, on
``LocalContext``. What travels to the nodes is named by reference: the model function
is a ``functools.partial`` of a programlogic function, the process programlogic's own.
Clients train one a group (``clients_per_group=1``): on Flower a client's data is on its
own node, and with one client a group ``LocalContext`` computes exactly the same.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from programlogic import FileRun, FileRunEvaluation, TrainingResult, final_model_key, train_model
from programlogic.data import FederatedDataSource
from programlogic.datasets import Preprocessing
from programlogic.learning import (
    KerasModelReleaseManager,
    build_fed_eval,
    build_weighted_fed_avg,
    sgd,
    softmax_regression,
)

FEATURE_SHAPE = (64,)
NUM_CLASSES = 10
MODEL_FN = functools.partial(softmax_regression, FEATURE_SHAPE, NUM_CLASSES)


def build_process() -> Any:
    """The tutorial's FedAvg, one client a group."""
    return build_weighted_fed_avg(
        MODEL_FN,
        client_optimizer=sgd(0.02),
        server_optimizer=sgd(1.0),
        preprocess=Preprocessing(epochs=5, batch_size=5, shuffle_buffer=100),
        clients_per_group=1,
    )


@dataclasses.dataclass(frozen=True)
class Settings:
    """The run config of ``[tool.flwr.app.config]``, read and checked."""

    train_clients: tuple[str, ...]
    eval_clients: tuple[str, ...]
    rounds: int
    clients_per_round: int
    eval_every: int
    seed: int
    root: Path
    round_deadline: float | None
    min_clients: int

    @classmethod
    def from_run_config(cls, config: Mapping[str, Any]) -> Settings:
        root = Path(str(config["root"]))
        if not root.is_absolute():
            raise ValueError(
                f"root must be an absolute path (the ServerApp runs in a directory of "
                f"Flower's), got {str(root)!r}"
            )
        deadline = float(config.get("round-deadline", 0.0))
        return cls(
            train_clients=_ids(config["train-clients"]),
            eval_clients=_ids(config.get("eval-clients", "")),
            rounds=int(config["rounds"]),
            clients_per_round=int(config["clients-per-round"]),
            eval_every=int(config.get("eval-every", 1)),
            seed=int(config.get("seed", 0)),
            root=root,
            round_deadline=deadline if deadline > 0 else None,
            min_clients=int(config.get("min-clients", 1)),
        )


def _ids(value: Any) -> tuple[str, ...]:
    return tuple(part.strip() for part in str(value).split(",") if part.strip())


async def train(
    settings: Settings,
    train_source: FederatedDataSource,
    eval_source: FederatedDataSource | None,
) -> TrainingResult:
    """Train in the current federated context, resuming from ``settings.root``."""
    process = build_process()
    keras_model = KerasModelReleaseManager(settings.root, MODEL_FN, formats=["keras"])
    evaluation = None
    if eval_source is not None:
        evaluation = FileRunEvaluation(
            build_fed_eval(MODEL_FN, train_process=process),
            eval_source,
            cohort_size=len(settings.eval_clients),
        )
    async with FileRun(
        settings.root,
        metrics_formats=["csv"],
        model_managers=[keras_model],
        evaluation=evaluation,
    ) as run:
        result = await train_model(
            train_process=process,
            train_data_source=train_source,
            train_per_round_clients=settings.clients_per_round,
            train_total_rounds=settings.rounds,
            evaluation_periodicity=settings.eval_every,
            seed=settings.seed,
            **run.train_model_arguments(),
        )
    model = keras_model.keras_path(final_model_key(result.round_num))
    print(
        f"{result.stop_reason} at round {result.round_num} (resumed from "
        f"{result.resumed_from}); the model: {model}",
        flush=True,
    )
    return result
