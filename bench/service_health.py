"""How fast the sample service answers while two runs train in it.

Starts ``python -m samples.service`` on a loopback port, times ``GET /health``
``--requests`` times while the service is idle (the baseline), then starts two runs
(federated averaging on the digits, each on its own worker thread) and, once both are
training, times as many requests again. Requests go one at a time, 10 ms apart, over
one kept-alive connection. The target: every answer within 50 ms while two runs train.
Prints a table, then one JSON line.

    python bench/service_health.py [--requests 300]
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import anyio
import httpx

REPO = Path(__file__).resolve().parent.parent
TARGET_MS = 50.0
TOKEN = "bench-token-0123456789abcdef"


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


async def wait_until_up(client: httpx.AsyncClient, server: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + 120
    while True:
        if server.poll() is not None or time.monotonic() > deadline:
            sys.exit("service_health: the service did not start")
        try:
            if (await client.get("/health")).status_code == 200:
                return
        except httpx.TransportError:
            pass
        await anyio.sleep(0.2)


async def health_times(client: httpx.AsyncClient, count: int) -> list[float]:
    """Milliseconds of ``count`` health requests, one at a time, 10 ms apart."""
    times = []
    for _ in range(count):
        start = time.perf_counter()
        response = await client.get("/health")
        times.append((time.perf_counter() - start) * 1e3)
        response.raise_for_status()
        await anyio.sleep(0.01)
    return times


def summary(times: list[float]) -> dict[str, float]:
    ordered = sorted(times)
    return {
        "median_ms": statistics.median(ordered),
        "p99_ms": ordered[min(len(ordered) - 1, round(0.99 * (len(ordered) - 1)))],
        "max_ms": ordered[-1],
    }


async def measure(requests: int, data_dir: Path) -> dict[str, Any]:
    port = free_port()
    env = {**os.environ, "PROGRAMLOGIC_SERVICE_TOKEN": TOKEN}
    command = [sys.executable, "-m", "samples.service", "--data-dir", str(data_dir)]
    with (data_dir.parent / "server.log").open("w") as log:
        server = subprocess.Popen(
            [*command, "--port", str(port)], cwd=REPO, env=env, stdout=log, stderr=log
        )
    try:
        async with httpx.AsyncClient(
            base_url=f"http://127.0.0.1:{port}",
            headers={"Authorization": f"Bearer {TOKEN}"},
            timeout=30,
        ) as client:
            await wait_until_up(client, server)
            idle = await health_times(client, requests)
            runs = [
                (await client.post("/runs", json={"rounds": 1_000_000, "seed": seed})).json()
                for seed in range(2)
            ]
            while True:  # both compiled and training
                rounds = [(await client.get(f"/runs/{run['id']}")).json()["round"] for run in runs]
                if min(rounds) >= 3:
                    break
                await anyio.sleep(0.2)
            before = rounds
            start = time.perf_counter()
            training = await health_times(client, requests)
            elapsed = time.perf_counter() - start
            after = [(await client.get(f"/runs/{run['id']}")).json()["round"] for run in runs]
            for run in runs:
                await client.delete(f"/runs/{run['id']}")
    finally:
        server.send_signal(signal.SIGTERM)
        try:
            server.wait(timeout=60)
        except subprocess.TimeoutExpired:
            server.kill()
    rounds_per_s = [(b - a) / elapsed for a, b in zip(before, after, strict=True)]
    return {
        "requests": requests,
        "idle": summary(idle),
        "two_runs_training": summary(training),
        "rounds_per_s_each_run": rounds_per_s,
        "target_ms": TARGET_MS,
        "met": max(training) < TARGET_MS,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=300)
    arguments = parser.parse_args()
    if arguments.requests < 1:
        parser.error("--requests must be at least 1")
    with tempfile.TemporaryDirectory(prefix="service_health_") as scratch:
        result = anyio.run(measure, arguments.requests, Path(scratch) / "data")
    idle, busy = result["idle"], result["two_runs_training"]
    print("GET /health      median ms  p99 ms  max ms")
    print(
        f"idle             {idle['median_ms']:9.2f}  {idle['p99_ms']:6.2f}  {idle['max_ms']:6.2f}"
    )
    print(
        f"two runs train   {busy['median_ms']:9.2f}  {busy['p99_ms']:6.2f}  {busy['max_ms']:6.2f}"
        f"   (runs at {' and '.join(f'{r:.1f}' for r in result['rounds_per_s_each_run'])}"
        " rounds/s)"
    )
    print(
        f"max while training / {TARGET_MS:.0f} ms target: {busy['max_ms'] / TARGET_MS:.2f}; "
        f"median while training / idle median: {busy['median_ms'] / idle['median_ms']:.2f}"
    )
    print(json.dumps({"benchmark": "service health", **result}))


if __name__ == "__main__":
    main()
