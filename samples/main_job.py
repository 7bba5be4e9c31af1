"""The main job: a federated training program on the embedded local context.

Until the built-in FedAvg lands, it trains programlogic's fake learning process (a
deterministic stand-in that averages client data) on the fake federated data source,
with in-memory checkpoints, and logs each round's metrics. It shows the shape every
program here has: a context, a process, a data source, managers, ``train_model``.

    python samples/main_job.py [--rounds 20] [--clients 100] [--per-round 10] [--seed 0]
"""

from __future__ import annotations

import argparse
import logging
from typing import Any

import anyio

from managers import MemoryProgramStateManager, MemoryReleaseManager, ReleaseManager
from programlogic import LocalContext, train_model
from programlogic.testing import FakeDataSource, FakeLearningProcess

logger = logging.getLogger("main_job")


class LoggingMetrics(ReleaseManager):
    """Logs the training loss and example count of each round."""

    async def release(self, value: Any, key: int | str) -> None:
        train = value["client_work"]["train"]
        logger.info(
            "round %s: loss %.4f over %d examples", key, train["loss"], train["num_examples"]
        )


async def run(rounds: int, clients: int, per_round: int, seed: int) -> None:
    models = MemoryReleaseManager()
    async with LocalContext():
        result = await train_model(
            train_process=FakeLearningProcess(),
            train_data_source=FakeDataSource(clients, seed=seed),
            train_per_round_clients=per_round,
            train_total_rounds=rounds,
            program_state_manager=MemoryProgramStateManager(keep_total=3),
            model_output_manager=models,
            train_metrics_manager=LoggingMetrics(),
            seed=seed,
        )
    ((key, weights),) = models.values().items()
    logger.info(
        "%s after round %d: released %s = %s", result.stop_reason, result.round_num, key, weights
    )


def main() -> None:
    parser = argparse.ArgumentParser(description="Run the main federated training job.")
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--clients", type=int, default=100)
    parser.add_argument("--per-round", type=int, default=10)
    parser.add_argument("--seed", type=int, default=0)
    arguments = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    anyio.run(run, arguments.rounds, arguments.clients, arguments.per_round, arguments.seed)


if __name__ == "__main__":
    main()
