"""A small differentially private FedAvg run for the privacy tests: a softmax regression
on 20 clients, each joining a round with probability 4/20 (Poisson sampling), noise
multiplier 2, epsilon reported at delta 1e-5."""

from __future__ import annotations

import functools
from typing import Any

import numpy as np

from managers import FileProgramStateManager, MemoryReleaseManager
from programlogic import InMemoryDataSource, LocalContext, TrainingResult, train_model
from programlogic.datasets import ClientArrays, Preprocessing
from programlogic.privacy import GaussianMechanism

FEATURES, CLASSES = 8, 3
NUM_CLIENTS, PER_ROUND = 20, 4
DELTA = 1e-5
MECHANISM = GaussianMechanism(2.0, NUM_CLIENTS, PER_ROUND)
"""12 rounds of it are within epsilon 2.0 at DELTA, 13 are not."""


@functools.cache
def clients() -> dict[str, ClientArrays]:
    data = {}
    for index in range(NUM_CLIENTS):
        rng = np.random.default_rng(index)
        count = 3 + index % 5
        x = rng.random((count, FEATURES), dtype=np.float32)
        y = rng.integers(0, CLASSES, count).astype(np.int32)
        data[f"client{index:02d}"] = ClientArrays(x, y)
    return data


def dp_process(
    mechanism: GaussianMechanism = MECHANISM, *, delta: float = DELTA, secret: int | None = None
) -> Any:
    """Unweighted FedAvg whose model aggregator is ``dp_mean(mechanism, 0.5, delta=delta)``;
    a fresh noise secret each run unless ``secret`` is given."""
    from programlogic.learning import build_unweighted_fed_avg, dp_mean, sgd, softmax_regression

    return build_unweighted_fed_avg(
        functools.partial(softmax_regression, (FEATURES,), CLASSES),
        sgd(0.5),
        sgd(1.0),
        preprocess=Preprocessing(epochs=1, batch_size=4, shuffle_buffer=0),
        model_aggregator=dp_mean(mechanism, 0.5, delta=delta, secret=secret),
    )


async def train(
    process: Any,
    state_manager: Any,
    *,
    rounds: int,
    metrics: Any = None,
    models: Any = None,
    **arguments: Any,
) -> TrainingResult:
    """``train_model`` of ``process`` for ``rounds`` rounds on the Poisson-sampled clients."""
    async with LocalContext(max_workers=2):
        return await train_model(
            train_process=process,
            train_data_source=InMemoryDataSource(clients(), sampling="poisson"),
            train_per_round_clients=PER_ROUND,
            train_total_rounds=rounds,
            program_state_manager=state_manager,
            model_output_manager=MemoryReleaseManager() if models is None else models,
            train_metrics_manager=metrics,
            seed=3,
            **arguments,
        )


async def train_in(
    process: Any, directory: Any, *, rounds: int, **arguments: Any
) -> TrainingResult:
    """:func:`train` with the program state in files in ``directory`` (its manager closed
    when the run ends, also when it fails); ``on_all_damaged`` goes to the manager."""
    options = {"on_all_damaged": arguments.pop("on_all_damaged", "raise")}
    async with FileProgramStateManager(directory, **options) as states:
        return await train(process, states, rounds=rounds, **arguments)


def released_epsilons(metrics: MemoryReleaseManager) -> dict[int, float]:
    """``privacy/epsilon`` of every round a memory release manager holds, by round."""
    return {key: value["privacy"]["epsilon"] for key, value in metrics.values().items()}
