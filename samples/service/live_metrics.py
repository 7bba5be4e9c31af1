"""A release manager of our own: keeps a run's metrics and streams each new one to listeners.

The example of "implement your own release manager": subclass
:class:`managers.ReleaseManager`, write ``release(value, key)`` (and ``aclose`` if there
is something to close), and hand an instance to ``train_model`` like any built-in one.
"""

from __future__ import annotations

import math
from collections.abc import AsyncIterator, Iterable, Mapping
from typing import Any

import anyio
import numpy as np
from anyio.abc import ObjectSendStream

from managers import ReleaseManager, check_key, materialize
from managers.structure import flatten

__all__ = ["LISTENER_BUFFER", "LiveMetricsReleaseManager", "Point", "from_rows", "stream_points"]

Point = dict[str, Any]
"""One release: ``{"round": key, "metrics": {path: number}}``."""
TRAINING, EVALUATION = "metrics", "evaluation"
LISTENER_BUFFER = 1000
"""Points a listener may fall behind by before it is dropped (it can reconnect)."""


class LiveMetricsReleaseManager(ReleaseManager):
    """Keeps every released point in memory and sends each new one to every listener.

    It takes training metrics; its ``evaluation`` attribute, a release manager too,
    takes the held-out ones, each point named by its kind (``"metrics"`` or
    ``"evaluation"``). A point holds the finite numeric leaves of the released value by
    path (``client_work/train/loss``). One point per kind and key: a key released again
    (a resumed run releases its checkpoint's round once more) replaces the kept point
    and is not streamed again. A listener that falls :data:`LISTENER_BUFFER` points
    behind is dropped rather than slowing training down; closing the manager (the run
    is over) ends every listener's stream.
    """

    def __init__(self, history: Iterable[Point] = (), evaluations: Iterable[Point] = ()) -> None:
        self._points = {(TRAINING, point["round"]): point for point in history}
        self._points |= {(EVALUATION, point["round"]): point for point in evaluations}
        self._listeners: set[ObjectSendStream[tuple[str, Point]]] = set()
        self._closed = False
        self.evaluation = _Evaluations(self)

    def points(self, kind: str = TRAINING) -> list[Point]:
        """The points of ``kind`` released so far (and the history it was created with)."""
        return [point for (each, _), point in self._points.items() if each == kind]

    def latest(self, kind: str = TRAINING) -> Point | None:
        """The last point of ``kind``, or ``None`` before the first."""
        return next(reversed(self.points(kind)), None)

    async def release(self, value: Any, key: int | str) -> None:
        await self.publish(TRAINING, value, key)

    async def publish(self, kind: str, value: Any, key: int | str) -> None:
        """Keep ``value`` as the point of ``kind`` at ``key``, and stream it if it is new."""
        check_key(key)
        if self._closed:
            raise RuntimeError("this LiveMetricsReleaseManager is closed")
        point = {"round": key, "metrics": numbers(await materialize(value))}
        replayed = (kind, key) in self._points
        self._points[kind, key] = point
        for listener in [] if replayed else list(self._listeners):
            try:
                listener.send_nowait((kind, point))
            except anyio.WouldBlock:  # too slow: its stream ends, and it may reconnect
                self._listeners.discard(listener)
                listener.close()

    async def aclose(self) -> None:
        """End every listener's stream; later releases raise ``RuntimeError``."""
        self._closed = True
        for listener in self._listeners:
            listener.close()
        self._listeners.clear()


class _Evaluations(ReleaseManager):
    def __init__(self, live: LiveMetricsReleaseManager) -> None:
        self.live = live

    async def release(self, value: Any, key: int | str) -> None:
        await self.live.publish(EVALUATION, value, key)


async def stream_points(manager: LiveMetricsReleaseManager) -> AsyncIterator[tuple[str, Point]]:
    """``(kind, point)`` pairs of ``manager``: those so far, then each new one until it closes."""
    send, receive = anyio.create_memory_object_stream[tuple[str, Point]](LISTENER_BUFFER)
    past = [(kind, point) for (kind, _), point in manager._points.items()]
    if manager._closed:
        send.close()
    else:
        manager._listeners.add(send)
    try:
        with receive:
            for pair in past:
                yield pair
            async for pair in receive:
                yield pair
    finally:
        manager._listeners.discard(send)
        send.close()


def numbers(value: Any) -> dict[str, float]:
    """The finite numeric scalars of ``value`` by path; other leaves are left out."""
    found = {}
    for path, leaf in flatten(value):
        kind = np.asarray(leaf).dtype.kind if np.size(leaf) == 1 else ""
        if kind in ("i", "u", "f") and not isinstance(leaf, bool | str | bytes):
            number = float(np.asarray(leaf).reshape(()))
            if math.isfinite(number):
                found[path.lstrip("/") or "value"] = number
    return found


def from_rows(rows: Iterable[Mapping[str, str]], key_column: str = "key") -> list[Point]:
    """Points from the rows of a metrics CSV file (as :class:`csv.DictReader` reads them)."""
    points = []
    for row in rows:
        key = row.get(key_column) or ""
        if key.isdigit():
            metrics = {name: _number(text) for name, text in row.items() if name != key_column}
            points.append(
                {"round": int(key), "metrics": {k: v for k, v in metrics.items() if v is not None}}
            )
    return points


def _number(text: str | None) -> float | None:
    try:
        number = float(text or "nan")
    except ValueError:
        return None
    return number if math.isfinite(number) else None
