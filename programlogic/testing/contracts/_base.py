"""What every contract suite builds on: each test runs under asyncio and trio, with a
watchdog on the event loop beside it.

**The loop watchdog.** A call of an implementation never blocks the event loop: blocking
I/O and CPU work go to worker threads, so that the program's other tasks go on while the
call is in flight. To check it, every test method of a suite runs with a watchdog task
beside it, which sleeps 10 ms at a time (``anyio.sleep``) and measures with
``time.monotonic`` how long each sleep really took. A sleep that took longer than the
suite's :attr:`Contract.loop_stall_limit` (0.25 s unless the suite says otherwise) means
that something held the event loop that long without yielding to it (a blocking read or
write, a ``time.sleep``, a long computation), and the test fails, saying for how long.
The bound is generous against a loaded machine's noise and fatal to a blocking call.

The suite's own synchronous steps that reach behind the implementation's back (a
``read_back`` that parses the files a sink wrote, a ``StateDamage`` that damages a
version, a factory building a manager) are not counted: they run :func:`unwatched`.
Garbage collections are not counted either: they pause every thread, whichever call
allocated. :meth:`Contract.__init_subclass__` puts the watchdog around each test method
of a suite, those a subclass adds or overrides included. Set ``loop_stall_limit =
None`` in a subclass to turn the watchdog off, for an implementation that cannot keep
the promise (say why there), or a larger bound for one whose first call imports a heavy
module or whose worker threads hold the GIL for long (TensorFlow tracing, Ray's
connect).
"""

from __future__ import annotations

import contextlib
import functools
import gc
import inspect
import time
from collections.abc import Awaitable, Callable, Coroutine, Iterator
from contextvars import ContextVar
from typing import Any

import anyio
import anyio.abc
import anyio.lowlevel
import pytest

__all__ = [
    "Contract",
    "LoopWatchdog",
    "assert_returned_within",
    "call_cancelled_after",
    "unwatched",
]

_TICK_S = 0.01
"""How long the watchdog sleeps between two looks at the clock."""


