"""Task groups that raise a lone failure as itself rather than inside an ExceptionGroup."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import anyio
from anyio.abc import TaskGroup

__all__ = ["collapse", "task_group"]


def collapse(group_error: BaseExceptionGroup) -> BaseException:
    """The one real failure inside ``group_error``, or the group when there are several.

    Cancellation exceptions are left out of the count: they are the echo of the failure
    that cancelled the sibling tasks. Nested groups are flattened first.
    """
    _, failures = group_error.split(anyio.get_cancelled_exc_class())
    if failures is None:
        return group_error
    flat = _leaves(failures)
    return flat[0] if len(flat) == 1 else failures


@asynccontextmanager
async def task_group() -> AsyncIterator[TaskGroup]:
    """An anyio task group whose single failure is raised unwrapped."""
    try:
        async with anyio.create_task_group() as group:
            yield group
    except BaseExceptionGroup as group_error:
        failure = collapse(group_error)
        if failure is group_error:
            raise
        context = failure.__context__
        try:
            raise failure
        finally:
            failure.__context__ = context  # keep its own chain, not the group's
            del failure


def _leaves(group_error: BaseExceptionGroup) -> list[BaseException]:
    found: list[BaseException] = []
    for error in group_error.exceptions:
        if isinstance(error, BaseExceptionGroup):
            found.extend(_leaves(error))
        else:
            found.append(error)
    return found
