"""A training program for the kill-and-resume test: python _training_program.py DIR ROUNDS.

It trains the fake process with file program state, CSV metrics and model files under
DIR, resuming from whatever DIR holds, and prints "done" at the end.
"""

import sys
from pathlib import Path

import anyio

from managers.release.csv_file import CSVFileReleaseManager
from managers.release.model_file import ModelFileReleaseManager
from managers.state.file import FileProgramStateManager
from programlogic import LearningProcessOutput, LocalContext, train_model
from programlogic.testing import FakeDataSource, FakeLearningProcess


class Slow(FakeLearningProcess):
    """Takes a little time a round, so that a kill can land anywhere in the run."""

    async def next(self, state, clients) -> LearningProcessOutput:
        await anyio.sleep(0.005)
        return await super().next(state, clients)


async def main(root: Path, rounds: int) -> None:
    async with (
        LocalContext(),
        FileProgramStateManager(root / "state", keep_total=2) as state,
        CSVFileReleaseManager(root / "metrics.csv") as metrics,
    ):
        await train_model(
            train_process=Slow(),
            train_data_source=FakeDataSource(20),
            train_per_round_clients=4,
            train_total_rounds=rounds,
            program_state_manager=state,
            model_output_manager=ModelFileReleaseManager(root / "models"),
            train_metrics_manager=metrics,
            seed=3,
        )
    print("done", flush=True)


if __name__ == "__main__":
    anyio.run(main, Path(sys.argv[1]), int(sys.argv[2]))
