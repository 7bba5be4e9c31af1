"""Worker threads owned by a context: every call of the context runs on the same few threads.

Compiled client work keeps per-thread state warm (allocator arenas, runtime caches), so a
context that always computes on its own ``count`` threads runs steadier than one that
borrows whichever thread of the event loop's shared pool is idle, a pool that file I/O
and other libraries use too.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from typing import Any, Generic, TypeVar

import anyio
import anyio.from_thread
import anyio.lowlevel
import anyio.to_thread

__all__ = ["WorkerThreads"]

T = TypeVar("T")


class _Call(Generic[T]):
    """One call handed to the workers: queued, then running or withdrawn, then done."""

    def __init__(self, fn: Callable[..., T], args: tuple[Any, ...]) -> None:
        self._fn, self._args = fn, args
        self._token = anyio.lowlevel.current_token()
        self._lock = threading.Lock()
        self._state = "queued"
        self.done = anyio.Event()
        self.result: T | None = None
        self.error: BaseException | None = None

    def run(self) -> None:
        """Compute the call on this worker thread, unless it was withdrawn."""
        with self._lock:
            if self._state != "queued":
                return
            self._state = "running"
        try:
            self.result = self._fn(*self._args)
        except BaseException as error:  # handed to the awaiting task, raised there
            self.error = error
        try:
            anyio.from_thread.run_sync(self.done.set, token=self._token)
        except RuntimeError:  # the event loop has finished: nobody waits any more
            pass

    def withdraw(self) -> bool:
        """Take the call back if no worker has started it; whether that worked."""
        with self._lock:
            if self._state == "queued":
                self._state = "withdrawn"
                return True
            return False


class WorkerThreads:
    """``count`` threads (daemon unless told) that run calls in the order they were handed in.

    :meth:`run` awaits a call's result. Cancelling it withdraws a call that no thread
    has started; a call already running cannot be interrupted, so the cancellation
    waits for it to finish (its result is discarded) and is raised then. :meth:`stop`
    ends the threads once the calls already handed in are done.
    """

    def __init__(self, count: int, name: str, *, daemon: bool = True) -> None:
        self._calls: queue.SimpleQueue[_Call[Any] | None] = queue.SimpleQueue()
        self._threads = [
            threading.Thread(target=self._serve, name=f"{name}-{index}", daemon=daemon)
            for index in range(count)
        ]
        for thread in self._threads:
            thread.start()

    def _serve(self) -> None:
        while (call := self._calls.get()) is not None:
            call.run()

    async def run(self, fn: Callable[..., T], /, *args: Any) -> T:
        """``fn(*args)`` computed on one of the threads."""
        call = _Call(fn, args)
        self._calls.put(call)
        try:
            await call.done.wait()
        except BaseException:
            if not call.withdraw():
                with anyio.CancelScope(shield=True):
                    await call.done.wait()
            raise
        if call.error is not None:
            raise call.error
        return call.result  # type: ignore[return-value]

    async def stop(self) -> None:
        """End the threads after the calls handed in so far; wait for them off the loop."""
        for _ in self._threads:
            self._calls.put(None)
        threads = self._threads
        self._threads = []

        def join() -> None:
            for thread in threads:
                thread.join()

        with anyio.CancelScope(shield=True):
            await anyio.to_thread.run_sync(join)
