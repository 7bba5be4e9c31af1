"""A release manager that releases every value to several managers at once."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable
from typing import Any

import anyio

from managers.release._ordering import CallOrder
from managers.release.base import ReleaseKey, ReleaseManager, check_key
from managers.validation import check_type, describe
from managers.values import materialize
from managers.writes import is_gathering

__all__ = ["GroupingReleaseManager"]


class GroupingReleaseManager(ReleaseManager):
    """Releases each value to every one of ``managers``, concurrently.

    The value is materialized once and each manager receives the same plain value (so
    managers must not mutate it). The releases run concurrently in one anyio task group;
    a manager that fails does not cancel the others, so when ``release`` raises, the
    healthy managers hold the value. Inside a :class:`~managers.writes.WriteBatch`'s
    ``gathering`` (where file managers only queue their writes) they run one after
    another instead, in the order of ``managers``, each to its end. Then every failure is
    raised: a single one as itself, several as an ``ExceptionGroup`` in the order of
    ``managers``.

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

    async def aclose(self) -> None:
        await _run_all([manager.aclose for manager in self._managers], "close")


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

    if is_gathering():
        # File managers only queue their writes here: no release waits on the disk, and
        # running them one after another spares a task each.
        for index in range(len(operations)):
            await run(index)
    else:
        async with anyio.create_task_group() as group:
            for index in range(1, len(operations)):
                group.start_soon(run, index)
            if operations:
                await run(0)
    errors = [error for error in failures if error is not None]
    if len(errors) == 1:
        raise errors[0]
    if errors:
        raise ExceptionGroup(
            f"{len(errors)} of {len(operations)} release managers failed to {action}", errors
        )
