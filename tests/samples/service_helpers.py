"""What the service tests share: talking to the app in-process or to a real server."""

from __future__ import annotations

import contextlib
import os
import pathlib
import signal
import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from typing import Any

import anyio
import httpx
import orjson

from samples.service.app import create_app

REPO = pathlib.Path(__file__).parent.parent.parent
TOKEN = "test-token-0123456789abcdef"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
IN_PROCESS_URL = "http://127.0.0.1:8000"


@contextlib.asynccontextmanager
async def in_process(data_dir: pathlib.Path, **options: Any) -> AsyncIterator[httpx.AsyncClient]:
    """A client of the app over ``data_dir``, started and, on leaving, shut down.

    The client talks to it as to one listening on ``127.0.0.1:8000`` (its ``Host``).
    """
    app = create_app(data_dir, **options)
    async with (
        app.router.lifespan_context(app),
        httpx.AsyncClient(transport=httpx.ASGITransport(app), base_url=IN_PROCESS_URL) as client,
    ):
        yield client


def events(body: str) -> list[tuple[str, Any]]:
    """The ``(event, data)`` pairs of a server-sent event stream."""
    found = []
    for block in body.replace("\r\n", "\n").split("\n\n"):
        fields = dict(line.split(": ", 1) for line in block.splitlines() if ": " in line)
        if "event" in fields:
            found.append((fields["event"], orjson.loads(fields["data"])))
    return found


async def wait_for_round(
    client: httpx.AsyncClient, run_id: str, round_num: int, *, headers: Any = None
) -> dict[str, Any]:
    """The run's summary once it released ``round_num`` (at most 120 s from now)."""
    deadline = time.monotonic() + 120
    while True:
        response = await client.get(f"/runs/{run_id}", headers=headers)
        run = response.json()
        if run["round"] >= round_num:
            return run
        assert run["status"] == "running", run
        assert time.monotonic() < deadline, f"run {run_id} is at round {run['round']}"
        await anyio.sleep(0.1)


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


# A shutdown grace no run's cancellation outlasts, for tests of a graceful shutdown.
GRACEFUL = ("--shutdown-grace", "120")


class Server:
    """``python -m samples.service`` on a loopback port, as a user starts it."""

    def __init__(
        self, data_dir: pathlib.Path, log: pathlib.Path, *options: str, token: str = TOKEN
    ) -> None:
        self.starts = log.read_text().count("Started server process") + 1 if log.exists() else 1
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        env = {**os.environ, "PROGRAMLOGIC_SERVICE_TOKEN": token}
        command = [sys.executable, "-m", "samples.service", "--data-dir", str(data_dir)]
        with log.open("a") as output:
            self.process = subprocess.Popen(
                [*command, "--port", str(self.port), *options],
                cwd=REPO,
                env=env,
                stdout=output,
                stderr=subprocess.STDOUT,
            )
        self.log = log

    async def wait_until_up(self) -> None:
        deadline = time.monotonic() + 120
        async with httpx.AsyncClient(base_url=self.url) as client:
            while True:
                assert self.process.poll() is None, self.log.read_text()
                assert time.monotonic() < deadline, self.log.read_text()
                with contextlib.suppress(httpx.TransportError):
                    if (await client.get("/health")).status_code == 200:
                        return
                await anyio.sleep(0.2)

    def terminate(self) -> None:
        """SIGTERM, as a service manager stops it; returns once it shut down gracefully.

        Only a service given a grace long enough for its runs to stop (GRACEFUL) is sure
        to shut down gracefully on a loaded machine; with the default grace it may end
        at the grace's end instead (exit status 143).
        """
        self.process.send_signal(signal.SIGTERM)
        returncode = self.process.wait(timeout=90)
        # uvicorn shuts down, then ends itself by the signal it caught.
        assert returncode == -signal.SIGTERM, self.log.read_text()
        assert self.log.read_text().count("Application shutdown complete.") == self.starts

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait()


@contextlib.contextmanager
def serving(data_dir: pathlib.Path, log: pathlib.Path, *options: str) -> Iterator[Server]:
    """``python -m samples.service`` with ``options``; killed on leaving if still running."""
    server = Server(data_dir, log, *options)
    try:
        yield server
    finally:
        server.kill()
