"""The federated context: the backend that runs a program's computations.

Program logic never talks to a backend directly. It asks the *current* context, the one
entered with ``async with context:`` in the running task, to run client work and
server-side steps. The current context lives in a :mod:`contextvars` variable, so two
programs in one event loop, each inside its own context, never see each other's.
"""

from __future__ import annotations

import abc
import contextlib
import contextvars
import dataclasses
from collections.abc import Callable, Iterator, Sequence
from types import TracebackType
from typing import TYPE_CHECKING, Any, Self, TypeVar

from programlogic.exceptions import NoFederatedContextError
from programlogic.tasks import TaskTracker

if TYPE_CHECKING:
    from programlogic.data import ClientHandle

__all__ = [
    "ClientFn",
    "DroppedClients",
    "FederatedContext",
    "GroupFn",
    "check_in_federated_context",
    "count_dropped_clients",
    "get_context",
    "report_dropped_clients",
]

T = TypeVar("T")
A = TypeVar("A")

ClientFn = Callable[[Any, str, Any], Any]
"""Per-client work: ``fn(broadcast, client_id, client_data) -> result``."""

GroupFn = Callable[[Any, Sequence[str], Sequence[Any]], Sequence[Any]]
"""Work on a group of clients at once: ``fn(broadcast, client_ids, datas) -> results``."""

_current: contextvars.ContextVar[FederatedContext | None] = contextvars.ContextVar(
    "programlogic_federated_context", default=None
)


class FederatedContext(abc.ABC):
    """Runs the computations of federated programs: client work and server-side steps.

    Enter a context with ``async with`` to make it the current one for the code inside
    (and for tasks started from there). Implementations decide where work runs:
    in-process threads (:class:`~programlogic.contexts.local.LocalContext`, the
    embedded default), Ray workers, or TensorFlow Federated's runtime.

    What implementations must provide:

    - ``run(fn, *args)``: run a synchronous server-side step (initialize, aggregation,
      an optimizer step) off the event loop and return its result. Exceptions raised
      by ``fn`` propagate unchanged.
    - ``stream_units(fn, broadcast, clients, group_size, consume)``: the client work.
      For every client handle, load its data where the work runs and call
      ``fn(broadcast, client_id, data)``; with ``group_size``, ``fn`` receives up to
      that many clients at once (``fn(broadcast, client_ids, datas)`` returning one
      result per client), so a backend may vectorize them. Hand each result to
      ``consume`` in the order of ``clients``, not in the order they finished. Work
      that raises fails the call with :class:`~programlogic.exceptions.ClientError`
      naming the client (or the group); the other clients' work is cancelled or
      discarded. A cancelled call leaves no work running when it returns. The method's
      docstring is the full contract; :mod:`programlogic.contexts.units` cuts clients
      into units and computes a unit the same way for every backend.

    What the base class provides:

    - ``map_clients(fn, broadcast, clients, group_size=None)``: the results of
      ``stream_units`` as a list, in client order.
    - ``aggregate_clients``: client results folded with ``accumulate`` in client order
      as they are handed over, so memory need not grow with the number of clients.
    - ``background``: a :class:`~programlogic.tasks.TaskTracker` for work that outlives
      a call (forked evaluations). Leaving the context cancels what is unfinished;
      failures nobody collected are raised then.
    - ``open()`` / ``close()`` hooks, called on entering and leaving, with no-op
      defaults: start and stop what the backend needs there.
    - ``parallelism``: how many units of client work run at once (default 1); backends
      with several workers override it.
    - ``replays_rounds``: whether the same call computed again gives the same results
      (default True); a backend whose results depend on timing overrides it with False.

    A backend that may drop clients (a round deadline, workers that keep dying) leaves
    them out of the results of ``map_clients`` and ``aggregate_clients`` and tells the
    caller with :func:`report_dropped_clients`; a caller that wants the count wraps the
    call in :func:`count_dropped_clients`. Backends that never drop (``LocalContext``)
    return a result for every client.

    A context may be entered once at a time; entering it again while it is entered is
    an error. Example::

        async with LocalContext(max_workers=4) as context:
            results = await context.map_clients(train_client, weights, clients)
    """

    _token: contextvars.Token[FederatedContext | None] | None = None
    _background: TaskTracker | None = None

    @abc.abstractmethod
    async def run(self, fn: Callable[..., T], /, *args: Any) -> T:
        """``fn(*args)``, computed off the event loop."""

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
        """The result of the client work for each client, in the order of ``clients``."""
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
        """``accumulate`` applied to the client results in client order, from ``initial``.

        Each result is folded as :meth:`stream_units` hands it over, so a backend holds
        no more results than it keeps waiting for earlier clients.
        ``accumulate(total, result)`` returns the new total; it runs on the event loop
        thread, so it should be cheap (a weighted sum), or offload its work itself.
        """
        total = initial

        def consume(result: Any) -> None:
            nonlocal total
            total = accumulate(total, result)

        await self.stream_units(fn, broadcast, clients, group_size, consume)
        return total

    @property
    def parallelism(self) -> int:
        """How many units of client work this context computes at once (1 unless overridden).

        A hint for processes that group clients (``map_clients(..., group_size=...)``):
        splitting a round into at least this many groups keeps every worker busy.
        """
        return 1

    @property
    def replays_rounds(self) -> bool:
        """Whether computing a round again gives the same result (True unless overridden).

        ``train_model`` checkpoints less often than every round only in a context that
        replays: the rounds after the last checkpoint are computed again on resume.
        A backend whose results depend on timing (a round deadline that drops slow
        clients) answers False.
        """
        return True

    @property
    def background(self) -> TaskTracker:
        """The owner of this context's background work; only while the context is entered."""
        if self._background is None:
            raise NoFederatedContextError(
                f"{type(self).__name__} is not entered: use `async with {type(self).__name__}():`"
            )
        return self._background

    async def open(self) -> None:
        """Start what the backend needs; called when the context is entered."""

    async def close(self) -> None:
        """Stop what :meth:`open` started; called when the context is left."""

    async def __aenter__(self) -> Self:
        if self._token is not None:
            raise RuntimeError(f"this {type(self).__name__} is already entered")
        await self.open()
        try:
            tracker = TaskTracker()
            await tracker.__aenter__()
        except BaseException:
            await self.close()
            raise
        self._background = tracker
        self._token = _current.set(self)
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        token, self._token = self._token, None
        tracker, self._background = self._background, None
        try:
            if tracker is not None:
                await tracker.__aexit__(exc_type, exc, traceback)
        finally:
            if token is not None:
                _current.reset(token)
            await self.close()


