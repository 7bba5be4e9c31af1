"""A release manager of our own: keeps a run's metrics and streams them to listeners.

Implementing your own: subclass :class:`managers.ReleaseManager` (here its in-memory
:class:`managers.MemoryReleaseManager`), write ``release(value, key)`` (and ``aclose``),
and hand it to ``train_model`` like any built-in one.
"""

from __future__ import annotations

import csv
import math
from collections.abc import AsyncIterator, Iterable
from pathlib import Path
from typing import Any

import anyio
import numpy as np

from managers import MemoryReleaseManager, materialize
from managers.structure import flatten

__all__ = ["LiveMetrics", "Point", "numbers", "read_points", "stream"]

Point = dict[str, Any]
"""One release: ``{"round": key, "metrics": {path: number}}``."""


class LiveMetrics(MemoryReleaseManager):
    """Keeps the finite numbers of each release (:func:`numbers`) as the point of its key,
    after the points of ``history`` (those an earlier process released), and wakes the
    :func:`stream` over it. A key released again (a resumed run releases its checkpoint's
    round once more) replaces its point in place: it is not streamed again.
    """

    def __init__(self, history: Iterable[Point] = ()) -> None:
        super().__init__()
        self.history = {point["round"]: point["metrics"] for point in history}
        self.changed, self.closed = anyio.Event(), False

    async def release(self, value: Any, key: int | str) -> None:
        await super().release(numbers(await materialize(value)), key)
        self.changed.set()  # wakes the streams; they wait on the next one
        self.changed = anyio.Event()

    def points(self) -> list[Point]:
        """The points kept, in the order their keys were first released."""
        kept = self.history | self.values()
        return [{"round": key, "metrics": metrics} for key, metrics in kept.items()]

    def latest(self) -> Point | None:
        """The last point, or ``None`` before the first."""
        return next(reversed(self.points()), None)

    async def aclose(self) -> None:
        """End the streams over it."""
        self.closed = True
        self.changed.set()


async def stream(**managers: LiveMetrics) -> AsyncIterator[tuple[str, Point]]:
    """``(name, point)`` for each point of the ``managers`` by name, once each, as they are
    released, until all are closed."""
    sent = dict.fromkeys(managers, 0)
    while True:
        changes = [manager.changed for manager in managers.values() if not manager.closed]
        for name, manager in managers.items():
            for point in manager.points()[sent[name] :]:
                sent[name] += 1
                yield name, point
        if not changes:
            return
        async with anyio.create_task_group() as waiting:  # until one of them changes
            for change in changes:
                waiting.start_soon(_wake, change, waiting.cancel_scope)


async def _wake(change: anyio.Event, waiting: anyio.CancelScope) -> None:
    await change.wait()
    waiting.cancel()


def numbers(value: Any) -> dict[str, float]:
    """The finite numeric scalars of ``value`` by path; other leaves are left out."""
    arrays = {path.lstrip("/") or "value": np.asarray(leaf) for path, leaf in flatten(value)}
    return {
        path: float(array.item())
        for path, array in arrays.items()
        if array.size == 1 and array.dtype.kind in "iuf" and math.isfinite(array.item())
    }


def read_points(path: Path) -> list[Point]:
    """The points of a metrics CSV file (rounds in its ``key`` column); none if missing."""
    if not path.exists():
        return []
    with open(path, newline="") as file:
        rows = [row for row in csv.DictReader(file) if (row.get("key") or "").isdigit()]
    return [
        {"round": int(row.pop("key")), "metrics": numbers({p: _float(c) for p, c in row.items()})}
        for row in rows
    ]


def _float(cell: str | None) -> float:
    try:
        return float(cell or "nan")  # not a number: left out by numbers()
    except ValueError:
        return math.nan
