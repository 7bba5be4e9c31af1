"""The body of a pool actor, and where its process lives."""

from __future__ import annotations

import collections
import os
import socket
from collections.abc import Callable
from pathlib import Path
from typing import Any

from programlogic.contexts.units import compute_unit
from programlogic.data import TableLoader

__all__ = ["CACHED_FUNCTIONS", "ClientWorker", "machine", "process_exists"]

CACHED_FUNCTIONS = 16
"""How many client functions a context (and each actor) keeps shipped; the oldest go first."""


class ClientWorker:
    """The body of a pool actor: computes units of client work, caching what it unpickled.

    Its methods run in the actor's process, where Ray's errors are those of the unit's
    task: the driver translates them when it awaits the unit's result.
    """

    def __init__(self) -> None:
        self._functions: collections.OrderedDict[str, Any] = collections.OrderedDict()
        self._tables: dict[str, Any] = {}

    def ready(self) -> tuple[str, int]:
        """The actor's machine (see :func:`machine`) and process id, once the actor is up."""
        return machine(), os.getpid()

    def run_unit(
        self,
        fn_key: str,
        fn_box: list[Any],
        broadcast: Any,
        client_ids: list[str],
        loaders: list[tuple[Any, ...]],
        grouped: bool,
    ) -> list[Any]:
        """The results of one unit of client work (see :func:`compute_unit`)."""
        import ray

        fn = self._functions.get(fn_key)
        if fn is None:
            fn = self._functions[fn_key] = ray.get(fn_box[0])
            if len(self._functions) > CACHED_FUNCTIONS:
                self._functions.popitem(last=False)
        return compute_unit(fn, broadcast, client_ids, [self._loader(s) for s in loaders], grouped)

    def _loader(self, shipped: tuple[Any, ...]) -> Callable[[], Any]:
        if shipped[0] == "loader":
            return shipped[1]
        _, key, box, client_id = shipped
        table = self._tables.get(key)
        if table is None:
            import ray

            table = self._tables[key] = ray.get(box[0])
        return TableLoader(table, client_id)


def machine() -> str:
    """Names this machine (or container): where a process id names the same process."""
    try:
        boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        boot = ""
    return f"{socket.gethostname()} {boot}"


def process_exists(pid: int) -> bool:
    """Whether process ``pid`` of this machine exists (it may be exiting)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's: it exists
        return True
    return True
