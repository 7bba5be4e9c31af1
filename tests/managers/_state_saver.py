"""A process that saves program states until it is killed: the SIGKILL test's victim.

Run as ``python _state_saver.py BACKEND``, it imports everything, prints ``ready`` and
then serves commands read from stdin, one a line:

- ``start ROOT VERSION``: fork a child that saves :func:`expected_state` of VERSION,
  VERSION + 1, ... into a FileProgramStateManager on ROOT, printing ``saving V`` before
  and ``saved V`` after each save; this process prints ``child PID`` after the fork,
  and ``exited PID STATUS`` once the child has died (the test kills it with SIGKILL);
- ``quit`` (or the end of stdin): exit.

Forking from a process that has already imported numpy and the managers makes a new
saver start in milliseconds instead of the half second an interpreter takes, so the
test can kill many savers within its time budget. Each child is a process of its own,
which the kernel kills as abruptly as any.
"""

from __future__ import annotations

import importlib
import os
import sys
import traceback

import anyio
import numpy as np

from managers.state.file import FileProgramStateManager

KEEP_TOTAL = 3


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


async def save_forever(root: str, start: int) -> None:
    async with FileProgramStateManager(root, keep_total=KEEP_TOTAL) as manager:
        version = start
        while True:
            report(f"saving {version}")
            await manager.save(expected_state(version), version)
            report(f"saved {version}")
            version += 1


def serve(backend: str) -> None:
    importlib.import_module(f"anyio._backends._{backend}")  # else each child imports it
    report("ready")
    for line in sys.stdin:
        command, *arguments = line.split()
        if command == "quit":
            return
        root, start = arguments[0], int(arguments[1])
        pid = os.fork()
        if pid == 0:
            try:
                anyio.run(save_forever, root, start, backend=backend)
            except BaseException:
                traceback.print_exc()
            finally:
                os._exit(1)
        report(f"child {pid}")
        _, status = os.waitpid(pid, 0)
        report(f"exited {pid} {status}")


if __name__ == "__main__":
    serve(sys.argv[1])
