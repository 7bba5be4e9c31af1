"""The work of the federated-context suite, and how its tests watch the files it writes.

The client work and server steps are module-level functions, so that workers in other
processes can import them (or get them by value: see the package's docstring).
"""

from __future__ import annotations

import functools
import os
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import anyio

from programlogic.data import ClientHandle

WAIT_LIMIT_S = 60.0
"""How long a piece of the suite's work waits for a file another piece writes.

The wait ends as soon as the file appears; the limit only matters when the context
breaks a promise (the file never comes), and then the test fails instead of hanging.
"""

WORK_S = 1.0
"""How long the client work of the cancellation test computes (it is cancelled meanwhile)."""


def _constant(value: Any) -> Any:
    return value


def _handles(count: int) -> list[ClientHandle]:
    """Clients ``c0``, ``c1``, ... whose data is their index."""
    return [ClientHandle(f"c{i}", functools.partial(_constant, i)) for i in range(count)]


def _where(*_: Any) -> tuple[int, int]:
    """The process and thread this runs on."""
    return os.getpid(), threading.get_ident()


def _echo(broadcast: Any, client_id: str, data: Any) -> tuple[Any, str, Any]:
    return broadcast, client_id, data


def _data_of(broadcast: Any, client_id: str, data: Any) -> Any:
    return data


def _group_echo(broadcast: int, client_ids: Sequence[str], datas: Sequence[int]) -> list[tuple]:
    return [
        (cid, broadcast + data, len(client_ids))
        for cid, data in zip(client_ids, datas, strict=True)
    ]


def _append(total: list[Any], result: Any) -> list[Any]:
    return [*total, result]


def _add_value(total: int, result: tuple[str, int, int]) -> int:
    return total + result[1]


def _raise_key_error(message: str) -> None:
    raise KeyError(message)


def _broken_loader() -> Any:
    raise FileNotFoundError("the client's file is gone")


def _fail_on_c3(broadcast: Any, client_id: str, data: Any) -> Any:
    if client_id == "c3":
        raise ZeroDivisionError("no examples on c3")
    return data


def _group_fail_on_c3(broadcast: Any, client_ids: Sequence[str], datas: Sequence[Any]) -> list:
    if "c3" in client_ids:
        raise ZeroDivisionError("no examples on c3")
    return list(datas)


def _wait_until_exists(path: Path) -> bool:
    """Whether ``path`` appeared within :data:`WAIT_LIMIT_S` (checked every few ms)."""
    deadline = time.monotonic() + WAIT_LIMIT_S
    while not path.exists():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.002)
    return True


def _wait_for_go(directory: str, client_id: str, data: Any = None) -> bool:
    """Mark this work started, wait for the file ``go``, mark it ended; whether go came."""
    folder = Path(directory)
    (folder / f"started-{client_id}").touch()
    try:
        return _wait_until_exists(folder / "go")
    finally:
        (folder / f"ended-{client_id}").touch()


def _finish_pairs_in_reverse(
    broadcast: tuple[str, int, int], client_id: str, data: int
) -> tuple[str, int]:
    """With parallelism, client 2i waits until client 2i + 1 has finished: results arrive
    out of order."""
    directory, count, parallelism = broadcast
    folder = Path(directory)
    if parallelism >= 2 and data % 2 == 0 and data + 1 < count:
        _wait_until_exists(folder / f"done-c{data + 1}")
    with open(folder / "finished", "a") as log:  # one short append: atomic
        log.write(f"{client_id}\n")
    (folder / f"done-{client_id}").touch()
    return client_id, data * 10


def _last_waits_for_the_first_to_be_folded(
    broadcast: tuple[str, int], client_id: str, data: int
) -> bool | None:
    """The last client returns whether the first client's result was folded before it ended."""
    consumed, count = broadcast
    if data != count - 1:
        return None
    return _wait_until_exists(Path(consumed))


def _work_a_while(directory: str, client_id: str, data: Any) -> None:
    """Client work of :data:`WORK_S` that marks its start (with its process id) and end."""
    folder = Path(directory)
    partial = folder / f"partial-{client_id}"
    partial.write_text(str(os.getpid()))
    partial.replace(folder / f"started-{client_id}")  # whole, or not there at all
    try:
        time.sleep(WORK_S)
    finally:
        (folder / f"ended-{client_id}").touch()


def _markers(folder: Path, prefix: str) -> dict[str, str]:
    """What the marker files ``<prefix><client id>`` in ``folder`` hold, by client id."""
    return {path.name.removeprefix(prefix): path.read_text() for path in folder.glob(f"{prefix}*")}


def _alive(pid: int) -> bool:
    """Whether the process ``pid`` still runs (this process always does)."""
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


async def _until_exists(path: Path) -> None:
    """Wait on the event loop until ``path`` exists; fail after :data:`WAIT_LIMIT_S`."""
    with anyio.fail_after(WAIT_LIMIT_S):
        while not path.exists():
            await anyio.sleep(0.002)
