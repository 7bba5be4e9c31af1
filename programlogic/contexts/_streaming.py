"""The part of a backend that hands client results back one at a time, in client order."""

from __future__ import annotations

import abc
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

from programlogic.context import ClientFn, FederatedContext, GroupFn

if TYPE_CHECKING:
    from programlogic.data import ClientHandle

__all__ = ["StreamingContext"]

A = TypeVar("A")


class StreamingContext(FederatedContext):
    """A federated context built on one streaming primitive, :meth:`_stream`.

    ``map_clients`` collects the results ``_stream`` hands over and ``aggregate_clients``
    folds each as it arrives, so a backend holds no more results than its ``_stream``
    keeps waiting for earlier clients.
    """

    @abc.abstractmethod
    async def _stream(
        self,
        fn: ClientFn | GroupFn,
        broadcast: Any,
        clients: Sequence[ClientHandle],
        group_size: int | None,
        consume: Callable[[Any], None],
    ) -> None:
        """Run the work of ``clients`` and hand each result to ``consume`` in client order."""

    async def map_clients(
        self,
        fn: ClientFn | GroupFn,
        broadcast: Any,
        clients: Sequence[ClientHandle],
        *,
        group_size: int | None = None,
    ) -> list[Any]:
        results: list[Any] = []
        await self._stream(fn, broadcast, clients, group_size, results.append)
        return results

    async def aggregate_clients(
        self,
        fn: ClientFn | GroupFn,
        broadcast: Any,
        clients: Sequence[ClientHandle],
        accumulate: Callable[[A, Any], A],
        initial: A,
        *,
        group_size: int | None = None,
    ) -> A:
        total = initial

        def consume(result: Any) -> None:
            nonlocal total
            total = accumulate(total, result)

        await self._stream(fn, broadcast, clients, group_size, consume)
        return total
