"""Per-round overhead of train_model, and whether its memory stays flat.

Runs ``train_model`` with a no-op learning process (an async ``next`` that returns its
state) and memory managers with retention (``keep_total``, ``max_entries``) for
10,000 rounds on the local context. Prints one JSON line: the per-round overhead in
microseconds (the whole run's wall time over its rounds, beside a baseline loop that
only selects clients, measured in the same run), and resident memory after round 1,000
and round 10,000 with their ratio.

    python bench/overhead.py [--rounds 10000] [--backend asyncio|trio]
"""

from __future__ import annotations

import argparse
import gc
import json
import time
from typing import Any

import anyio
import psutil

from managers import MemoryProgramStateManager, MemoryReleaseManager
from programlogic import LearningProcessOutput, LocalContext, train_model
from programlogic.testing import FakeDataSource


class NoOpProcess:
    """Returns its state unchanged; records resident memory at chosen rounds."""

    def __init__(self, probes: dict[int, int]) -> None:
        self.probes = probes
        self.process = psutil.Process()

    async def initialize(self) -> dict[str, Any]:
        return {"round": 0}

    async def next(self, state: dict[str, Any], clients: Any) -> LearningProcessOutput:
        round_num = state["round"] + 1
        if round_num in self.probes:
            gc.collect()
            self.probes[round_num] = self.process.memory_info().rss
        return LearningProcessOutput(
            {"round": round_num}, {"client_work": {"train": {"loss": 0.0}}}
        )

    async def get_model_weights(self, state: dict[str, Any]) -> int:
        return state["round"]

    async def set_model_weights(self, state: dict[str, Any], weights: Any) -> dict[str, Any]:
        return state


async def baseline(rounds: int) -> float:
    """Seconds for the part every program pays anyway: selecting the clients of each round."""
    iterator = FakeDataSource(100).iterator(0)
    start = time.perf_counter()
    for round_num in range(1, rounds + 1):
        iterator.select(10, round_num)
        await anyio.lowlevel.checkpoint()
    return time.perf_counter() - start


async def measure(rounds: int) -> dict[str, Any]:
    probes = {min(1_000, rounds): 0, rounds: 0}
    process = NoOpProcess(probes)
    async with LocalContext():
        start = time.perf_counter()
        await train_model(
            train_process=process,
            train_data_source=FakeDataSource(100),
            train_per_round_clients=10,
            train_total_rounds=rounds,
            program_state_manager=MemoryProgramStateManager(keep_total=3),
            model_output_manager=MemoryReleaseManager(max_entries=1),
            train_metrics_manager=MemoryReleaseManager(max_entries=100),
        )
        elapsed = time.perf_counter() - start
    base = await baseline(rounds)
    early, late = probes[min(1_000, rounds)], probes[rounds]
    return {
        "benchmark": "train_model overhead",
        "rounds": rounds,
        "per_round_us": round(elapsed / rounds * 1e6, 1),
        "per_round_us_without_selection": round((elapsed - base) / rounds * 1e6, 1),
        "selection_baseline_us": round(base / rounds * 1e6, 1),
        "rss_mib_round_1000": round(early / 2**20, 2),
        "rss_mib_last_round": round(late / 2**20, 2),
        "rss_growth_ratio": round(late / early, 4),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=10_000)
    parser.add_argument("--backend", choices=["asyncio", "trio"], default="asyncio")
    arguments = parser.parse_args()
    result = anyio.run(measure, arguments.rounds, backend=arguments.backend)
    result["backend"] = arguments.backend
    print(json.dumps(result))


if __name__ == "__main__":
    main()
