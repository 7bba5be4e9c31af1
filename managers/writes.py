"""Disk writes in worker threads: one manager's in order, several managers' in one call.

A file-based manager hands its writes to its own :class:`WriteQueue`.
``await queue.submit(write)`` makes the write in a worker thread and returns when it is
made, as a manager's ``save`` or ``release`` promises, whoever calls it.

Write batching is a seam a caller asks for explicitly, for speed. A manager that opts in
offers ``prepare_save`` (a state manager) or ``prepare_release`` (a release manager):
it does everything its ``save`` or ``release`` does up to the disk write, and returns
that write as a :class:`PreparedWrite` instead of making it. The caller adds the
prepared writes of several managers to a :class:`WriteBatch` and flushes it: every
write is made, in the order added, in a single worker-thread call. ``train_model``
makes a round's save and releases this way: one thread hop a round instead of one per
manager, and it counts the round saved only once the flush returned. A prepared write
is not made until its batch is flushed; nothing is gathered behind a caller's back,
and a manager that does not opt in is simply awaited.

A queue makes its writes one at a time and in order, each once, whoever asks: a write
submitted (or a read run) after a prepared write first makes the prepared one. When a
write fails, the writes queued after it in the same queue are dropped (not made), and
the queue's ``on_dropped`` callback tells its manager that its file lacks them.
"""

from __future__ import annotations

import collections
import enum
import threading
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import anyio.from_thread
import anyio.to_thread

from managers.validation import check_callable, check_type

__all__ = ["PreparedWrite", "WriteBatch", "WritePart", "WriteQueue", "preparer", "together"]

_T = TypeVar("_T")


class _Stage(enum.Enum):
    PENDING = "pending"
    MADE = "made"
    FAILED = "failed"
    DROPPED = "dropped"


class PreparedWrite:
    """A manager's write, queued and not made yet: what ``prepare_save`` and
    ``prepare_release`` return.

    Add it to a :class:`WriteBatch` and flush the batch to make it. Until then the
    manager's version or record is not written: its ``save`` or ``release`` has not
    happened. Its manager's next call makes it first (in that call's worker thread), so
    a prepared write is never lost by being forgotten; :meth:`WriteBatch.drop` withdraws
    it for good.
    """

    __slots__ = ("_args", "_error", "_function", "_queue", "_result", "_stage")

    def __init__(self, queue: WriteQueue, function: Callable[..., Any], args: tuple[Any, ...]):
        self._queue = queue
        self._function = function
        self._args = args
        self._stage = _Stage.PENDING
        self._result: Any = None
        self._error: BaseException | None = None

    @property
    def made(self) -> bool:
        """Whether the write has been made (successfully or not)."""
        return self._stage in (_Stage.MADE, _Stage.FAILED)

    async def make(self) -> None:
        """Make this write now, alone, in a worker thread (after the writes queued
        before it); raise its failure. A batch of one."""
        try:
            await anyio.to_thread.run_sync(self._make)
        except BaseException as error:
            # Cancelled before its thread started (a started one is waited for): never
            # made, and its manager is told.
            self._drop(error)
            raise
        self._outcome()

    def _make(self) -> None:
        """Make the write (and those queued before it); runs in a worker thread."""
        self._queue._make_through(self)

    def _drop(self, reason: BaseException) -> None:
        """Withdraw the write if it is not made yet, telling its manager."""
        self._queue._drop([self], reason)

    def _outcome(self) -> Any:
        """The write's result; its failure (or the one that dropped it) raised."""
        if self._error is not None:
            raise self._error
        return self._result


WritePart = PreparedWrite | Callable[[], Awaitable[None]] | Exception | None
"""A part of :func:`together`: a prepared write, a call to await, a failure, or nothing."""


