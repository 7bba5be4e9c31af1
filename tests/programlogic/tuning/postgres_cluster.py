"""A throwaway PostgreSQL cluster for the tests of tuners that share a study.

The cluster is Debian's PostgreSQL (``apt-get install postgresql``, which ``.ci/run``
does), started from a fresh ``initdb`` in a temporary directory and listening on a unix
socket only; its data goes when the session ends.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import socket
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from sqlalchemy.engine import make_url

from programlogic.tuning._locks import postgres_conninfo

DATABASE = "tuning"


def postgres_bin(installs: Path = Path("/usr/lib/postgresql")) -> Path:
    """The ``bin`` directory of the newest PostgreSQL under ``installs``, or a failed test."""
    found = [path.parent for path in installs.glob("*/bin/initdb")]
    if not found:
        pytest.fail(
            "the PostgreSQL tests start their own cluster from Debian's PostgreSQL, and "
            "/usr/lib/postgresql/*/bin/initdb is missing: apt-get install postgresql "
            "(.ci/run does)"
        )
    return max(found, key=lambda path: _version(path.parent.name))


def _version(name: str) -> tuple[int, ...]:
    return tuple(int(part) for part in re.findall(r"\d+", name))


def _free_port() -> int:
    # The server opens no TCP socket; the port names its unix socket, and keys its shared
    # memory on older PostgreSQL, so two clusters of one machine had better differ.
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _as_postgres(command: list[str | Path], base: Path) -> None:
    """Run ``command`` as the ``postgres`` user when we are root (initdb refuses root)."""
    prefix = ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []
    result = subprocess.run(
        [*prefix, *map(str, command)], cwd=base, capture_output=True, text=True, check=False
    )
    if result.returncode != 0:
        log = base / "server.log"
        server_log = log.read_text() if log.exists() else ""
        raise RuntimeError(
            f"{command[0]} failed ({result.returncode}):\n{result.stdout}{result.stderr}"
            f"{server_log}"
        )


@contextlib.contextmanager
def postgres_cluster() -> Iterator[str]:
    """A running cluster with an empty database ``tuning``: its SQLAlchemy URL.

    :func:`stop_cluster` and :func:`start_cluster` stop and start it again on its data.
    """
    bin_dir = postgres_bin()
    # Short and under /tmp: a unix socket's path has at most 107 bytes.
    base = Path(tempfile.mkdtemp(prefix="programlogic-pg-"))
    url = f"postgresql+psycopg://postgres@/{DATABASE}?host={base}&port={_free_port()}"
    try:
        if os.geteuid() == 0:
            shutil.chown(base, "postgres", "postgres")
        initdb = [bin_dir / "initdb", "-D", base / "data", "-U", "postgres", "--auth=trust"]
        _as_postgres([*initdb, "-E", "UTF8", "--locale=C", "--no-sync"], base)
        start_cluster(url)
        try:
            admin = postgres_conninfo(url.replace(f"/{DATABASE}?", "/postgres?"))
            with psycopg.connect(admin, autocommit=True) as connection:
                connection.execute(f"CREATE DATABASE {DATABASE}")
            yield url
        finally:
            if (base / "data" / "postmaster.pid").exists():  # a test may have stopped it
                stop_cluster(url)
    finally:
        shutil.rmtree(base, ignore_errors=True)


def _pg_ctl(url: str, *arguments: str | Path) -> None:
    query = make_url(url).query
    base, port = Path(str(query["host"])), query["port"]
    pg_ctl = [postgres_bin() / "pg_ctl", "-D", base / "data"]
    options = f"-k {base} -c listen_addresses='' -p {port} -F"
    # -l: the server writes to a file, not to our pipes, which would keep them open.
    _as_postgres([*pg_ctl, "-l", base / "server.log", "-o", options, *arguments], base)


def start_cluster(url: str) -> None:
    """Start the cluster of a :func:`postgres_cluster` URL, waiting until it serves."""
    _pg_ctl(url, "-w", "start")


def stop_cluster(url: str) -> None:
    """Stop the cluster of a :func:`postgres_cluster` URL at once, as a crash does: its
    connections break, and its data stays to start it again."""
    _pg_ctl(url, "-m", "immediate", "-w", "stop")
