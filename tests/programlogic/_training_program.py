"""A training program for the kill-and-resume test.

``python _training_program.py DIR ROUNDS BACKEND [STAGE ROUND]`` trains the fake process
with file program state, CSV metrics and model files under DIR, resuming from whatever
DIR holds, on the anyio BACKEND, and prints "done" at the end; the environment variable
``CHECKPOINT_EVERY`` sets ``train_model``'s ``checkpoint_every`` (1 when unset). Given
STAGE and ROUND, it kills itself with SIGKILL when it reaches that stage of that round
(a round past the one it resumed from), at the same instant on any machine:

- ``computing``: the learning process has started the round's computation;
- ``saving``: the round's program state is handed to the state manager, not written;
- ``saved``: the round's program state is written, its metrics not yet released;
- ``releasing``: the round's metrics are about to be released;
- ``final``: the final model is about to be released (ROUND is then the last round).
"""

import os
import signal
import sys
from pathlib import Path
from typing import Any

import anyio

from managers.release.csv_file import CSVFileReleaseManager
from managers.release.model_file import ModelFileReleaseManager
from managers.state.file import FileProgramStateManager
from programlogic import LearningProcessOutput, LocalContext, final_model_key, train_model
from programlogic.testing import FakeDataSource, FakeLearningProcess

STAGES = ("computing", "saving", "saved", "releasing", "final")


class Kill:
    """Where this run kills itself: a stage and a round, or nowhere."""

    def __init__(self, stage: str | None = None, round_num: int | None = None) -> None:
        if stage is not None and stage not in STAGES:
            raise ValueError(f"stage must be one of {STAGES}, got {stage!r}")
        self.stage, self.round_num = stage, round_num

    def at(self, stage: str, round_num: Any) -> None:
        if (stage, round_num) == (self.stage, self.round_num):
            os.kill(os.getpid(), signal.SIGKILL)


def killable(kill: Kill, rounds: int):
    """The process and the managers of a run, each killing it at its own stages."""

    class Process(FakeLearningProcess):
        async def next(self, state, clients) -> LearningProcessOutput:
            kill.at("computing", state["rounds"] + 1)
            return await super().next(state, clients)

    class State(FileProgramStateManager):
        async def save(self, state: Any, version: int) -> None:
            kill.at("saving", version)
            await super().save(state, version)

        def _save(self, state: Any, version: int) -> None:
            # The write itself, in the worker thread that makes the round's writes; the
            # metrics' write comes after it in the same call.
            super()._save(state, version)
            kill.at("saved", version)

    class Metrics(CSVFileReleaseManager):
        async def release(self, value: Any, key: Any) -> None:
            kill.at("releasing", key)
            await super().release(value, key)

    class Models(ModelFileReleaseManager):
        async def release(self, value: Any, key: Any) -> None:
            if key == final_model_key(rounds):
                kill.at("final", rounds)
            await super().release(value, key)

    return Process, State, Metrics, Models


async def main(root: Path, rounds: int, kill: Kill) -> None:
    process, state_manager, metrics_manager, models = killable(kill, rounds)
    async with (
        LocalContext(),
        state_manager(root / "state", keep_total=2) as state,
        metrics_manager(root / "metrics.csv") as metrics,
    ):
        await train_model(
            train_process=process(),
            train_data_source=FakeDataSource(20),
            train_per_round_clients=4,
            train_total_rounds=rounds,
            program_state_manager=state,
            model_output_manager=models(root / "models"),
            train_metrics_manager=metrics,
            seed=3,
            checkpoint_every=int(os.environ.get("CHECKPOINT_EVERY", "1")),
        )
    print("done", flush=True)


if __name__ == "__main__":
    directory, total, backend, *where = sys.argv[1:]
    stage, round_num = (where[0], int(where[1])) if where else (None, None)
    anyio.run(main, Path(directory), int(total), Kill(stage, round_num), backend=backend)
