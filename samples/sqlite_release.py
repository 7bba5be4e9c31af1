"""A release manager of your own: metrics in an SQLite database, a row per key.

Its tests are the library's contract suite (``tests/samples/test_sqlite_release.py``)::

    async with SQLiteReleaseManager("runs/metrics.db") as metrics:
        await train_model(..., train_metrics_manager=metrics)

The table ``releases(key PRIMARY KEY, value TEXT)`` holds each key once: a round number
as an SQLite integer, a named release as text (so ``1`` and ``'1'`` are two keys).
``value`` is a JSON object of the value's leaves by path, which SQLite's JSON functions
read::

    SELECT key, value ->> '$."client_work/train/loss"' FROM releases ORDER BY key;
"""

from __future__ import annotations

import os
import sqlite3
from pathlib import Path
from typing import Any

import anyio
import anyio.to_thread
import numpy as np
import orjson

from managers import ReleaseKey, ReleaseManager, check_key, materialize
from managers.structure import flatten

__all__ = ["SQLiteReleaseManager"]

_SCHEMA = "CREATE TABLE IF NOT EXISTS releases (key PRIMARY KEY, value TEXT NOT NULL)"
_JSON_LEAVES = (type(None), bool, int, float, str, np.bool_, np.integer, np.floating)


class SQLiteReleaseManager(ReleaseManager):
    """Writes each release as one row of the ``releases`` table of the database at ``path``.

    Releasing a key again replaces its row (``INSERT OR REPLACE``), so a resumed program
    leaves each round once, whatever order keys come in. Leaves are stored as JSON:
    numbers, text, booleans, ``None``, and numpy scalars and arrays of those (arrays as
    nested lists); any other leaf raises ``TypeError`` naming its path, and nothing of
    that release is written. Releases are written one at a time, in call order, each in
    a transaction of its own and in a worker thread, so the event loop never waits on the
    disk. The database is opened on the first release; ``aclose`` closes it (a later
    release opens it again).
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self._path = Path(path)
        self._connection: sqlite3.Connection | None = None
        self._lock: anyio.Lock | None = None

    async def release(self, value: Any, key: ReleaseKey) -> None:
        check_key(key)
        if self._lock is None:
            self._lock = anyio.Lock()
        async with self._lock:  # call order is write order: the last call of a key wins
            row = _json_by_path(await materialize(value))
            await anyio.to_thread.run_sync(self._write, key, row)

    async def aclose(self) -> None:
        if self._lock is None:
            self._lock = anyio.Lock()
        with anyio.CancelScope(shield=True):  # leaving `async with` on cancellation closes too
            async with self._lock:
                connection, self._connection = self._connection, None
                if connection is not None:
                    await anyio.to_thread.run_sync(connection.close)

    def _write(self, key: ReleaseKey, row: str) -> None:
        if self._connection is None:
            self._path.parent.mkdir(parents=True, exist_ok=True)
            # One worker thread at a time uses the connection: calls hold the lock.
            self._connection = sqlite3.connect(self._path, check_same_thread=False)
            self._connection.execute(_SCHEMA)
        with self._connection:  # a transaction: committed, or rolled back on error
            self._connection.execute(
                "INSERT OR REPLACE INTO releases (key, value) VALUES (?, ?)", (key, row)
            )


def _json_by_path(value: Any) -> str:
    """``value``'s leaves as a JSON object keyed by path (``""`` for a lone leaf)."""
    leaves = {}
    for path, leaf in flatten(value):
        if isinstance(leaf, np.ndarray) and leaf.dtype.kind in "biuf":
            leaves[path] = leaf.tolist()
        elif isinstance(leaf, _JSON_LEAVES):
            leaves[path] = leaf.item() if isinstance(leaf, np.generic) else leaf
        else:
            raise TypeError(f"cannot store the {type(leaf).__name__} leaf at {path!r} as JSON")
    return orjson.dumps(leaves).decode()
