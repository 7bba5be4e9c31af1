"""Per-round overhead of train_model, and whether its memory stays flat.

Runs ``train_model`` with a no-op learning process (an async ``next`` that returns its
state) and memory managers with retention (``keep_total``, ``max_entries``) for
10,000 rounds on the local context. Since the process does nothing, all of a round's
time is overhead. Beside it, in the same run, a hand-written loop does the least any
program does (select, next, save, release; no overlap, no resume, no checks). Prints one
JSON line: both per-round times in microseconds (medians of alternating repeats), their
ratio, and resident memory after round 1,000 and the last round with their ratio.

    python bench/overhead.py [--rounds 10000] [--repeats 5] [--backend asyncio|trio]
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
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


async def hand_written_loop(rounds: int) -> float:
    """Seconds for the least a program does by hand: select, next, save, release."""
    process = NoOpProcess({})
    iterator = FakeDataSource(100).iterator(0)
    state_manager = MemoryProgramStateManager(keep_total=3)
    metrics_manager = MemoryReleaseManager(max_entries=100)
    state = await process.initialize()
    start = time.perf_counter()
    for round_num in range(1, rounds + 1):
        clients = iterator.select(10, round_num)
        state, metrics = await process.next(state, clients)
        await state_manager.save({"train_state": state, "metrics": metrics}, round_num)
        await metrics_manager.release(metrics, round_num)
    return time.perf_counter() - start


async def train_model_run(rounds: int, probes: dict[int, int]) -> float:
    """Seconds for ``train_model`` over ``rounds`` rounds of the no-op process."""
    async with LocalContext():
        start = time.perf_counter()
        await train_model(
            train_process=NoOpProcess(probes),
            train_data_source=FakeDataSource(100),
            train_per_round_clients=10,
            train_total_rounds=rounds,
            program_state_manager=MemoryProgramStateManager(keep_total=3),
            model_output_manager=MemoryReleaseManager(max_entries=1),
            train_metrics_manager=MemoryReleaseManager(max_entries=100),
        )
        return time.perf_counter() - start


async def measure(rounds: int, repeats: int) -> dict[str, Any]:
    """Alternate both loops ``repeats`` times; medians resist the noise of a shared machine."""
    early_round = min(1_000, rounds)
    probes = {early_round: 0, rounds: 0}
    ours, theirs = [], []
    for _ in range(repeats):
        ours.append(await train_model_run(rounds, probes))
        theirs.append(await hand_written_loop(rounds))
    per_round = statistics.median(ours) / rounds * 1e6
    hand_written = statistics.median(theirs) / rounds * 1e6
    early, late = probes[early_round], probes[rounds]
    return {
        "benchmark": "train_model overhead",
        "rounds": rounds,
        "repeats": repeats,
        "train_model_per_round_us": round(per_round, 1),
        "hand_written_loop_per_round_us": round(hand_written, 1),
        "ratio_to_hand_written": round(per_round / hand_written, 2),
        f"rss_mib_round_{early_round}": round(early / 2**20, 2),
        f"rss_mib_round_{rounds}": round(late / 2**20, 2),
        "rss_growth_ratio": round(late / early, 4),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=10_000)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--backend", choices=["asyncio", "trio"], default="asyncio")
    arguments = parser.parse_args()
    result = anyio.run(measure, arguments.rounds, arguments.repeats, backend=arguments.backend)
    result["backend"] = arguments.backend
    print(json.dumps(result))


if __name__ == "__main__":
    main()
