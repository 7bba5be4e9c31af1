"""A release manager that releases every value to several managers at once."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable
from typing import Any

import anyio

from managers.release._ordering import CallOrder
from managers.release.base import ReleaseKey, ReleaseManager, check_key
from managers.validation import check_type, describe
from managers.values import materialize
from managers.writes import PreparedWrite, WritePart, preparer, together

__all__ = ["GroupingReleaseManager"]


class GroupingReleaseManager(ReleaseManager):
    """Releases each value to every one of ``managers``, concurrently.

    The value is materialized once and each manager receives the same plain value (so
    managers must not mutate it). The releases run concurrently in one anyio task group;
    a manager that fails does not cancel the others, so when ``release`` raises, the
    healthy managers hold the value. Then every failure is raised: a single one as
    itself, several as an ``ExceptionGroup`` in the order of ``managers``.

    :meth:`prepare_release` offers the group's release as one write for a batch: the
    managers that prepare their writes (file sinks) prepare them, and the write makes
    them and releases to the others, one after another, each whatever the others did,
    then raises every failure as ``release`` does.

    Idempotent by key as far as its managers are. When releases of one key overlap, the
    last call wins: a call whose value is ready only after a later call of the same key
    was handed on is dropped, and calls of one key are handed on one at a time, so every
    manager receives them in call order. Releases of different keys run concurrently.

    ``aclose`` closes every manager, concurrently, raising failures as ``release`` does.
    An empty group releases nothing, though it still checks keys and materializes values.
    """

    def __init__(self, managers: Iterable[ReleaseManager]) -> None:
        if isinstance(managers, ReleaseManager) or not isinstance(managers, Iterable):
            raise TypeError(
                f"managers must be an iterable of ReleaseManager, got {describe(managers)}"
            )
        managers = tuple(managers)
        for index, manager in enumerate(managers):
            check_type(f"managers[{index}]", manager, ReleaseManager)
        self._managers = managers
        self._order = CallOrder()

    @property
    def managers(self) -> tuple[ReleaseManager, ...]:
        """The managers released to, in the order given."""
        return self._managers

    async def release(self, value: Any, key: ReleaseKey) -> None:
        check_key(key)
        with self._order.call(key) as ticket:
            plain = await materialize(value)
            async with ticket.lock:
                if not ticket.hand_on():
                    return  # a later release of this key was handed on
                await _run_all(
                    [_bind(manager.release, plain, key) for manager in self._managers],
                    f"release key {key!r}",
                )

    async def prepare_release(self, value: Any, key: ReleaseKey) -> PreparedWrite | None:
        """The release of ``value`` under ``key`` as one write for a
        :class:`~managers.writes.WriteBatch`: the managers that prepare their writes
        prepare them now, and the write returned makes them and releases to the others
        (in the order of ``managers``, each whatever the others did), then raises every
        failure as ``release`` does. Nothing is released before it is made. ``None``
        when a later release of this key was handed on first."""
        check_key(key)
        with self._order.call(key) as ticket:
            plain = await materialize(value)
            async with ticket.lock:
                if not ticket.hand_on():
                    return None  # a later release of this key was handed on
                parts: list[WritePart] = []
                for manager in self._managers:
                    parts.append(await _prepared(manager, plain, key))
        if all(part is None for part in parts):
            return None  # nothing to write
        return together(parts, lambda errors: _combined(errors, len(parts), f"release key {key!r}"))

    async def aclose(self) -> None:
        await _run_all([manager.aclose for manager in self._managers], "close")


async def _prepared(manager: ReleaseManager, value: Any, key: ReleaseKey) -> WritePart:
    """``manager``'s prepared write of a release, or its release to await when it does
    not prepare its writes, or the failure of preparing it."""
    prepare = preparer(manager, "release")
    if prepare is None:
        return _bind(manager.release, value, key)
    try:
        return await prepare(value, key)
    except Exception as error:  # kept, so that the other managers still receive it
        return error


def _bind(function: Callable[..., Awaitable[None]], *args: Any) -> Callable[[], Awaitable[None]]:
    return lambda: function(*args)


async def _run_all(operations: list[Callable[[], Awaitable[None]]], action: str) -> None:
    """Run ``operations`` concurrently to their ends; then raise what they raised."""
    failures: list[Exception | None] = [None] * len(operations)

    async def run(index: int) -> None:
        try:
            await operations[index]()
        except Exception as error:  # kept, so that the siblings are not cancelled
            failures[index] = error

    async with anyio.create_task_group() as group:
        for index in range(1, len(operations)):
            group.start_soon(run, index)
        if operations:
            await run(0)
    errors = [error for error in failures if error is not None]
    if errors:
        raise _combined(errors, len(operations), action)


def _combined(errors: list[Exception], total: int, action: str) -> Exception:
    """A single failure as itself; several as an ExceptionGroup in the managers' order."""
    if len(errors) == 1:
        return errors[0]
    return ExceptionGroup(f"{len(errors)} of {total} release managers failed to {action}", errors)
