"""A TFF training program for the crash test: python _tff_program.py ROOT ROUNDS KILL_AFTER.

It trains the FedAvg process of conftest with our train_model, file program state under
ROOT, in a TFFContext, and kills itself with SIGKILL right after round KILL_AFTER's
metrics are released (so that round is saved), the way a crash ends a program.
"""

import os
import signal
import sys
from pathlib import Path

import anyio
from conftest import PER_ROUND, SEED, build_fedavg, client_arrays, to_dataset

from managers import FileProgramStateManager, ReleaseManager
from managers.release.memory import MemoryReleaseManager
from programlogic import InMemoryDataSource, train_model
from programlogic.contexts.tff import TFFContext, TFFLearningProcess


class KillAfter(ReleaseManager):
    """Kills this process once the metrics of round ``last`` are released."""

    def __init__(self, last: int) -> None:
        self.last = last

    async def release(self, value, key) -> None:
        if key == self.last:
            os.kill(os.getpid(), signal.SIGKILL)


async def main(root: Path, rounds: int, kill_after: int) -> None:
    datasets = {client: to_dataset(data) for client, data in client_arrays().items()}
    async with TFFContext(), FileProgramStateManager(root) as state:
        await train_model(
            train_process=TFFLearningProcess(build_fedavg()),
            train_data_source=InMemoryDataSource(datasets),
            train_per_round_clients=PER_ROUND,
            train_total_rounds=rounds,
            program_state_manager=state,
            model_output_manager=MemoryReleaseManager(),
            train_metrics_manager=KillAfter(kill_after),
            seed=SEED,
        )


if __name__ == "__main__":
    anyio.run(main, Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]))
