"""FakeContext: a federated context that plays a fault plan, in this process, deterministically."""

from __future__ import annotations

import dataclasses
import functools
import logging
import pickle
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

import anyio

from managers.validation import check_int, check_interface, check_type, describe
from programlogic.context import ClientFn, GroupFn, report_dropped_clients
from programlogic.contexts.local import LocalContext
from programlogic.contexts.units import check_group_size
from programlogic.data import ClientHandle
from programlogic.exceptions import ClientError, ClusterConnectionError, NotEnoughClientsError
from programlogic.testing.faults import (
    DropClients,
    FailClient,
    Fault,
    LoseCluster,
    SimulatedCrash,
    SlowCall,
)

if TYPE_CHECKING:
    from programlogic.testing import FakeClock

__all__ = ["CallRecord", "FakeContext"]

T = TypeVar("T")

logger = logging.getLogger("programlogic.testing")

_FAULT_TYPES = (FailClient, DropClients, LoseCluster, SlowCall)


@dataclasses.dataclass
class CallRecord:
    """What one client call (``map_clients`` or ``aggregate_clients``) of a
    :class:`FakeContext` did; the context fills it in as the call runs.

    ``call``: its number, from 1; ``clients``: the ids of the clients asked for, in
    order; ``broadcast_bytes``: the size of the broadcast pickled, what a remote backend
    ships to its workers (None when ``pickle`` cannot serialize it); ``finished``: the
    clients whose results were handed over, in order; ``dropped``: the clients the call
    dropped; ``failed``: the clients named by the :class:`~programlogic.ClientError`
    the call raised; ``outcome``: ``"running"``, then ``"returned"``, ``"raised"`` or
    ``"cancelled"``; ``error``: the exception the call raised, if it raised one.
    """

    call: int
    clients: list[str]
    broadcast_bytes: int | None = None
    finished: list[str] = dataclasses.field(default_factory=list)
    dropped: list[str] = dataclasses.field(default_factory=list)
    failed: list[str] = dataclasses.field(default_factory=list)
    outcome: str = "running"
    error: BaseException | None = None


