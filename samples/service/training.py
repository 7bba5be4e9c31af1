"""What a run is (:class:`RunConfig`, sent in ``POST /runs``) and does (:func:`train`:
federated averaging on the handwritten digits, in a :class:`programlogic.FileRun`)."""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any, Literal

import anyio.to_thread
from pydantic import BaseModel, ConfigDict, Field

from programlogic import FileRun, FileRunEvaluation, LocalContext, train_model
from samples.service.live_metrics import LiveMetrics

__all__ = ["RunConfig", "load_training", "train"]

TRAIN_CLIENTS = 10  # writers 0-9 of the digits train; 10-13 are held out


class RunConfig(BaseModel):
    """Federated averaging on the digits, one client per writer, evaluated on the 4
    held-out writers every ``eval_every`` rounds. Strict: unknown fields and values of
    the wrong type are refused.
    """

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    rounds: int = Field(ge=1, le=1_000_000)
    clients_per_round: int = Field(default=TRAIN_CLIENTS, ge=1, le=TRAIN_CLIENTS)
    model: Literal["softmax", "mlp", "cnn"] = "softmax"
    client_lr: float = Field(default=0.02, gt=0, le=10)
    server_lr: float = Field(default=1.0, gt=0, le=10)
    epochs: int = Field(default=5, ge=1, le=100)
    batch_size: int = Field(default=5, ge=1, le=1024)
    eval_every: int = Field(default=1, ge=1, le=1_000_000)
    seed: int = Field(default=0, ge=0, lt=2**63)


def load_training() -> None:
    """Import TensorFlow and load the digits before serving: loading an extension module
    holds the GIL for up to half a second, stalling the event loop even from a thread."""
    import programlogic.learning  # noqa: F401  (imported to be loaded)

    _digits()


@functools.cache
def _digits() -> Any:
    from programlogic.datasets import load_digits_writers

    return load_digits_writers()


def _build(config: RunConfig) -> tuple[Any, Any]:
    # Runs in a worker thread: building the model and its functions is Python work.
    from programlogic.datasets import Preprocessing
    from programlogic.learning import build_fed_eval, build_model, build_weighted_fed_avg, sgd

    data = _digits()
    model_fn = functools.partial(build_model, config.model, data.feature_shape, data.num_classes)
    process = build_weighted_fed_avg(
        model_fn,
        sgd(config.client_lr),
        sgd(config.server_lr),
        preprocess=Preprocessing(
            epochs=config.epochs, batch_size=config.batch_size, shuffle_buffer=100
        ),
        seed=config.seed,
    )
    return process, build_fed_eval(model_fn, train_process=process)


async def train(
    config: RunConfig, directory: Path, metrics: LiveMetrics, evaluation: LiveMetrics
) -> None:
    """Train (or resume) the run of ``config`` in ``directory``, its training and held-out
    metrics released to ``metrics`` and ``evaluation``."""
    process, fed_eval = await anyio.to_thread.run_sync(_build, config)
    held_out = FileRunEvaluation(
        fed_eval, _digits().test, cohort_size=4, metrics_managers=[evaluation]
    )
    async with (
        LocalContext(max_workers=1),
        FileRun(directory, metrics_managers=[metrics], evaluation=held_out) as run,
    ):
        await train_model(
            train_process=process,
            train_data_source=_digits().train,
            train_per_round_clients=config.clients_per_round,
            train_total_rounds=config.rounds,
            evaluation_periodicity=config.eval_every,
            seed=config.seed,
            **run.train_model_arguments(),
        )