class _WritesTogether(PreparedWrite):
    """Several managers' writes (or their failures), made together; see :func:`together`."""

    __slots__ = ("_combine", "_parts")

    def __init__(
        self, parts: list[WritePart], combine: Callable[[list[Exception]], Exception]
    ) -> None:
        super().__init__(None, None, ())  # type: ignore[arg-type]
        self._parts = parts
        self._combine = combine

    @property
    def made(self) -> bool:
        return self._stage is not _Stage.PENDING

    def _make(self) -> None:
        errors: list[Exception] = []
        for part in self._parts:
            if isinstance(part, PreparedWrite):
                part._make()
                part = part._error
            elif callable(part):
                try:
                    anyio.from_thread.run(part)
                except Exception as error:
                    part = error
                else:
                    part = None
            if isinstance(part, Exception):
                errors.append(part)
            elif part is not None:
                raise part  # a BaseException (an interrupt): not a failure to gather
        self._stage = _Stage.MADE
        if errors:
            self._stage, self._error = _Stage.FAILED, self._combine(errors)

    def _drop(self, reason: BaseException) -> None:
        if self._stage is _Stage.PENDING:
            self._stage, self._error = _Stage.DROPPED, reason
        for part in self._parts:
            if isinstance(part, PreparedWrite):
                part._drop(reason)


def together(
    parts: list[WritePart], combine: Callable[[list[Exception]], Exception]
) -> PreparedWrite:
    """One prepared write that makes each of ``parts``, whatever the others do.

    For a combinator that prepares the writes of the managers it wraps (as
    :class:`~managers.GroupingReleaseManager` does). A part is a :class:`PreparedWrite`;
    a coroutine function, for a manager that does not prepare its writes (its
    ``release``, bound to its arguments), awaited on the event loop when the write is
    made (the thread making it waits for it); ``None`` (nothing to write); or the
    ``Exception`` a manager raised while preparing. Parts are made one after another,
    in order; then, if any part failed, the write fails with ``combine(failures)``
    (failures in the order of ``parts``). Nothing of it is made before.
    """
    return _WritesTogether(list(parts), combine)


class WriteQueue:
    """One manager's disk writes, made in worker threads one at a time, in submission
    order, each once.

    ``on_dropped`` is called (from the thread that finds out, or from the event loop
    for :meth:`WriteBatch.drop`) when writes submitted to this queue will never be
    made, because one before them failed or their batch was dropped.
    """

    def __init__(self, on_dropped: Callable[[], None] | None = None) -> None:
        self._on_dropped = check_callable("on_dropped", on_dropped, allow_none=True)
        self._pending: collections.deque[PreparedWrite] = collections.deque()
        self._making = threading.Lock()  # held while writes are made: one maker at a time
        self._stages = threading.Lock()  # held while a write changes stage

    async def submit(self, function: Callable[..., Any], *args: Any) -> None:
        """``function(*args)`` in a worker thread, after the writes queued before it;
        returns once it is made, raising its exception, if any."""
        await self.prepare(function, *args).make()

    async def run(self, function: Callable[..., _T], *args: Any) -> _T:
        """``function(*args)`` in a worker thread, after every write queued before it
        (prepared ones too); its result."""
        write = self.prepare(function, *args)
        try:
            await anyio.to_thread.run_sync(self._make_through, write)
        except BaseException as error:
            # Cancelled before its thread started (a started one is waited for): never
            # made, and the caller, not the manager, is told.
            self._withdraw([write], error)
            raise
        return write._outcome()

    def prepare(self, function: Callable[..., Any], *args: Any) -> PreparedWrite:
        """Queue ``function(*args)`` without making it: a :class:`WriteBatch` flush, or
        this queue's next call, makes it."""
        write = PreparedWrite(self, function, args)
        with self._stages:
            self._pending.append(write)
        return write

    def _make_through(self, target: PreparedWrite) -> None:
        """Make this queue's writes up to and including ``target``; runs in a worker thread."""
        with self._making:
            while target._stage is _Stage.PENDING:
                with self._stages:
                    write = self._pending.popleft()
                    if write._stage is not _Stage.PENDING:
                        continue
                    write._stage = _Stage.MADE
                try:
                    write._result = write._function(*write._args)
                except BaseException as error:
                    write._stage, write._error = _Stage.FAILED, error
                    self._drop_pending(error)

    def _drop(self, writes: list[PreparedWrite], reason: BaseException) -> None:
        """Drop those of ``writes`` (this queue's) not made yet, and tell the manager."""
        if self._withdraw(writes, reason) and self._on_dropped is not None:
            self._on_dropped()

    def _withdraw(self, writes: list[PreparedWrite], reason: BaseException) -> bool:
        """Take those of ``writes`` not made yet out of the queue; whether there were any."""
        with self._stages:
            withdrawn = [write for write in writes if write._stage is _Stage.PENDING]
            for write in withdrawn:
                write._stage, write._error = _Stage.DROPPED, reason
                self._pending.remove(write)
        return bool(withdrawn)

    def _drop_pending(self, reason: BaseException) -> None:
        with self._stages:
            dropped = list(self._pending)
        self._drop(dropped, reason)


