"""Save and load times of FileProgramStateManager against plain Python file I/O.

For states of 7,850, 1,000,000 and 10,000,000 float32 parameters (``{"weights": array,
"round": np.int64, "optimizer": {"lr": np.float32}}``), measures in the same run:

- the manager's ``save`` (keep_total=3, so retention retires a file on most saves) and
  ``load_latest``;
- the baseline: plain Python writing the array's bytes to a new file
  (``arr.tobytes()``, ``write``, ``os.fsync``) and reading them back (``read()``),
  alternating with the manager's calls.

Prints one JSON line per size: median times in milliseconds and the ratios
``save / raw_write`` and ``load / raw_read``. The files go to a temporary directory
under ``--dir`` (default: the system's temporary directory; pick one on the disk you
care about).

    python bench/studies/managers_state.py [--saves 20] [--dir PATH] [--backend asyncio|trio]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from pathlib import Path

import anyio
import numpy as np

from managers.state.file import FileProgramStateManager

SIZES = (7_850, 1_000_000, 10_000_000)


def make_state(size: int) -> dict:
    weights = np.random.default_rng(size).random(size, dtype=np.float32)
    return {"weights": weights, "round": np.int64(1), "optimizer": {"lr": np.float32(0.1)}}


async def measure(directory: Path, state: dict, saves: int) -> dict[str, float]:
    """Median seconds of each operation; the manager's and the baseline's alternate, so
    that both see the same disk (its speed drifts with what else the machine does)."""
    weights = state["weights"]
    # The baseline's files are deleted only at the end: deleting a file costs time on
    # some disks, and would then fall into the timing of the manager's next save.
    raw_directory = directory / "raw"
    raw_directory.mkdir()
    times: dict[str, list[float]] = {"save": [], "load": [], "raw_write": [], "raw_read": []}
    async with FileProgramStateManager(directory / "state", keep_total=3) as manager:
        await manager.get_versions()  # open the directory outside the timings
        for version in range(saves):
            path = raw_directory / f"raw_{version}.bin"
            start = time.perf_counter()
            with open(path, "wb") as file:
                file.write(weights.tobytes())
                file.flush()
                os.fsync(file.fileno())
            times["raw_write"].append(time.perf_counter() - start)
            start = time.perf_counter()
            with open(path, "rb") as file:
                data = file.read()
            times["raw_read"].append(time.perf_counter() - start)
            assert len(data) == weights.nbytes
            del data

            start = time.perf_counter()
            await manager.save(state, version)
            times["save"].append(time.perf_counter() - start)
            start = time.perf_counter()
            loaded, _ = await manager.load_latest()
            times["load"].append(time.perf_counter() - start)
            assert np.array_equal(loaded["weights"], weights)
            del loaded
    return {name: statistics.median(values) for name, values in times.items()}


async def main(saves: int, parent: str | None) -> None:
    for size in SIZES:
        state = make_state(size)
        with tempfile.TemporaryDirectory(dir=parent) as scratch:
            median = await measure(Path(scratch), state, saves)
        save, load = median["save"], median["load"]
        raw_write, raw_read = median["raw_write"], median["raw_read"]
        print(
            json.dumps(
                {
                    "params": size,
                    "bytes": state["weights"].nbytes,
                    "saves": saves,
                    "save_ms": round(save * 1e3, 3),
                    "load_latest_ms": round(load * 1e3, 3),
                    "raw_write_fsync_ms": round(raw_write * 1e3, 3),
                    "raw_read_ms": round(raw_read * 1e3, 3),
                    "save_over_raw_write": round(save / raw_write, 3),
                    "load_over_raw_read": round(load / raw_read, 3),
                }
            ),
            flush=True,
        )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--saves", type=int, default=20)
    parser.add_argument("--dir", default=None, help="parent of the scratch directory")
    parser.add_argument("--backend", default="asyncio", choices=["asyncio", "trio"])
    arguments = parser.parse_args()
    anyio.run(main, arguments.saves, arguments.dir, backend=arguments.backend)