def get_context() -> FederatedContext:
    """The current federated context.

    Raises:
        NoFederatedContextError: no context is entered in this task.
    """
    context = _current.get()
    if context is None:
        raise NoFederatedContextError(
            "no federated context is active here: run this inside "
            "`async with LocalContext():` (or another FederatedContext)"
        )
    return context


def check_in_federated_context() -> None:
    """Raise :class:`NoFederatedContextError` unless a federated context is current."""
    get_context()


@dataclasses.dataclass
class DroppedClients:
    """The clients a context dropped from the calls made inside :func:`count_dropped_clients`."""

    client_ids: list[str] = dataclasses.field(default_factory=list)

    @property
    def count(self) -> int:
        """How many clients were dropped."""
        return len(self.client_ids)


_dropped: contextvars.ContextVar[DroppedClients | None] = contextvars.ContextVar(
    "programlogic_dropped_clients", default=None
)


@contextlib.contextmanager
def count_dropped_clients() -> Iterator[DroppedClients]:
    """Collect the clients that contexts drop from the client work started inside.

    Example (a learning process reporting how many of its round's clients were dropped)::

        with count_dropped_clients() as dropped:
            total = await context.aggregate_clients(fn, broadcast, clients, add, 0)
        metrics["num_dropped_clients"] = dropped.count
    """
    collected = DroppedClients()
    token = _dropped.set(collected)
    try:
        yield collected
    finally:
        _dropped.reset(token)


def report_dropped_clients(client_ids: Sequence[str]) -> None:
    """Record that a context dropped ``client_ids`` from the current call (for backends).

    Goes to the innermost :func:`count_dropped_clients` of the calling task, if any.
    """
    collected = _dropped.get()
    if collected is not None:
        collected.client_ids.extend(client_ids)
