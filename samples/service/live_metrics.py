"""A release manager of our own: keeps a run's metrics and streams each new one to listeners.

The example of "implement your own release manager": subclass
:class:`managers.ReleaseManager`, write ``release(value, key)`` (and ``aclose`` if there
is something to close), and hand an instance to ``train_model`` like any built-in one.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import AsyncIterator, Iterator, Mapping
from typing import Any

import anyio
import numpy as np
from anyio.abc import ObjectReceiveStream, ObjectSendStream

from managers import ReleaseManager
from managers.release.base import check_key
from managers.structure import flatten
from managers.values import materialize

__all__ = ["LiveMetricsReleaseManager", "Point"]

Point = dict[str, Any]
"""One release: ``{"round": key, "metrics": {path: number}}``."""

LISTENER_BUFFER = 1000
"""Points a listener may fall behind by before it is dropped (it can reconnect)."""


class LiveMetricsReleaseManager(ReleaseManager):
    """Keeps every released point in memory and sends each new one to every listener.

    A point holds the numeric leaves of the released value by path
    (``client_work/train/loss``); text and arrays of more than one number are left out.
    ``listen()`` gives the points released so far and a stream of the ones to come;
    the stream ends when the manager is closed (the run is over). A listener that falls
    :data:`LISTENER_BUFFER` points behind is dropped rather than slowing training down.

    One point per key: a key released again (a resumed run releases its checkpoint's
    round once more, and a checkpoint cadence may replay several rounds) replaces the
    kept point in its place and is not streamed again, so a listener gets each key once.
    """

    def __init__(self, history: list[Point] | None = None) -> None:
        self._points: dict[int | str, Point] = {}
        for point in history or []:
            self._points[point["round"]] = point
        self._listeners: set[ObjectSendStream[Point]] = set()
        self._closed = False

    @property
    def points(self) -> list[Point]:
        """Every point released so far (and the history it was created with)."""
        return list(self._points.values())

    @property
    def latest(self) -> Point | None:
        """The last point, or ``None`` before the first release."""
        return next(reversed(self._points.values()), None)

    async def release(self, value: Any, key: int | str) -> None:
        check_key(key)
        if self._closed:
            raise RuntimeError("this LiveMetricsReleaseManager is closed")
        point = {"round": key, "metrics": numbers(await materialize(value))}
        replayed = key in self._points
        self._points[key] = point
        if replayed:
            return
        for listener in list(self._listeners):
            try:
                listener.send_nowait(point)
            except anyio.WouldBlock:
                self._listeners.discard(listener)
                listener.close()  # too slow: its stream ends, and it may reconnect

    async def aclose(self) -> None:
        """End every listener's stream; later releases raise ``RuntimeError``."""
        self._closed = True
        for listener in self._listeners:
            listener.close()
        self._listeners.clear()

    @contextlib.contextmanager
    def listen(self) -> Iterator[tuple[list[Point], ObjectReceiveStream[Point]]]:
        """The points so far and a stream of the next ones, until the manager closes."""
        send, receive = anyio.create_memory_object_stream[Point](LISTENER_BUFFER)
        if self._closed:
            send.close()
        else:
            self._listeners.add(send)
        try:
            with receive:
                yield list(self._points.values()), receive
        finally:
            self._listeners.discard(send)
            send.close()


def numbers(value: Any) -> dict[str, float]:
    """The finite numeric scalars of ``value`` by path; other leaves are left out."""
    found = {}
    for path, leaf in flatten(value):
        if isinstance(leaf, bool) or leaf is None or isinstance(leaf, str | bytes):
            continue
        if isinstance(leaf, int | float):
            number = float(leaf)
        elif isinstance(leaf, np.ndarray | np.generic) and np.size(leaf) == 1:
            if np.asarray(leaf).dtype.kind not in "iuf":
                continue
            number = float(np.asarray(leaf).reshape(()))
        else:
            continue
        if math.isfinite(number):
            found[path.lstrip("/") or "value"] = number
    return found


async def stream_points(
    manager: LiveMetricsReleaseManager,
) -> AsyncIterator[Point]:
    """The points of ``manager``: those released so far, then each new one until it closes."""
    with manager.listen() as (past, upcoming):
        for point in past:
            yield point
        async for point in upcoming:
            yield point


def from_rows(rows: list[Mapping[str, str]], key_column: str = "key") -> list[Point]:
    """Points from the rows of a metrics CSV file (as :class:`csv.DictReader` reads them)."""
    points = []
    for row in rows:
        try:
            key: int | str = int(row[key_column])
        except (KeyError, ValueError):
            continue
        metrics = {}
        for column, text in row.items():
            if column == key_column or not text:
                continue
            try:
                number = float(text)
            except ValueError:
                continue
            if math.isfinite(number):
                metrics[column] = number
        points.append({"round": key, "metrics": metrics})
    return points
