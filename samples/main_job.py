"""The main job: a federated training program on the embedded local context.

Until the built-in FedAvg lands, it trains programlogic's fake learning process (a
deterministic stand-in that averages client data) on the fake federated data source. It
has the shape every program here has: a context, a process, a data source, managers and
``train_model``. Under ``--root`` (default ``runs/main_job``) it keeps:

- ``state/``: the program state, a checkpoint per round (the newest 3 and the first);
- ``metrics.csv``: a row of training metrics per round;
- ``models/``: the final model weights;

and it logs each round's metrics. Stop it at any moment (Ctrl-C, or kill it) and run the
same command again: it resumes after the last saved round and ends with the same model
an uninterrupted run gives.

    python samples/main_job.py [--rounds 20] [--clients 100] [--per-round 10] [--seed 0]
                               [--root runs/main_job]
"""

from __future__ import annotations

import argparse
import logging
from pathlib import Path
from typing import Any

import anyio

from managers import (
    CSVFileReleaseManager,
    FileProgramStateManager,
    GroupingReleaseManager,
    ModelFileReleaseManager,
    ReleaseManager,
)
from programlogic import LocalContext, final_model_key, train_model
from programlogic.testing import FakeDataSource, FakeLearningProcess

logger = logging.getLogger("main_job")


class LoggingMetrics(ReleaseManager):
    """Logs the training loss and example count of each round."""

    async def release(self, value: Any, key: int | str) -> None:
        train = value["client_work"]["train"]
        logger.info(
            "round %s: loss %.4f over %d examples", key, train["loss"], train["num_examples"]
        )


async def run(rounds: int, clients: int, per_round: int, seed: int, root: Path) -> None:
    models = ModelFileReleaseManager(root / "models")
    async with (
        LocalContext(),
        FileProgramStateManager(root / "state", keep_total=3) as state,
        GroupingReleaseManager(
            [CSVFileReleaseManager(root / "metrics.csv"), LoggingMetrics()]
        ) as metrics,
    ):
        result = await train_model(
            train_process=FakeLearningProcess(),
            train_data_source=FakeDataSource(clients, seed=seed),
            train_per_round_clients=per_round,
            train_total_rounds=rounds,
            program_state_manager=state,
            model_output_manager=models,
            train_metrics_manager=metrics,
            seed=seed,
        )
    key = final_model_key(result.round_num)
    logger.info(
        "%s after round %d (resumed from %s); %s = %s in %s",
        result.stop_reason,
        result.round_num,
        result.resumed_from,
        key,
        await models.load(key),
        root,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description="Run the main federated training job.")
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--clients", type=int, default=100)
    parser.add_argument("--per-round", type=int, default=10)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--root", type=Path, default=Path("runs/main_job"))
    arguments = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    anyio.run(
        run,
        arguments.rounds,
        arguments.clients,
        arguments.per_round,
        arguments.seed,
        arguments.root,
    )


if __name__ == "__main__":
    main()
