"""What a run of the service does: federated averaging on the handwritten digits.

``train`` trains (or resumes) one run with ``train_model`` in its directory: file state
under ``state/``, metrics in ``metrics.csv`` and to the run's live stream, the final
model under ``models/``. ``load_training`` loads what that needs before the service
serves.
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

import anyio
import anyio.to_thread

from managers import (
    CSVFileReleaseManager,
    FileProgramStateManager,
    GroupingReleaseManager,
    ModelFileReleaseManager,
)
from programlogic import LocalContext, train_model
from samples.service.config import RunConfig
from samples.service.live_metrics import LiveMetricsReleaseManager

__all__ = ["load_training", "train"]


def load_training() -> None:
    """Import TensorFlow, Keras and scikit-learn, and load the digits: before serving.

    Loading an extension module holds the GIL for up to half a second at a time, so
    in a worker thread it still stalls the event loop; at startup no request waits.
    """
    import programlogic.learning  # noqa: F401  (imported for its side effect: loaded)

    _digits()


@functools.cache
def _digits() -> Any:
    from programlogic.datasets import load_digits_writers

    return load_digits_writers()


def _build_process(config: RunConfig, feature_shape: tuple[int, ...], num_classes: int) -> Any:
    # Runs in a worker thread: building the model and its functions is Python work.
    from programlogic.datasets import Preprocessing
    from programlogic.learning import build_model, build_weighted_fed_avg, sgd

    model_fn = functools.partial(build_model, config.model, feature_shape, num_classes)
    return build_weighted_fed_avg(
        model_fn,
        sgd(config.client_lr),
        sgd(config.server_lr),
        preprocess=Preprocessing(
            epochs=config.epochs, batch_size=config.batch_size, shuffle_buffer=100
        ),
        seed=config.seed,
    )


async def train(
    config: RunConfig,
    directory: Path,
    live: LiveMetricsReleaseManager,
    *,
    build_limiter: anyio.CapacityLimiter | None = None,
) -> None:
    """Train (or resume) the run of ``config`` in ``directory``, releasing metrics to ``live``.

    The model is built on a worker thread of ``build_limiter`` (default: anyio's).
    """
    data = await anyio.to_thread.run_sync(_digits, limiter=build_limiter)
    process = await anyio.to_thread.run_sync(
        _build_process, config, data.feature_shape, data.num_classes, limiter=build_limiter
    )
    async with (
        LocalContext(max_workers=1),
        FileProgramStateManager(directory / "state", keep_total=3) as state,
        GroupingReleaseManager([CSVFileReleaseManager(directory / "metrics.csv"), live]) as metrics,
        ModelFileReleaseManager(directory / "models") as models,
    ):
        await train_model(
            train_process=process,
            train_data_source=data.train,
            train_per_round_clients=config.clients_per_round,
            train_total_rounds=config.rounds,
            program_state_manager=state,
            model_output_manager=models,
            train_metrics_manager=metrics,
            seed=config.seed,
        )
