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
    """A running cluster with an empty database ``tuning``: its SQLAlchemy URL."""
    bin_dir = postgres_bin()
    # Short and under /tmp: a unix socket's path has at most 107 bytes.
    base = Path(tempfile.mkdtemp(prefix="programlogic-pg-"))
    data, port = base / "data", _free_port()
    try:
        if os.geteuid() == 0:
            shutil.chown(base, "postgres", "postgres")
        initdb = [bin_dir / "initdb", "-D", data, "-U", "postgres", "--auth=trust"]
        _as_postgres([*initdb, "-E", "UTF8", "--locale=C", "--no-sync"], base)
        options = f"-k {base} -c listen_addresses='' -p {port} -F"
        # -l: the server writes to a file, not to our pipes, which would keep them open.
        pg_ctl = [bin_dir / "pg_ctl", "-D", data]
        _as_postgres([*pg_ctl, "-l", base / "server.log", "-o", options, "-w", "start"], base)
        try:
            url = f"postgresql+psycopg://postgres@/{DATABASE}?host={base}&port={port}"
            admin = postgres_conninfo(url.replace(f"/{DATABASE}?", "/postgres?"))
            with psycopg.connect(admin, autocommit=True) as connection:
                connection.execute(f"CREATE DATABASE {DATABASE}")
            yield url
        finally:
            _as_postgres([*pg_ctl, "-m", "immediate", "-w", "stop"], base)
    finally:
        shutil.rmtree(base, ignore_errors=True)
