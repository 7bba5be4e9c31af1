"""A release manager of our own: keeps a run's metrics and streams them to listeners.

Implementing your own: subclass :class:`managers.ReleaseManager`, write ``release(value,
key)`` (and ``aclose``), and hand it to ``train_model`` like any built-in one.
"""

from __future__ import annotations

import csv
import math
from collections.abc import AsyncIterator, Iterable
from pathlib import Path
from typing import Any

import anyio
import numpy as np

from managers import ReleaseManager, check_key, materialize
from managers.structure import flatten

__all__ = ["LiveMetricsReleaseManager", "Point", "read_points"]

Point = dict[str, Any]
"""One release: ``{"round": key, "metrics": {path: number}}``."""
TRAINING, EVALUATION = "metrics", "evaluation"


class LiveMetricsReleaseManager(ReleaseManager):
    """Keeps the released training metrics (and, through its ``evaluation`` attribute,
    the held-out ones) as points of the finite numbers by path, and streams them.

    One point per kind and key: a key released again (a resumed run releases its
    checkpoint's round once more) replaces the kept point and is not streamed again.
    """

    def __init__(self, history: Iterable[Point] = (), evaluations: Iterable[Point] = ()) -> None:
        self._points = {(TRAINING, point["round"]): point for point in history}
        self._points |= {(EVALUATION, point["round"]): point for point in evaluations}
        self._changed, self._closed = anyio.Event(), False
        self.evaluation = _Evaluations(self)

    def points(self, kind: str = TRAINING) -> list[Point]:
        """The points of ``kind`` (``"metrics"`` or ``"evaluation"``) kept so far."""
        return [point for (each, _), point in self._points.items() if each == kind]

    def latest(self, kind: str = TRAINING) -> Point | None:
        """The last point of ``kind``, or ``None`` before the first."""
        return next(reversed(self.points(kind)), None)

    async def release(self, value: Any, key: int | str) -> None:
        await self.publish(TRAINING, value, key)

    async def publish(self, kind: str, value: Any, key: int | str) -> None:
        """Keep ``value`` as the point of ``kind`` at ``key``."""
        check_key(key)
        if self._closed:
            raise RuntimeError("this LiveMetricsReleaseManager is closed")
        self._points[kind, key] = {"round": key, "metrics": numbers(await materialize(value))}
        self._changed.set()
        self._changed = anyio.Event()

    async def stream(self) -> AsyncIterator[tuple[str, Point]]:
        """``(kind, point)`` of each key in the order first released, until closed."""
        sent = 0
        while True:
            changed, closed = self._changed, self._closed
            new = list(self._points.items())[sent:]  # a replaced point keeps its place
            sent += len(new)
            for (kind, _), point in new:
                yield kind, point
            if closed:
                return
            await changed.wait()

    async def aclose(self) -> None:
        """End every stream; later releases raise ``RuntimeError``."""
        self._closed = True
        self._changed.set()


class _Evaluations(ReleaseManager):
    def __init__(self, live: LiveMetricsReleaseManager) -> None:
        self.live = live

    async def release(self, value: Any, key: int | str) -> None:
        await self.live.publish(EVALUATION, value, key)


def numbers(value: Any) -> dict[str, float]:
    """The finite numeric scalars of ``value`` by path; other leaves are left out."""
    found = {}
    for path, leaf in flatten(value):
        array = np.asarray(leaf)
        if array.size == 1 and array.dtype.kind in "iuf":
            if math.isfinite(number := float(array.reshape(()))):
                found[path.lstrip("/") or "value"] = number
    return found


def read_points(path: Path) -> list[Point]:
    """The points of a metrics CSV file (rounds in its ``key`` column); none if missing."""
    try:
        with open(path, newline="") as file:
            rows = list(csv.DictReader(file))
    except FileNotFoundError:
        return []
    return [
        {"round": int(row.pop("key")), "metrics": numbers({n: _float(t) for n, t in row.items()})}
        for row in rows
        if (row.get("key") or "").isdigit()
    ]


def _float(text: str | None) -> float:
    try:
        return float(text or "nan")
    except ValueError:
        return math.nan
