"""Disk writes in worker threads: one manager's in order, several managers' in one call.

A file-based manager hands its writes to its own :class:`WriteQueue`. Outside a batch,
``await queue.submit(write)`` makes the write in a worker thread and returns when it is
made, as a manager's ``save`` or ``release`` promises. Inside
:meth:`WriteBatch.gathering`, ``submit`` only queues the write and returns at once; the
batch's :meth:`~WriteBatch.flush` then makes every write gathered, of every manager, in
the order they were submitted, in a single worker-thread call. That is how a caller who
saves a checkpoint and releases its metrics to several file managers pays for one thread
hop instead of one per manager, and how it can put off the writes of a round it does
not need on disk yet.

A queue makes its writes one at a time and in order, each once, whoever asks: a write
submitted outside the batch first makes the ones gathered before it. When a write
fails, the writes queued after it in the same queue are dropped (not made), and the
queue's ``on_dropped`` callback tells its manager that its file lacks them.
"""

from __future__ import annotations

import collections
import contextlib
import contextvars
import enum
import threading
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import anyio.to_thread

from managers.validation import check_callable

__all__ = ["WriteBatch", "WriteQueue", "is_gathering"]

_T = TypeVar("_T")


class _Stage(enum.Enum):
    PENDING = "pending"
    MADE = "made"
    FAILED = "failed"
    DROPPED = "dropped"


class _Write:
    __slots__ = ("args", "error", "function", "queue", "result", "stage")

    def __init__(self, queue: WriteQueue, function: Callable[..., Any], args: tuple[Any, ...]):
        self.queue = queue
        self.function = function
        self.args = args
        self.stage = _Stage.PENDING
        self.result: Any = None
        self.error: BaseException | None = None

    def outcome(self) -> Any:
        """The write's result; its failure (or the one that dropped it) raised."""
        if self.error is not None:
            raise self.error
        return self.result


_gathering: contextvars.ContextVar[WriteBatch | None] = contextvars.ContextVar(
    "managers.writes gathering", default=None
)


def is_gathering() -> bool:
    """Whether the calling task is inside a :meth:`WriteBatch.gathering` block."""
    return _gathering.get() is not None


class WriteQueue:
    """One manager's disk writes, made in worker threads one at a time, in submission
    order, each once.

    ``on_dropped`` is called (from the thread that finds out, or from the event loop
    for :meth:`WriteBatch.drop`) when writes submitted to this queue will never be
    made, because one before them failed or their batch was dropped.
    """

    def __init__(self, on_dropped: Callable[[], None] | None = None) -> None:
        self._on_dropped = check_callable("on_dropped", on_dropped, allow_none=True)
        self._pending: collections.deque[_Write] = collections.deque()
        self._making = threading.Lock()  # held while writes are made: one maker at a time
        self._stages = threading.Lock()  # held while a write changes stage

    async def submit(self, function: Callable[..., Any], *args: Any) -> None:
        """``function(*args)`` in a worker thread, after the writes submitted before it.

        Inside :meth:`WriteBatch.gathering` it is only queued and made by the batch's
        flush; otherwise it is made now and its exception, if any, raised here.
        """
        write = self._queue(function, args)
        batch = _gathering.get()
        if batch is not None:
            batch.add(write)
            return
        await self._make_now(write)
        write.outcome()

    async def run(self, function: Callable[..., _T], *args: Any) -> _T:
        """``function(*args)`` in a worker thread, after every write submitted before it
        (gathered ones too); its result. Never gathered into a batch: for reads, and
        for writes whose result the caller needs."""
        write = self._queue(function, args)
        await self._make_now(write)
        return write.outcome()

    def _make_through(self, target: _Write) -> None:
        """Make this queue's writes up to and including ``target``; runs in a worker thread."""
        with self._making:
            while target.stage is _Stage.PENDING:
                with self._stages:
                    write = self._pending.popleft()
                    if write.stage is not _Stage.PENDING:
                        continue
                    write.stage = _Stage.MADE
                try:
                    write.result = write.function(*write.args)
                except BaseException as error:
                    write.stage, write.error = _Stage.FAILED, error
                    self._drop_pending(error)

    def _drop(self, writes: list[_Write], reason: BaseException) -> None:
        """Drop those of ``writes`` (this queue's) not made yet, and tell the manager."""
        if self._withdraw(writes, reason) and self._on_dropped is not None:
            self._on_dropped()

    def _withdraw(self, writes: list[_Write], reason: BaseException) -> bool:
        """Take those of ``writes`` not made yet out of the queue; whether there were any."""
        with self._stages:
            withdrawn = [write for write in writes if write.stage is _Stage.PENDING]
            for write in withdrawn:
                write.stage, write.error = _Stage.DROPPED, reason
                self._pending.remove(write)
        return bool(withdrawn)

    async def _make_now(self, write: _Write) -> None:
        try:
            await anyio.to_thread.run_sync(self._make_through, write)
        except BaseException as error:
            # Cancelled before its thread started (a started one is waited for): never
            # made, and the caller, not the manager, is told.
            self._withdraw([write], error)
            raise

    def _queue(self, function: Callable[..., Any], args: tuple[Any, ...]) -> _Write:
        write = _Write(self, function, args)
        with self._stages:
            self._pending.append(write)
        return write

    def _drop_pending(self, reason: BaseException) -> None:
        with self._stages:
            dropped = list(self._pending)
        self._drop(dropped, reason)


class WriteBatch:
    """Writes of several managers gathered, then made together in one worker-thread call.

    Inside :meth:`gathering`, a manager's write through its :class:`WriteQueue` returns
    as soon as it is queued; :meth:`flush` makes them all, in submission order, and
    raises the first failure (the writes after it are dropped: not made). Writes gathered
    and never flushed are made before their manager's next write, unless :meth:`drop`
    drops them.
    """

    def __init__(self) -> None:
        self._writes: list[_Write] = []

    @property
    def pending(self) -> int:
        """The number of writes gathered and not flushed or dropped yet."""
        return len(self._writes)

    @contextlib.contextmanager
    def gathering(self) -> Iterator[None]:
        """Gather the writes submitted in this block (and in tasks it starts) into this batch."""
        token = _gathering.set(self)
        try:
            yield
        finally:
            _gathering.reset(token)

    def add(self, write: _Write) -> None:
        """Gather ``write``, which its queue holds already."""
        self._writes.append(write)

    async def flush(self) -> None:
        """Make the gathered writes in one worker-thread call; raise the first failure."""
        writes, self._writes = self._writes, []
        if writes:
            await anyio.to_thread.run_sync(_make_all, writes)

    def drop(self, reason: BaseException | None = None) -> None:
        """Drop the gathered writes: they are never made (their managers are told)."""
        writes, self._writes = self._writes, []
        _drop(writes, reason or RuntimeError("the write batch was dropped before it was flushed"))


def _make_all(writes: list[_Write]) -> None:
    for index, write in enumerate(writes):
        write.queue._make_through(write)
        if write.error is not None:
            _drop(writes[index + 1 :], write.error)
            raise write.error


def _drop(writes: list[_Write], reason: BaseException) -> None:
    by_queue: dict[WriteQueue, list[_Write]] = {}
    for write in writes:
        by_queue.setdefault(write.queue, []).append(write)
    for queue, queued in by_queue.items():
        queue._drop(queued, reason)