class FakeContext(LocalContext):
    """A federated context that plays faults given up front, for tests of program logic.

    Client work and server steps run on ``max_workers`` threads of this process, as in
    :class:`~programlogic.LocalContext`, and results come back in client order, so the
    same calls give the same results under asyncio and trio. ``faults`` is the plan
    (:mod:`programlogic.testing.faults`): clients whose work raises
    (:class:`FailClient`), clients dropped as a round deadline drops stragglers
    (:class:`DropClients`), the cluster lost (:class:`LoseCluster`), calls that take
    time on ``clock`` (:class:`SlowCall`, which needs a clock, usually a
    :class:`~programlogic.testing.FakeClock`). A call in which fewer than
    ``min_clients`` clients finish (all of them, when fewer were asked) raises
    :class:`~programlogic.exceptions.NotEnoughClientsError`, as ``RayContext`` does.

    Faults are keyed by call number: the client calls (``map_clients`` and
    ``aggregate_clients``) are numbered from 1 in the order they start, over the life
    of the context, entering it again included. ``train_model`` runs one round at a
    time, and FedAvg and :class:`~programlogic.testing.FakeLearningProcess` make one
    client call a round, so call ``n`` of a fresh run is round ``n`` when nothing else
    uses the context (evaluations forked by ``train_model`` make calls of their own);
    a rerun in the same context goes on counting, so each fault is played once. A
    fault with ``call=None`` is played in every call.

    ``calls`` records each client call as a :class:`CallRecord`: the clients asked
    for, those that finished, were dropped or failed, and the size of the broadcast.
    Cancelling a call waits for the work already running (it cannot be interrupted)
    and starts no more.
    """

    _thread_name = "programlogic-fake"

    def __init__(
        self,
        faults: Iterable[Fault] = (),
        *,
        min_clients: int = 1,
        clock: FakeClock | None = None,
        max_workers: int = 1,
    ) -> None:
        if isinstance(faults, str | bytes) or not isinstance(faults, Iterable):
            raise TypeError(f"faults must be an iterable of faults, got {describe(faults)}")
        plan = tuple(faults)
        for index, fault in enumerate(plan):
            check_type(f"faults[{index}]", fault, _FAULT_TYPES)
        check_int("min_clients", min_clients, minimum=1)
        check_interface("clock", clock, "Clock", ["now", "advance"], allow_none=True)
        if clock is None and any(isinstance(fault, SlowCall) for fault in plan):
            raise ValueError(
                "a SlowCall moves the context's clock: give FakeContext a clock, got clock=None"
            )
        check_int("max_workers", max_workers, minimum=1)
        super().__init__(max_workers)
        self.faults = plan
        self.min_clients = min_clients
        self.clock = clock
        self.calls: list[CallRecord] = []
        self._lost_in: int | None = None

    async def open(self) -> None:
        self._lost_in = None  # entering again connects to a new cluster
        await super().open()

    def _faults_of(self, kind: type[T], call: int) -> list[T]:
        """The faults of type ``kind`` played in call number ``call``."""
        return [
            fault
            for fault in self.faults
            if isinstance(fault, kind) and fault.call in (None, call)  # type: ignore[attr-defined]
        ]

    async def stream_units(
        self,
        fn: ClientFn | GroupFn,
        broadcast: Any,
        clients: Sequence[ClientHandle],
        group_size: int | None,
        consume: Callable[[Any], None],
    ) -> None:
        """Run the work of ``clients``, playing the faults of this call, and hand each
        result to ``consume`` in client order."""
        check_group_size(group_size)
        record = CallRecord(len(self.calls) + 1, [client.client_id for client in clients])
        self.calls.append(record)
        try:
            await self._play(record, fn, broadcast, clients, group_size, consume)
        except anyio.get_cancelled_exc_class():
            record.outcome = "cancelled"
            raise
        except BaseException as error:
            record.outcome, record.error = "raised", error
            raise
        record.outcome = "returned"

    async def _play(
        self,
        record: CallRecord,
        fn: ClientFn | GroupFn,
        broadcast: Any,
        clients: Sequence[ClientHandle],
        group_size: int | None,
        consume: Callable[[Any], None],
    ) -> None:
        """The call on :class:`~programlogic.LocalContext`'s ordered workers, with the
        plan's faults: the cluster lost, clients dropped before and failing as they run."""
        number = record.call
        if self._lost_in is None and self._faults_of(LoseCluster, number):
            logger.info("FakeContext: the cluster is lost in call %d", number)
            self._lost_in = number
        if self._lost_in is not None:
            raise ClusterConnectionError(
                f"FakeContext lost its cluster in call {self._lost_in} (a LoseCluster fault)"
            )
        record.broadcast_bytes = await self.run(_pickled_size, broadcast)
        dropping = {c for fault in self._faults_of(DropClients, number) for c in fault.clients}
        kept = [client for client in clients if client.client_id not in dropping]
        failing = {fault.client: fault for fault in self._faults_of(FailClient, number)}
        kept = [
            ClientHandle(
                client.client_id,
                functools.partial(_fail, failing[client.client_id], client.client_id, number),
            )
            if client.client_id in failing
            else client
            for client in kept
        ]

        def handed_over(result: Any) -> None:
            consume(result)
            record.finished.append(kept[len(record.finished)].client_id)

        try:
            await super().stream_units(fn, broadcast, kept, group_size, handed_over)
        except ClientError as error:
            record.failed = list(error.client_ids)
            raise
        self._finish(record, clients, dropping, len(kept))

    def _finish(
        self, record: CallRecord, clients: Sequence[ClientHandle], dropping: set[str], kept: int
    ) -> None:
        """The call's work is done: move the clock, report the dropped clients, check
        that enough clients finished."""
        if self.clock is not None:  # the constructor refuses a SlowCall without a clock
            for slow in self._faults_of(SlowCall, record.call):
                self.clock.advance(slow.takes)
        record.dropped = [client.client_id for client in clients if client.client_id in dropping]
        if record.dropped:
            logger.info("FakeContext: call %d drops clients %s", record.call, record.dropped)
            report_dropped_clients(record.dropped)
        required = min(self.min_clients, len(clients))
        if kept < required:
            raise NotEnoughClientsError(kept, required, len(record.dropped))


def _fail(fault: FailClient, client_id: str, call: int) -> Any:
    """The loader of a client a :class:`FailClient` fault fails: it raises the fault's
    error, so the context fails the client's unit before its work runs."""
    raise fault.error or SimulatedCrash(
        f"client {client_id!r} failed in call {call} (a FailClient fault)"
    )


def _pickled_size(value: Any) -> int | None:
    """The size of ``value`` pickled, or None when ``pickle`` cannot serialize it."""
    try:
        return len(pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL))
    except Exception:  # a lambda or a lock in the broadcast: LocalContext takes it as is
        return None
