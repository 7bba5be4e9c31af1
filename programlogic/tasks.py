"""Tracked background tasks: every task has an owner and no failure is swallowed.

This module holds :class:`TaskTracker`; :func:`~managers.taskgroups.task_group` lives in
:mod:`managers.taskgroups` (the lower layer uses it too). Two shapes of ownership are
used across programlogic:

- :func:`task_group` (from :mod:`managers.taskgroups`): an anyio task group whose lone
  failure is raised as itself (several failures as an ``ExceptionGroup``). A failing
  task cancels its siblings and the owner at once. ``train_model`` runs its saves and
  releases in one, so a failed save fails the run with that same exception.
- :class:`TaskTracker`: an owner whose tasks fail independently. A failure is kept,
  not propagated at once, and raised by :meth:`TaskTracker.wait` or when the tracker
  closes. Federated contexts own one for work that outlives a call (forked
  evaluations): one failing evaluation does not cancel training or other evaluations.

Closing the owners differs:

- leaving a :func:`task_group` block normally waits for its tasks to finish; they are
  cancelled only when a task or the block fails, or when the group's ``cancel_scope``
  or an enclosing scope is cancelled. A cancellation from outside is raised again,
  unless a task failed meanwhile: that failure is raised in its place;
- leaving a :class:`TaskTracker` cancels the tasks still running, then raises the
  failures nobody collected; a cancellation of the block is raised again.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from types import TracebackType
from typing import Any, Self

import anyio
from anyio.abc import TaskGroup, TaskStatus

__all__ = ["TaskTracker", "TrackedTask"]


class TrackedTask:
    """A handle on one task of a :class:`TaskTracker`.

    ``wait()`` waits for the task and raises its failure, which then counts as
    collected: the tracker does not raise it again. ``value`` is what the task passed
    to ``task_status.started()`` (for tasks started with :meth:`TaskTracker.start`).
    """

    def __init__(self, tracker: TaskTracker, name: str | None) -> None:
        self.name = name
        self.value: Any = None
        self._tracker = tracker
        self._finished = anyio.Event()
        self._error: Exception | None = None

    @property
    def done(self) -> bool:
        """Whether the task has finished, successfully or not."""
        return self._finished.is_set()

    async def wait(self) -> None:
        """Wait until the task finishes; raise what it raised."""
        await self._finished.wait()
        if self._error is not None:
            self._tracker._collect(self)
            raise self._error


class TaskTracker:
    """Owns background tasks that fail independently; their failures are kept for later.

    Use as an async context manager. A failing task cancels nothing: its exception is
    kept until the task's handle, :meth:`wait` or :meth:`raise_failures` collects it.
    Leaving the tracker cancels the tasks still running, then raises the failures
    nobody collected (unless the block itself raised).

    Example::

        async with TaskTracker() as tracker:
            first = tracker.start_soon(evaluate, 1)
            tracker.start_soon(evaluate, 2)
            await first.wait()    # raises what evaluation 1 raised
            await tracker.wait()  # raises what is left: the error, or an ExceptionGroup
    """

    def __init__(self) -> None:
        self._group: TaskGroup | None = None
        self._uncollected: list[TrackedTask] = []
        self._running = 0
        self._idle = anyio.Event()
        self._idle.set()

    @property
    def running(self) -> int:
        """How many tracked tasks have not finished."""
        return self._running

    def start_soon(
        self, fn: Callable[..., Awaitable[Any]], *args: Any, name: str | None = None
    ) -> TrackedTask:
        """Run ``fn(*args)`` in the background and return its handle."""
        group = self._require_group()
        task = self._enter(name)
        group.start_soon(self._run, task, fn, args, None, name=name)
        return task

    async def start(
        self, fn: Callable[..., Awaitable[Any]], *args: Any, name: str | None = None
    ) -> TrackedTask:
        """Run ``fn(*args, task_status=...)``; return its handle once it calls ``started()``.

        A failure before ``started`` is raised here; a failure after it is kept.
        """
        group = self._require_group()
        task = self._enter(name)
        await group.start(self._run_started, task, fn, args, name=name)
        return task

    async def wait(self) -> None:
        """Wait until no task runs, then raise the failures not collected yet."""
        while self._running:
            await self._idle.wait()
        self.raise_failures()

    def raise_failures(self) -> None:
        """Raise the uncollected failures: one as itself, several as an ExceptionGroup."""
        if not self._uncollected:
            return
        failed, self._uncollected = self._uncollected, []
        errors = [task._error for task in failed if task._error is not None]
        if len(errors) == 1:
            raise errors[0]
        raise ExceptionGroup(f"{len(errors)} background tasks failed", errors)

    async def __aenter__(self) -> Self:
        group = anyio.create_task_group()
        await group.__aenter__()
        self._group = group
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> bool | None:
        group, self._group = self._require_group(), None
        group.cancel_scope.cancel()
        try:
            suppressed = await group.__aexit__(exc_type, exc, traceback)
        except BaseExceptionGroup as group_error:
            # The block's own exception comes back inside the backend's group, and trio
            # rebuilds the groups it nests: match the block's exceptions leaf by leaf.
            cancelled = anyio.get_cancelled_exc_class()
            own = {id(leaf) for leaf in _leaves(exc)}
            _, others = group_error.split(
                lambda e: (
                    not isinstance(e, BaseExceptionGroup)
                    and (id(e) in own or isinstance(e, cancelled))
                )
            )
            if exc is not None and others is None:
                return False  # the block's own exception propagates as it is
            raise
        if exc_type is None:
            self.raise_failures()
        return suppressed

    def _enter(self, name: str | None) -> TrackedTask:
        if self._running == 0:
            self._idle = anyio.Event()
        self._running += 1
        return TrackedTask(self, name)

    def _collect(self, task: TrackedTask) -> None:
        if task in self._uncollected:
            self._uncollected.remove(task)

    def _require_group(self) -> TaskGroup:
        if self._group is None:
            raise RuntimeError("the TaskTracker is not open: use it as `async with TaskTracker():`")
        return self._group

    async def _run(
        self,
        task: TrackedTask,
        fn: Callable[..., Awaitable[Any]],
        args: tuple[Any, ...],
        status: TaskStatus[Any] | None,
    ) -> None:
        flag = None if status is None else _StartedFlag(status, task)
        try:
            if flag is None:
                await fn(*args)
            else:
                await fn(*args, task_status=flag)
        except Exception as error:
            if flag is not None and not flag.is_started:
                raise  # the caller of start() receives it
            task._error = error
            self._uncollected.append(task)
        finally:
            task._finished.set()
            self._running -= 1
            if self._running == 0:
                self._idle.set()

    async def _run_started(
        self,
        task: TrackedTask,
        fn: Callable[..., Awaitable[Any]],
        args: tuple[Any, ...],
        *,
        task_status: TaskStatus[Any] = anyio.TASK_STATUS_IGNORED,
    ) -> None:
        await self._run(task, fn, args, task_status)


class _StartedFlag:
    """A task status that remembers whether the task said it started."""

    def __init__(self, status: TaskStatus[Any], task: TrackedTask) -> None:
        self._status = status
        self._task = task
        self.is_started = False

    def started(self, value: Any = None) -> None:
        self.is_started = True
        self._task.value = value
        self._status.started(value)


def _leaves(error: BaseException | None) -> list[BaseException]:
    """The exceptions in ``error``: itself, or the leaves of a group."""
    if error is None:
        return []
    if isinstance(error, BaseExceptionGroup):
        return [leaf for member in error.exceptions for leaf in _leaves(member)]
    return [error]