class LoopWatchdog:
    """Measures how long the event loop goes without running its tasks (its stalls).

    :meth:`run` is the watchdog task; :attr:`stalls` lists, in seconds, each of its
    sleeps that took longer than ``limit``, less the time excused meanwhile: the suite's
    own steps (:meth:`unwatched`) and, within :meth:`excusing_garbage_collection`, the
    interpreter's garbage collections (a pause of every thread, as long whichever call
    allocated: about 0.2 s for each full collection once TensorFlow is imported).
    """

    def __init__(self, limit: float) -> None:
        self.limit = limit
        self.stalls: list[float] = []
        self._depth = 0  # of unwatched steps now under way
        self._excused_s = 0.0  # in unwatched steps that are over, and collections
        self._unwatched_since = 0.0  # when the unwatched step under way began
        self._collecting_since = 0.0  # when the collection under way began
        self._last = 0.0  # when the watchdog last looked
        self._excused_then = 0.0  # excused until then

    async def run(
        self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED
    ) -> None:
        """Watch the loop until cancelled."""
        self._last = time.monotonic()
        self._excused_then = self._excused_until(self._last)
        task_status.started()
        while True:
            await anyio.sleep(_TICK_S)
            self.look()

    def look(self) -> None:
        """Note a stall if the loop went longer than ``limit`` since the last look; the
        task calls it after each sleep, the test once more when it ends (a stall right
        before the end is seen by no sleep)."""
        now = time.monotonic()
        excused_now = self._excused_until(now)
        stall = (now - self._last) - (excused_now - self._excused_then)
        if stall > self.limit:
            self.stalls.append(stall)
        self._last, self._excused_then = now, excused_now

    @contextlib.contextmanager
    def unwatched(self) -> Iterator[None]:
        """A step whose holding of the loop is not counted (the suite's own reads)."""
        if self._depth == 0:
            self._unwatched_since = time.monotonic()
        self._depth += 1
        try:
            yield
        finally:
            self._depth -= 1
            if self._depth == 0:
                self._excused_s += time.monotonic() - self._unwatched_since

    @contextlib.contextmanager
    def excusing_garbage_collection(self) -> Iterator[None]:
        """Within it, the time the interpreter spends collecting garbage is not counted."""
        gc.callbacks.append(self._on_collection)
        try:
            yield
        finally:
            gc.callbacks.remove(self._on_collection)

    def _on_collection(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self._collecting_since = time.monotonic()
        elif self._depth == 0:  # else the unwatched step excuses it already
            self._excused_s += time.monotonic() - self._collecting_since

    def _excused_until(self, now: float) -> float:
        """The seconds excused from the start until ``now``."""
        if self._depth == 0:
            return self._excused_s
        return self._excused_s + now - self._unwatched_since

    def verdict(self) -> str | None:
        """Why the test fails: the stalls over the limit; ``None`` when there were none."""
        if not self.stalls:
            return None
        return (
            f"the event loop was blocked for {max(self.stalls):.2f} s at once "
            f"({len(self.stalls)} time(s) over loop_stall_limit = {self.limit} s): a call "
            "ran blocking work (I/O, time.sleep, a long computation) on the event loop "
            "instead of in a worker thread (anyio.to_thread.run_sync)"
        )


_WATCHDOG: ContextVar[LoopWatchdog | None] = ContextVar("_WATCHDOG", default=None)


@contextlib.contextmanager
def unwatched() -> Iterator[None]:
    """Run a step of the suite itself (reading the storage back, damaging it, building a
    manager) without counting how long it holds the event loop."""
    watchdog = _WATCHDOG.get()
    if watchdog is None:
        yield
        return
    with watchdog.unwatched():
        yield


def _watched(
    test: Callable[..., Coroutine[Any, Any, None]],
) -> Callable[..., Coroutine[Any, Any, None]]:
    """``test`` run beside a :class:`LoopWatchdog` bounded by its suite's
    ``loop_stall_limit``; it fails when the loop stalled longer."""

    @functools.wraps(test)
    async def watched(self: Contract, *args: Any, **kwargs: Any) -> None:
        limit = self.loop_stall_limit
        if limit is None:
            await test(self, *args, **kwargs)
            return
        watchdog = LoopWatchdog(limit)
        failure: BaseException | None = None
        async with anyio.create_task_group() as group:
            await group.start(watchdog.run)
            token = _WATCHDOG.set(watchdog)
            try:
                with watchdog.excusing_garbage_collection():
                    try:
                        await test(self, *args, **kwargs)
                    finally:
                        watchdog.look()
            except BaseException as error:  # raised below, as itself, not in a group
                failure = error
            finally:
                _WATCHDOG.reset(token)
                group.cancel_scope.cancel()
        verdict = watchdog.verdict()
        if failure is not None:
            if verdict is not None:
                failure.add_note(verdict)
            raise failure
        if verdict is not None:
            pytest.fail(verdict, pytrace=False)

    watched.__contract_watched__ = True  # type: ignore[attr-defined]
    return watched


@pytest.mark.anyio
class Contract:
    """A contract suite: subclass it in a ``test_*.py`` file as ``Test...`` and give it a
    factory fixture; every test method is a coroutine that anyio's pytest plugin runs
    once under asyncio and once under trio.

    Every test method (the suite's and those a subclass adds or overrides) runs beside
    the loop watchdog of this module: it fails when the event loop stalls longer than
    :attr:`loop_stall_limit` while the test runs.

    Override :meth:`anyio_backend` in a subclass to narrow the backends (an
    implementation that only runs on asyncio, such as one driving Ray, returns
    ``["asyncio"]`` params).
    """

    loop_stall_limit: float | None = 0.25
    """The longest the event loop may go without running its tasks while a test runs, in
    seconds; ``None`` turns the watchdog off."""

    def __init_subclass__(cls, **kwargs: Any) -> None:
        """Put the loop watchdog around each test method not yet watched."""
        super().__init_subclass__(**kwargs)
        for name in dir(cls):
            test = getattr(cls, name, None)
            if (
                name.startswith("test")
                and inspect.iscoroutinefunction(test)
                and not getattr(test, "__contract_watched__", False)
            ):
                setattr(cls, name, _watched(test))

    @pytest.fixture(params=["asyncio", "trio"])
    def anyio_backend(self, request: pytest.FixtureRequest) -> str:
        """The async backend the test runs on."""
        return request.param


async def call_cancelled_after(checkpoints: int, call: Callable[[], Awaitable[object]]) -> float:
    """Await ``call()`` in a scope that a task beside it cancels once it has passed
    ``checkpoints`` scheduling points; the seconds from that cancellation to the return
    of ``call()`` (0 when ``call()`` returned before it was cancelled)."""
    cancelled_at: list[float] = []
    returned_at: list[float] = []

    async def cancel(scope: anyio.CancelScope) -> None:
        for _ in range(checkpoints):
            await anyio.lowlevel.checkpoint()
        cancelled_at.append(time.monotonic())
        scope.cancel()

    with anyio.CancelScope() as scope:
        async with anyio.create_task_group() as group:
            group.start_soon(cancel, scope)
            try:
                await call()
            finally:
                returned_at.append(time.monotonic())
    if not cancelled_at or cancelled_at[0] > returned_at[0]:
        return 0.0
    return returned_at[0] - cancelled_at[0]


def assert_returned_within(grace: float, late: float, call: str) -> None:
    """Fail when ``call``, cancelled, returned ``late`` seconds after its cancellation,
    later than ``grace`` (a suite's ``cancel_grace``)."""
    assert late <= grace, (
        f"{call}, cancelled, returned {late:.2f} s after its cancellation, later than "
        f"cancel_grace = {grace} s: it ignored the cancellation (a shield?)"
    )
