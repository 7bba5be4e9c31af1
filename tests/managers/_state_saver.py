"""A process that saves program states until it kills itself: the SIGKILL test's victim.

Run as ``python _state_saver.py BACKEND``, it imports everything, prints ``ready`` and
then serves commands read from stdin, one a line:

- ``start ROOT VERSION POINT``: fork a child that saves :func:`expected_state` of
  VERSION, VERSION + 1, ... into a FileProgramStateManager on ROOT, printing ``saving V``
  before and ``saved V`` after each save, and that kills itself with SIGKILL the first
  time it reaches POINT (one of :data:`KILL_POINTS`) after its first complete save; this
  process prints ``child PID`` after the fork, and ``exited PID STATUS`` once the child
  has died;
- ``quit`` (or the end of stdin): exit.

The kill points, in the order a save reaches them:

- ``writing``: half of the payload is in the temporary file;
- ``written``: the payload is written and fsynced, the temporary file not yet renamed;
- ``renamed``: renamed to the version's name, the directory not yet fsynced;
- ``retiring``: retention is about to retire an old version;
- ``saved``: the save has returned, the next one has not begun.

The child reaches them through wrappers around what the file manager's module calls
(its ``write_all``, ``os.replace`` and ``fsync_directory``): the kill lands at the
chosen instant on any machine, however fast or loaded. Each child is a process of its
own, which SIGKILL ends as abruptly as any crash. Forking from a process that has
already imported numpy and the managers starts a saver in milliseconds.
"""

from __future__ import annotations

import importlib
import os
import signal
import sys
import traceback
from pathlib import Path
from typing import Any

import anyio
import numpy as np

import managers.state.file as file_module
from managers.state.file import FileProgramStateManager

KEEP_TOTAL = 3
KILL_POINTS = ("writing", "written", "renamed", "retiring", "saved")


def expected_state(version: int) -> dict:
    """The state saved as ``version``: a pure function of it."""
    rng = np.random.default_rng(version)
    return {
        "weights": rng.random(200_000, dtype=np.float32),
        "bias": rng.standard_normal(10),
        "round": version,
        "name": f"version-{version}",
    }


def report(line: str) -> None:
    """Write one line in one system call, so that a kill never leaves half of it."""
    os.write(sys.stdout.fileno(), f"{line}\n".encode())


class _Killer:
    """Kills this process at ``point`` once armed (after the child's first save)."""

    def __init__(self, point: str) -> None:
        if point not in KILL_POINTS:
            raise ValueError(f"point must be one of {KILL_POINTS}, got {point!r}")
        self.point = point
        self.armed = False

    def reached(self, point: str) -> None:
        if self.armed and point == self.point:
            os.kill(os.getpid(), signal.SIGKILL)


class _OsWatchingReplace:
    """The ``os`` module as the file manager sees it, with its renames watched."""

    def __init__(self, killer: _Killer) -> None:
        self._killer = killer

    def __getattr__(self, name: str) -> Any:
        return getattr(os, name)

    def replace(self, source: Any, destination: Any) -> None:
        retiring = Path(destination).name.startswith(".retired_")
        self._killer.reached("retiring" if retiring else "written")
        os.replace(source, destination)


def _install(killer: _Killer) -> None:
    """Route the file manager's writes, renames and directory fsyncs through ``killer``."""
    write_all, fsync_directory = file_module.write_all, file_module.fsync_directory

    def writing(fd: int, buffers: list[memoryview]) -> int:
        if killer.armed and killer.point == "writing":
            payload = b"".join(buffer.cast("B") for buffer in buffers)
            os.write(fd, payload[: len(payload) // 2])
            killer.reached("writing")
        return write_all(fd, buffers)

    def renamed(directory: Path) -> None:
        killer.reached("renamed")
        fsync_directory(directory)

    file_module.write_all = writing
    file_module.fsync_directory = renamed
    file_module.os = _OsWatchingReplace(killer)


async def save_until_killed(root: str, start: int, killer: _Killer) -> None:
    async with FileProgramStateManager(root, keep_total=KEEP_TOTAL) as manager:
        version = start
        while True:
            report(f"saving {version}")
            await manager.save(expected_state(version), version)
            report(f"saved {version}")
            killer.reached("saved")
            killer.armed = True
            version += 1


def serve(backend: str) -> None:
    importlib.import_module(f"anyio._backends._{backend}")  # else each child imports it
    report("ready")
    for line in sys.stdin:
        command, *arguments = line.split()
        if command == "quit":
            return
        root, start, point = arguments[0], int(arguments[1]), arguments[2]
        pid = os.fork()
        if pid == 0:
            try:
                killer = _Killer(point)
                _install(killer)
                anyio.run(save_until_killed, root, start, killer, backend=backend)
            except BaseException:
                traceback.print_exc()
            finally:
                os._exit(1)
        report(f"child {pid}")
        _, status = os.waitpid(pid, 0)
        report(f"exited {pid} {status}")


if __name__ == "__main__":
    serve(sys.argv[1])
