"""The sample service under a burst of POSTs: how fast it answers, its memory, its stop.

Starts ``python -m samples.service`` (``--max-running 4``, ``--shutdown-grace 5``) in a
child process on a loopback port, then:

- sends ``--posts`` ``POST /runs`` at once from another process, each on its own
  connection (CNN runs of a million rounds), and times each answer (201 for the
  admitted, 429 for the others);
- meanwhile times ``GET /health``, one request at a time, 10 ms apart, on a kept-alive
  connection: during the burst ("posts": first POST sent to last answer) and after it
  while the admitted runs build, trace and compile, until each trained 3 rounds
  ("starting");
- samples the service's resident memory every 50 ms (peak, against the memory after
  startup);
- then sends SIGTERM and times until the process has ended.

Targets: every POST answered within 1 s; ``/health`` p99 within 50 ms during the burst;
peak memory bounded by the cap, within startup + 4 x 300 MB whatever ``--posts``; the
SIGTERM-to-exit time is printed (the service waits at most its grace, 5 s). Prints a
table, then one JSON line.

    python bench/service_load.py [--posts 100]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import anyio
import httpx
import psutil

REPO = Path(__file__).resolve().parent.parent
TOKEN = "bench-token-0123456789abcdef"
MAX_RUNNING = 4
GRACE_S = 5
POST_TARGET_MS = 1000.0
HEALTH_TARGET_MS = 50.0
RUN_BUDGET_MB = 300.0
WARM_ROUNDS = 3


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def summary(times: list[float]) -> dict[str, float]:
    if not times:
        return {"count": 0, "p50_ms": float("nan"), "p99_ms": float("nan"), "max_ms": float("nan")}
    ordered = sorted(times)

    def rank(fraction: float) -> float:
        return ordered[min(len(ordered) - 1, round(fraction * (len(ordered) - 1)))]

    return {"count": len(ordered), "p50_ms": rank(0.5), "p99_ms": rank(0.99), "max_ms": ordered[-1]}


async def wait_until_up(client: httpx.AsyncClient, server: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + 120
    while True:
        if server.poll() is not None or time.monotonic() > deadline:
            sys.exit("service_load: the service did not start")
        try:
            if (await client.get("/health")).status_code == 200:
                return
        except httpx.TransportError:
            pass
        await anyio.sleep(0.2)


async def sample_memory(process: psutil.Process, peak: list[float], stop: anyio.Event) -> None:
    while not stop.is_set():
        try:
            peak[0] = max(peak[0], process.memory_info().rss / 2**20)
        except psutil.NoSuchProcess:
            return
        await anyio.sleep(0.05)


async def measure(posts: int, data_dir: Path) -> dict[str, Any]:
    port = free_port()
    env = {**os.environ, "PROGRAMLOGIC_SERVICE_TOKEN": TOKEN, "TF_CPP_MIN_LOG_LEVEL": "3"}
    command = [
        sys.executable,
        "-m",
        "samples.service",
        "--data-dir",
        str(data_dir),
        "--port",
        str(port),
        "--max-running",
        str(MAX_RUNNING),
        "--shutdown-grace",
        str(GRACE_S),
    ]
    with (data_dir.parent / "server.log").open("w") as log:
        server = subprocess.Popen(command, cwd=REPO, env=env, stdout=log, stderr=log)
    base_url = f"http://127.0.0.1:{port}"
    headers = {"Authorization": f"Bearer {TOKEN}"}
    result: dict[str, Any] = {"posts": posts, "max_running": MAX_RUNNING}
    try:
        async with (
            httpx.AsyncClient(base_url=base_url, headers=headers, timeout=300) as health_client,
            httpx.AsyncClient(base_url=base_url, headers=headers, timeout=300) as control,
        ):
            await wait_until_up(health_client, server)
            process = psutil.Process(server.pid)
            idle_mb = process.memory_info().rss / 2**20
            peak = [idle_mb]
            health: list[tuple[float, float]] = []  # (sent at, milliseconds)
            done = anyio.Event()

            async def time_health() -> None:
                while not done.is_set():
                    sent, start = time.monotonic(), time.perf_counter()
                    (await health_client.get("/health")).raise_for_status()
                    health.append((sent, (time.perf_counter() - start) * 1e3))
                    await anyio.sleep(0.01)

            async with anyio.create_task_group() as group:
                group.start_soon(sample_memory, process, peak, done)
                group.start_soon(time_health)
                # The burst comes from another process: this one's CPU time for 100
                # requests must not delay the health requests it times.
                command = [sys.executable, __file__, "--burst", base_url, "--posts", str(posts)]
                fired = json.loads((await anyio.run_process(command)).stdout)
                while True:
                    rounds = [
                        (await control.get(f"/runs/{run_id}")).json()["round"]
                        for run_id in fired["started"]
                    ]
                    if min(rounds, default=WARM_ROUNDS) >= WARM_ROUNDS:
                        break
                    await anyio.sleep(0.2)
                done.set()
            during = [ms for sent, ms in health if fired["first"] <= sent <= fired["last"]]
            statuses = fired["statuses"]
            result.update(
                {
                    "answers": {str(code): statuses.count(code) for code in sorted(set(statuses))},
                    "post": summary(fired["times_ms"]),
                    "health_posts": summary(during),
                    "health_starting": summary([ms for sent, ms in health if sent > fired["last"]]),
                    "rss_idle_mb": idle_mb,
                    "rss_peak_mb": peak[0],
                    "load_average_1min": os.getloadavg()[0],
                }
            )
    finally:
        start = time.perf_counter()
        server.send_signal(signal.SIGTERM)
        try:
            returncode = server.wait(timeout=120)
        except subprocess.TimeoutExpired:
            server.kill()
            returncode = server.wait()
        result["sigterm_to_exit_s"] = time.perf_counter() - start
        result["exit_status"] = returncode
    budget = result["rss_idle_mb"] + MAX_RUNNING * RUN_BUDGET_MB
    result["met"] = {
        "posts_within_1s": result["post"]["max_ms"] <= POST_TARGET_MS,
        "health_p99_within_50ms": result["health_posts"]["p99_ms"] <= HEALTH_TARGET_MS,
        "peak_rss_within_cap_budget": result["rss_peak_mb"] <= budget,
        "admitted_at_most_cap": result["answers"].get("201", 0) <= MAX_RUNNING,
    }
    result["rss_budget_mb"] = budget
    return result


async def burst(base_url: str, posts: int) -> None:
    """``posts`` POST /runs at once, each on its own connection; prints what came back."""
    headers = {"Authorization": f"Bearer {TOKEN}"}
    times_ms: list[float] = []
    statuses: list[int] = []
    started: list[str] = []

    async def post(client: httpx.AsyncClient, seed: int) -> None:
        config = {"rounds": 1_000_000, "model": "cnn", "seed": seed}
        start = time.perf_counter()
        answer = await client.post("/runs", json=config)
        times_ms.append((time.perf_counter() - start) * 1e3)
        statuses.append(answer.status_code)
        if answer.status_code == 201:
            started.append(answer.json()["id"])

    async with contextlib.AsyncExitStack() as stack:
        # Made beforehand: making a client takes milliseconds that would be timed.
        clients = [
            await stack.enter_async_context(
                httpx.AsyncClient(base_url=base_url, headers=headers, timeout=300)
            )
            for _ in range(posts)
        ]
        first = time.monotonic()  # the system's clock: the parent compares its own
        async with anyio.create_task_group() as group:
            for seed, client in enumerate(clients):
                group.start_soon(post, client, seed)
        last = time.monotonic()
    answer = {"first": first, "last": last, "times_ms": times_ms}
    print(json.dumps({**answer, "statuses": statuses, "started": started}))


def report(result: dict[str, Any]) -> None:
    def line(name: str, figures: dict[str, float]) -> str:
        return (
            f"{name:22} {figures['count']:5d}   {figures['p50_ms']:8.1f} {figures['p99_ms']:8.1f}"
            f" {figures['max_ms']:8.1f}"
        )

    print(f"{result['posts']} concurrent POST /runs, --max-running {result['max_running']}")
    print("                       count   p50 ms   p99 ms   max ms")
    print(line("POST /runs", result["post"]))
    print(line("/health during posts", result["health_posts"]))
    print(line("/health starting", result["health_starting"]))
    print(f"answers: {result['answers']}")
    print(
        f"resident memory: {result['rss_idle_mb']:.0f} MB after startup, peak"
        f" {result['rss_peak_mb']:.0f} MB (budget {result['rss_budget_mb']:.0f} MB)"
    )
    print(
        f"SIGTERM to exit: {result['sigterm_to_exit_s']:.2f} s (exit status"
        f" {result['exit_status']}); load {result['load_average_1min']:.1f}"
    )
    for target, met in result["met"].items():
        print(f"{target}: {'met' if met else 'missed'}")
    print(json.dumps({"benchmark": "service load", **result}))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--posts", type=int, default=100)
    parser.add_argument("--burst", metavar="URL", help=argparse.SUPPRESS)
    arguments = parser.parse_args()
    if arguments.burst is not None:
        anyio.run(burst, arguments.burst, arguments.posts)
        return
    if arguments.posts < 1:
        parser.error("--posts must be at least 1")
    with tempfile.TemporaryDirectory(prefix="service_load_") as scratch:
        data_dir = Path(scratch) / "data"
        data_dir.mkdir()
        result = anyio.run(measure, arguments.posts, data_dir)
    report(result)


if __name__ == "__main__":
    main()
