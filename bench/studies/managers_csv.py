"""Time of CSVFileReleaseManager.release per row, and whether it stays flat as the file grows.

Releases a two-metric row (``{"loss": np.float32(k), "accuracy": np.float32(0.5)}``) for
keys 1 to ``--rows`` into a new file in a temporary directory, timing each release. Prints
one JSON line: the mean time per row over the first 1,000 rows and over the last 1,000
rows (microseconds) and their ratio (flat is about 1), and the overall mean (ms) with the
speed-up over TFF 0.87's CSV release, measured at 2.6-3.8 ms a row on this machine
(see DESIGN.md; we aim for at least 10x), and the process CPU time per row (both threads),
which other load on the machine disturbs less than the wall-clock times. The first row
creates the file, so it is not counted in the means.

    python bench/studies/managers_csv.py [--rows 10000] [--window 1000] [--backend asyncio|trio]
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

import anyio
import numpy as np

from managers.release.csv_file import CSVFileReleaseManager

TFF_MS_PER_ROW = (2.6, 3.8)


async def time_releases(path: Path, rows: int) -> tuple[list[float], float]:
    """Seconds taken by each release, keys 1 to ``rows``; CPU seconds of all but the first."""
    timings = []
    async with CSVFileReleaseManager(path) as manager:
        for key in range(1, rows + 1):
            value = {"loss": np.float32(key), "accuracy": np.float32(0.5)}
            if key == 2:
                cpu_start = time.process_time()
            start = time.perf_counter()
            await manager.release(value, key)
            timings.append(time.perf_counter() - start)
        cpu = time.process_time() - cpu_start
    return timings, cpu


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=10_000)
    parser.add_argument("--window", type=int, default=1_000)
    parser.add_argument("--backend", choices=["asyncio", "trio"], default="asyncio")
    arguments = parser.parse_args()
    if arguments.rows < 2 * arguments.window + 1:
        parser.error("--rows must be more than twice --window")
    with tempfile.TemporaryDirectory() as directory:
        path = Path(directory) / "metrics.csv"
        timings, cpu = anyio.run(time_releases, path, arguments.rows, backend=arguments.backend)
        lines = path.read_text(encoding="utf-8").count("\n")
    if lines != arguments.rows + 1:
        raise RuntimeError(f"the file has {lines} lines, not a header and {arguments.rows} rows")
    counted = timings[1:]
    first = statistics.fmean(counted[: arguments.window])
    last = statistics.fmean(counted[-arguments.window :])
    overall_ms = statistics.fmean(counted) * 1e3
    print(
        json.dumps(
            {
                "benchmark": "csv_release",
                "backend": arguments.backend,
                "rows": arguments.rows,
                "first_window_us": round(first * 1e6, 1),
                "last_window_us": round(last * 1e6, 1),
                "last_over_first": round(last / first, 3),
                "mean_ms": round(overall_ms, 4),
                "median_ms": round(statistics.median(counted) * 1e3, 4),
                "cpu_ms": round(cpu / len(counted) * 1e3, 4),
                "speedup_vs_tff": [round(ms / overall_ms, 1) for ms in TFF_MS_PER_ROW],
            }
        )
    )


if __name__ == "__main__":
    main()
