"""Task groups whose failures reach the owner as the tasks raised them.

``task_group()`` is an anyio task group that keeps each failure of its tasks (and of
its own block) aside as it happens, cancels the rest, and raises once everything has
ended: a lone failure as itself, the same object, several as one ExceptionGroup. The
failures never pass through the backend's own exception groups, so an exception group
that a task raises itself comes back whole, as that same object, on asyncio and on
trio alike (trio rebuilds the groups nested in its own when it removes
cancellations).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

import anyio
from anyio import CancelScope
from anyio.abc import TaskGroup

__all__ = ["OwnedTaskGroup", "collapse", "task_group"]


def collapse(group_error: BaseExceptionGroup) -> BaseException:
    """The one real failure of a task group's ``group_error``, or the group of several.

    ``group_error`` is the group a task group raised: its members are what its tasks
    raised. Cancellations (and groups of nothing but cancellations) are left out: they
    are the echo of the failure that cancelled the sibling tasks. A member that is
    itself an exception group is kept whole: a task raised it, and only the group the
    task group created is unwrapped.
    """
    cancelled = anyio.get_cancelled_exc_class()
    failures = [error for error in group_error.exceptions if not _is_echo(error, cancelled)]
    if not failures:
        return group_error
    if len(failures) == 1:
        return failures[0]
    if len(failures) == len(group_error.exceptions):
        return group_error
    kept, _ = group_error.split(lambda error: any(error is failure for failure in failures))
    return group_error if kept is None else kept


class OwnedTaskGroup:
    """What :func:`task_group` gives its block: starts tasks whose failures it keeps."""

    def __init__(self, group: TaskGroup) -> None:
        self._group = group
        self.failures: list[Exception] = []

    @property
    def cancel_scope(self) -> CancelScope:
        """The scope of the group's tasks; cancelling it ends them (and the block)."""
        return self._group.cancel_scope

    def start_soon(
        self, fn: Callable[..., Awaitable[Any]], *args: Any, name: str | None = None
    ) -> None:
        """Run ``fn(*args)`` in the group; its failure cancels the group."""
        self._group.start_soon(self._run, fn, args, name=name)

    def fail(self, error: Exception) -> None:
        """Keep ``error`` as a failure of the group and cancel what still runs."""
        self.failures.append(error)
        self._group.cancel_scope.cancel()

    async def _run(self, fn: Callable[..., Awaitable[Any]], args: tuple[Any, ...]) -> None:
        try:
            await fn(*args)
        except Exception as error:
            self.fail(error)


@asynccontextmanager
async def task_group() -> AsyncIterator[OwnedTaskGroup]:
    """A task group whose lone failure is raised as itself, several as an ExceptionGroup.

    The first failure, of a task or of the block, cancels the others; cancellations are
    never counted as failures.
    """
    failures: list[Exception] = []
    cancelled = anyio.get_cancelled_exc_class()
    try:
        async with anyio.create_task_group() as group:
            owner = OwnedTaskGroup(group)
            failures = owner.failures
            try:
                yield owner
            except Exception as error:
                owner.fail(error)
    except cancelled:  # from outside: it yields to a failure that happened meanwhile
        if not failures:
            raise
    except BaseExceptionGroup as group_error:  # a task raised a BaseException
        failure = collapse(group_error)
        if failure is group_error:
            raise
        _raise_as_itself(failure)
    if len(failures) == 1:
        _raise_as_itself(failures[0])
    if failures:
        raise ExceptionGroup(f"{len(failures)} tasks failed", failures)


def _raise_as_itself(failure: BaseException) -> None:
    context = failure.__context__
    try:
        raise failure
    finally:
        failure.__context__ = context  # keep its own chain, not the group's
        del failure


def _is_echo(error: BaseException, cancelled: type[BaseException]) -> bool:
    """Whether ``error`` is a cancellation, or a group of cancellations only."""
    if isinstance(error, BaseExceptionGroup):
        return error.split(cancelled)[1] is None
    return isinstance(error, cancelled)
