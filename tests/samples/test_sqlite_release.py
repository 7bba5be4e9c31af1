"""The SQLite release manager of the samples, checked by the library's contract suite."""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

import anyio.to_thread
import numpy as np
import orjson
import pytest

from managers.structure import flatten
from programlogic.testing.contracts import Capabilities, ReleaseManagerContract, ReleaseSubject
from sqlite_release import SQLiteReleaseManager


def _nest(leaves: dict[str, Any]) -> Any:
    """Nested dicts from leaves by path; the leaf itself for the path ``""``."""
    if list(leaves) == [""]:
        return leaves[""]
    nested: dict[str, Any] = {}
    for path, leaf in leaves.items():
        *parents, name = path.split("/")
        node = nested
        for parent in parents:
            node = node.setdefault(parent, {})
        node[name] = leaf
    return nested


def _as_stored(value: Any) -> Any:
    """A released value as the table holds it: leaves by path, arrays as lists."""
    return _nest(
        {
            path: leaf.tolist() if isinstance(leaf, np.ndarray | np.generic) else leaf
            for path, leaf in flatten(value)
        }
    )


def _read(path: Path) -> dict[Any, Any]:
    """The table's rows, read with a connection of its own."""
    if not path.exists():
        return {}
    with sqlite3.connect(path) as connection:
        rows = connection.execute("SELECT key, value FROM releases").fetchall()
    connection.close()
    return {key: _nest(orjson.loads(value)) for key, value in rows}


class TestSQLiteReleaseManager(ReleaseManagerContract):
    @pytest.fixture
    def subject(self, tmp_path: Path) -> ReleaseSubject:
        path = tmp_path / "metrics.db"
        return ReleaseSubject(
            manager=SQLiteReleaseManager(path),
            read_back=lambda: anyio.to_thread.run_sync(_read, path),
            capabilities=Capabilities(normalize=_as_stored),
            reopen=lambda: SQLiteReleaseManager(path),
        )

    async def test_a_leaf_json_cannot_hold_raises_type_error_naming_its_path(
        self, subject: ReleaseSubject
    ) -> None:
        async with subject.manager as manager:
            await manager.release({"loss": 0.5}, 1)
            with pytest.raises(TypeError, match=r"cannot store the bytes leaf at 'model/blob'"):
                await manager.release({"loss": 0.25, "model": {"blob": b"\x00"}}, 1)
        assert await subject.read_back() == {1: {"loss": 0.5}}

    async def test_sqlite_json_functions_read_a_metric_by_path(self, tmp_path: Path) -> None:
        path = tmp_path / "metrics.db"
        async with SQLiteReleaseManager(path) as manager:
            for round_number in (2, 1, 3):
                metrics = {"client_work": {"train": {"loss": 1 / round_number}}}
                await manager.release(metrics, round_number)

        def losses() -> list[tuple[int, float]]:
            with sqlite3.connect(path) as connection:
                query = "SELECT key, value ->> '$.\"client_work/train/loss\"' FROM releases"
                rows = connection.execute(f"{query} ORDER BY key").fetchall()
            connection.close()
            return rows

        assert await anyio.to_thread.run_sync(losses) == [(1, 1.0), (2, 0.5), (3, 1 / 3)]
