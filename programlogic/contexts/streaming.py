"""The base of a backend: a federated context built on one method, ``stream_units``.

A backend subclasses :class:`StreamingContext` and implements ``run`` (server-side
steps) and ``stream_units`` (client work); ``map_clients`` and a streaming
``aggregate_clients`` come with the base. Backends cut a call's clients into units with
:func:`~programlogic.contexts.units.split_units` and compute a unit with
:func:`~programlogic.contexts.units.compute_unit`, so every backend groups clients, loads
their data and reports their errors alike.
"""

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
    """A federated context whose client work goes through :meth:`stream_units`.

    ``map_clients`` collects the results ``stream_units`` hands over and
    ``aggregate_clients`` folds each as it arrives, so a backend holds no more results
    than its ``stream_units`` keeps waiting for earlier clients. A subclass implements
    ``run`` and ``stream_units``, and usually ``open``, ``close`` and ``parallelism``.
    :class:`~programlogic.contexts.local.LocalContext` is the reference implementation.
    """

    @abc.abstractmethod
    async def stream_units(
        self,
        fn: ClientFn | GroupFn,
        broadcast: Any,
        clients: Sequence[ClientHandle],
        group_size: int | None,
        consume: Callable[[Any], None],
    ) -> None:
        """Run the client work of ``clients`` and hand each result to ``consume``, in client order.

        Receives what ``map_clients`` received: the client function ``fn`` (per client,
        or per group when ``group_size`` is not None), the ``broadcast`` value passed to
        every call of ``fn``, the ``clients`` handles, and ``group_size`` as the caller
        gave it (check it with :func:`~programlogic.contexts.units.check_group_size`
        before any work starts). ``consume`` runs on the event loop; call it once per
        client result, in the order of ``clients``, as soon as every earlier result has
        been handed over, never from another thread.

        Contract:

        - Cut ``clients`` with :func:`~programlogic.contexts.units.split_units` and
          compute each unit with :func:`~programlogic.contexts.units.compute_unit`
          where the work runs, which loads the clients' data there.
        - A client (or group) whose loader or work raises fails the call with
          :class:`~programlogic.exceptions.ClientError` naming it, its error as
          ``__cause__`` (``compute_unit`` raises it); the call's other work is
          cancelled or its results discarded, and nothing of it is consumed after.
        - When the call is cancelled, or fails, it returns only once the work it started
          has finished or been interrupted, and it starts no further unit.
        - A backend that drops clients leaves their results out and reports them with
          :func:`~programlogic.context.report_dropped_clients`.
        - A context that is not entered raises ``RuntimeError`` saying it is "not entered".
        """

    async def map_clients(
        self,
        fn: ClientFn | GroupFn,
        broadcast: Any,
        clients: Sequence[ClientHandle],
        *,
        group_size: int | None = None,
    ) -> list[Any]:
        results: list[Any] = []
        await self.stream_units(fn, broadcast, clients, group_size, results.append)
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

        await self.stream_units(fn, broadcast, clients, group_size, consume)
        return total