class WriteBatch:
    """Prepared writes of several managers, made together in one worker-thread call.

    :meth:`add` the writes that managers' ``prepare_save`` / ``prepare_release``
    returned, then :meth:`flush`: it makes them in the order added and raises the first
    failure (the writes after it are dropped: not made). :meth:`drop` withdraws what was
    not flushed. A cancelled flush whose thread had started waits for it, so every write
    added is then made or dropped, none half made.
    """

    def __init__(self) -> None:
        self._writes: list[PreparedWrite] = []

    @property
    def pending(self) -> int:
        """The number of writes added and not flushed or dropped yet."""
        return len(self._writes)

    def add(self, write: PreparedWrite) -> None:
        """Make ``write`` with the batch's next flush."""
        self._writes.append(check_type("write", write, PreparedWrite))

    async def flush(self) -> None:
        """Make the writes added in one worker-thread call; raise the first failure."""
        writes, self._writes = self._writes, []
        if not writes:
            return
        try:
            await anyio.to_thread.run_sync(_make_all, writes)
        except BaseException as error:
            # Cancelled before the thread started: none was made. After a failure, the
            # writes after it are dropped already.
            for write in writes:
                write._drop(error)
            raise

    def drop(self, reason: BaseException | None = None) -> None:
        """Withdraw the writes added and not flushed: they are never made (their
        managers are told)."""
        writes, self._writes = self._writes, []
        reason = reason or RuntimeError("the write batch was dropped before it was flushed")
        for write in writes:
            write._drop(reason)


def preparer(manager: object, method: str) -> Callable[..., Awaitable[PreparedWrite | None]] | None:
    """``manager``'s ``prepare_{method}`` when it prepares what its ``method`` writes;
    ``None`` when the manager is to be awaited as usual.

    A manager prepares its writes when its class defines ``prepare_{method}`` at least
    as far down its hierarchy as ``method``: a subclass that overrides ``save`` (to act
    after it, say) without overriding ``prepare_save`` is awaited through its own
    ``save``, so that what it adds is never skipped. The same holds for a ``method``
    set on the instance. ``prepare_release`` may return ``None``: the release has
    nothing to write, and is done.
    """
    own = getattr(manager, "__dict__", {})  # a class with __slots__ has none
    if method in own or f"prepare_{method}" in own:
        return None
    defines_method = _defining_class(type(manager), method)
    defines_prepare = _defining_class(type(manager), f"prepare_{method}")
    if defines_method is None or defines_prepare is None:
        return None
    if not issubclass(defines_prepare, defines_method):
        return None
    return getattr(manager, f"prepare_{method}")


def _defining_class(cls: type, name: str) -> type | None:
    for klass in cls.__mro__:
        if name in vars(klass):
            return klass
    return None


def _make_all(writes: list[PreparedWrite]) -> None:
    for index, write in enumerate(writes):
        write._make()
        if write._error is not None:
            for later in writes[index + 1 :]:
                later._drop(write._error)
            raise write._error
