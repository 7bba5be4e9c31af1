"""Running an anchor script of ../shared/anchors as a process, for the benchmarks."""

from __future__ import annotations

import os
import signal
import subprocess
import tempfile


def run_anchor_process(command: list[str]) -> tuple[int, str, str]:
    """Run ``command`` to its end; its exit status, stdout and stderr.

    TFF starts a worker_binary that outlives the anchor and keeps its stdout open, so the
    anchor runs in a session of its own, its output goes to files, and whatever of its
    process group is left when it exits is ended.
    """
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        anchor = subprocess.Popen(command, stdout=out, stderr=err, start_new_session=True)
        try:
            returncode = anchor.wait()
        finally:
            try:
                os.killpg(anchor.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass  # nothing was left
        out.seek(0)
        err.seek(0)
        return returncode, out.read(), err.read()
