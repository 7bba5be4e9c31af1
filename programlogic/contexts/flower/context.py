"""FlowerContext: programlogic's federated context on Flower's Grid (its Message API)."""

from __future__ import annotations

import datetime
import logging
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

import anyio

from managers.validation import check_int, check_number, check_seconds
from programlogic.context import ClientFn, FederatedContext, GroupFn, report_dropped_clients
from programlogic.contexts._threads import WorkerThreads
from programlogic.contexts.flower.client import HELLO, RECORD, WORK
from programlogic.contexts.flower.wire import decode, encode
from programlogic.contexts.units import check_group_size
from programlogic.exceptions import ClientError, NotEnoughClientsError

if TYPE_CHECKING:
    from flwr.serverapp import Grid

    from programlogic.data import ClientHandle

__all__ = ["FlowerContext"]

T = TypeVar("T")
logger = logging.getLogger(__name__)

_NOT_ENTERED = "FlowerContext is not entered: use `async with FlowerContext(grid):`"


@dataclass
class _Lost:
    """A client that gave no result: no node, an error reply from Flower, or too late."""

    error: BaseException


class FlowerContext(FederatedContext):
    """Runs client work on the SuperNodes of a Flower federation, server steps here.

    Make it inside a ``ServerApp``'s main with the ``grid`` Flower passes there (or an
    in-process one: :class:`~programlogic.contexts.flower.InProcessFederation`). The
    Grid's calls are synchronous; the context makes them on one thread of its own,
    never on the event loop. Server-side steps (``run``) run on ``server_threads``
    threads of this process.

    Each client is a node. On entering, and at each call for nodes that joined since,
    the context asks every node which declared client it is: the ``client-id`` of its
    node config (see :func:`~programlogic.contexts.flower.make_client_app`), else the
    name it is registered under (``flwr supernode register --name``, with SuperNode
    authentication). A node that restarts under a new Flower node id is found again
    the same way. Each client
    of a call gets one message naming the work and the client's loader as importable
    references (never pickled code: see :mod:`programlogic.contexts.flower.wire`); the
    node runs it on its own data and answers. A group function gets a group of one
    client: a client's data lives on its own node. Results are handed over in client
    order.

    - ``max_in_flight``: at most this many clients' messages are outstanding at once
      (default: every client of a call); it is the context's ``parallelism``.
    - ``round_deadline`` (seconds or a timedelta, from the start of a call): the rule
      for clients that give no result. Without it, a client whose node is not
      connected or whose message Flower answers with an error (a node gone: after
      about 60 s of missed heartbeats) fails the call with
      :class:`~programlogic.exceptions.ClientError` naming it. With it, those clients
      and the ones that have not answered when the deadline passes are dropped
      (reported with :func:`~programlogic.context.report_dropped_clients`; FedAvg
      counts them in its metrics) and the call completes with the clients that
      answered, in client order; fewer than ``min_clients`` of them raise
      :class:`~programlogic.exceptions.NotEnoughClientsError`. Which clients a round
      keeps is then a function of which answered in time: over-select to use it.
    - ``poll_interval``: seconds between two pulls of replies.
    - ``handshake_timeout``: how long a call waits for new nodes to say which client
      they are.

    Work that raises on a node fails the call with the ``ClientError`` it raised there,
    whatever the deadline. A call that is cancelled or fails sends nothing more and
    returns once every message it sent is answered (or, with a deadline, once the
    deadline has passed), so no client's work starts after it returns.
    """

    def __init__(
        self,
        grid: Grid,
        *,
        max_in_flight: int | None = None,
        round_deadline: float | datetime.timedelta | None = None,
        min_clients: int = 1,
        poll_interval: float = 0.05,
        handshake_timeout: float = 10.0,
        server_threads: int = 2,
    ) -> None:
        for method in ("push_messages", "pull_messages", "get_node_ids"):
            if not callable(getattr(grid, method, None)):
                raise TypeError(
                    f"grid must be a Flower Grid (the one a ServerApp's main receives); "
                    f"{type(grid).__name__} has no {method}()"
                )
        check_int("max_in_flight", max_in_flight, minimum=1, allow_none=True)
        check_int("min_clients", min_clients, minimum=1)
        check_number("poll_interval", poll_interval, above=0)
        check_number("handshake_timeout", handshake_timeout, minimum=0)
        check_int("server_threads", server_threads, minimum=1)
        self.grid = grid
        self.max_in_flight = max_in_flight
        self.round_deadline = check_seconds("round_deadline", round_deadline)
        self.min_clients = min_clients
        self.poll_interval = float(poll_interval)
        self.handshake_timeout = float(handshake_timeout)
        self.server_threads = server_threads
        self._grid_thread: WorkerThreads | None = None
        self._steps: WorkerThreads | None = None
        self._node_of: dict[str, int] = {}
        self._client_of: dict[int, str] = {}
        self._hellos: dict[str, int] = {}
        self._asked: set[int] = set()
        self._former: dict[str, int] = {}
        self._names: dict[int, str] = {}

    @property
    def parallelism(self) -> int:
        """``max_in_flight``, else the clients whose nodes are known (at least 1)."""
        return self.max_in_flight or max(1, len(self._node_of))

    @property
    def replays_rounds(self) -> bool:
        """False with a ``round_deadline``: which clients it drops depends on timing."""
        return self.round_deadline is None

    @property
    def client_ids(self) -> list[str]:
        """The declared clients whose nodes have said who they are, sorted."""
        return sorted(self._node_of)

    async def open(self) -> None:
        self._grid_thread = WorkerThreads(1, "programlogic-flower-grid")
        self._steps = WorkerThreads(self.server_threads, "programlogic-flower-steps")
        try:
            await self._handshake(wanted=None)
        except BaseException:
            await self.close()
            raise

    async def close(self) -> None:
        for workers in (self._grid_thread, self._steps):
            if workers is not None:
                await workers.stop()
        self._grid_thread = self._steps = None

    async def run(self, fn: Callable[..., T], /, *args: Any) -> T:
        if self._steps is None:
            raise RuntimeError(_NOT_ENTERED)
        return await self._steps.run(fn, *args)

    async def _grid(self, method: str, *args: Any) -> Any:
        if self._grid_thread is None:
            raise RuntimeError(_NOT_ENTERED)
        return await self._grid_thread.run(lambda: list(getattr(self.grid, method)(*args)))

    async def _handshake(self, wanted: Sequence[str] | None) -> None:
        """Learn which client each new node is; wait until ``wanted`` are known (None:
        every listed node answered), at most ``handshake_timeout``."""
        from flwr.app import Message, RecordDict

        listed = set(await self._grid("get_node_ids"))
        for node_id in [node for node in self._client_of if node not in listed]:
            client_id = self._client_of.pop(node_id)
            del self._node_of[client_id]
            self._former[client_id] = node_id
            logger.info("node %s of client %r is gone", node_id, client_id)
        new = sorted(listed - self._asked)
        if new:
            # A node registered under a name (SuperNode authentication) is that client
            # unless its node config names another.
            for info in await self._grid("get_nodes"):
                if info.node_id in new and info.HasField("name") and info.name:
                    self._names[info.node_id] = info.name
            messages = [Message(RecordDict(), node_id, HELLO) for node_id in new]
            for message_id, node_id in zip(
                await self._grid("push_messages", messages), new, strict=True
            ):
                self._hellos[message_id] = node_id
            self._asked.update(new)

        def satisfied() -> bool:
            if wanted is None:
                return not any(node in listed for node in self._hellos.values())
            return all(client_id in self._node_of for client_id in wanted)

        with anyio.move_on_after(self.handshake_timeout):
            while self._hellos:
                for reply in await self._grid("pull_messages", list(self._hellos)):
                    self._learn(reply)
                if satisfied():
                    break
                await anyio.sleep(self.poll_interval)

    def _learn(self, reply: Any) -> None:
        node_id = self._hellos.pop(reply.metadata.reply_to_message_id, None)
        if node_id is None:
            return
        if reply.has_error():
            self._asked.discard(node_id)  # asked again at the next call
            logger.warning("node %s did not answer the handshake: %s", node_id, reply.error.reason)
            return
        answer = reply.content.config_records[RECORD]
        client_id = answer.get("client-id") or self._names.get(node_id)
        if not isinstance(client_id, str):
            logger.warning("node %s is no declared client: %s", node_id, answer.get("error"))
            return
        old = self._node_of.get(client_id, self._former.pop(client_id, None))
        if old is not None and old != node_id:
            self._client_of.pop(old, None)
            logger.info("client %r is now node %s (was %s)", client_id, node_id, old)
        self._node_of[client_id] = node_id
        self._client_of[node_id] = client_id

    async def stream_units(
        self,
        fn: ClientFn | GroupFn,
        broadcast: Any,
        clients: Sequence[ClientHandle],
        group_size: int | None,
        consume: Callable[[Any], None],
    ) -> None:
        """Run the work of ``clients`` on their nodes and hand each result to ``consume``
        in client order."""
        if self._grid_thread is None:
            raise RuntimeError(_NOT_ENTERED)
        check_group_size(group_size)
        if not clients:
            return
        start = anyio.current_time()
        deadline = math.inf if self.round_deadline is None else start + self.round_deadline
        ids = [client.client_id for client in clients]
        await self._handshake(wanted=ids)
        work = await self.run(encode, (fn, broadcast, group_size is not None))
        call = _Call(self, ids, [client.loader for client in clients], work, deadline)
        try:
            kept = await call.hand_over(consume)
        except BaseException:
            with anyio.CancelScope(shield=True):
                await call.drain()
            raise
        dropped = [client_id for client_id in ids if client_id not in kept]
        if dropped:
            report_dropped_clients(dropped)
            required = min(self.min_clients, len(ids))
            if len(kept) < required:
                raise NotEnoughClientsError(len(kept), required, len(dropped))


class _Call:
    """One call's messages: sent at most ``max_in_flight`` at a time, answered in any
    order, handed over in client order."""

    def __init__(
        self,
        context: FlowerContext,
        ids: list[str],
        loaders: list[Any],
        work: bytes,
        deadline: float,
    ) -> None:
        self.context = context
        self.ids = ids
        self.loaders = loaders
        self.work = work
        self.deadline = deadline
        self.limit = context.max_in_flight or len(ids)
        self.outcomes: dict[int, list[Any] | ClientError | _Lost] = {}
        self.outstanding: dict[str, int] = {}
        self.next_to_send = 0

    async def hand_over(self, consume: Callable[[Any], None]) -> set[str]:
        kept: set[str] = set()
        next_to_consume = 0
        while next_to_consume < len(self.ids):
            await self._send()
            while next_to_consume in self.outcomes:
                outcome = self.outcomes.pop(next_to_consume)
                client_id = self.ids[next_to_consume]
                if isinstance(outcome, ClientError):
                    raise outcome
                if isinstance(outcome, _Lost):
                    if self.context.round_deadline is None:
                        raise ClientError([client_id], outcome.error)
                else:
                    for result in outcome:
                        consume(result)
                    kept.add(client_id)
                next_to_consume += 1
            if next_to_consume == len(self.ids):
                break
            if anyio.current_time() >= self.deadline:
                self._give_up()
                continue
            await anyio.sleep(min(self.context.poll_interval, self.deadline - anyio.current_time()))
            await self._pull()
        return kept

    async def _send(self) -> None:
        from flwr.app import ConfigRecord, Message, RecordDict

        context = self.context
        batch: list[tuple[int, Any]] = []
        while self.next_to_send < len(self.ids) and len(self.outstanding) + len(batch) < self.limit:
            index = self.next_to_send
            self.next_to_send += 1
            client_id = self.ids[index]
            node_id = context._node_of.get(client_id)
            if node_id is None:
                self.outcomes[index] = _Lost(
                    ConnectionError(f"no node of client {client_id!r} is connected")
                )
                continue
            loader = await context.run(encode, self.loaders[index])
            payload = ConfigRecord({"client-id": client_id, "work": self.work, "loader": loader})
            ttl = None
            if not math.isinf(self.deadline):  # a message not delivered by then never runs
                ttl = max(1.0, self.deadline - anyio.current_time())
            message = Message(RecordDict({RECORD: payload}), node_id, WORK, ttl=ttl)
            batch.append((index, message))
        if batch:
            sent = await context._grid("push_messages", [message for _, message in batch])
            for message_id, (index, _) in zip(sent, batch, strict=True):
                self.outstanding[message_id] = index

    async def _pull(self) -> None:
        if not self.outstanding:
            return
        for reply in await self.context._grid("pull_messages", list(self.outstanding)):
            index = self.outstanding.pop(reply.metadata.reply_to_message_id, None)
            if index is not None:
                self.outcomes[index] = await self._read(reply, self.ids[index])

    async def _read(self, reply: Any, client_id: str) -> list[Any] | ClientError | _Lost:
        if reply.has_error():
            return _Lost(
                ConnectionError(
                    f"Flower answered the message to client {client_id!r} with error "
                    f"{reply.error.code}: {reply.error.reason}"
                )
            )
        answer = reply.content.config_records[RECORD]
        if "error" in answer:
            return await self.context.run(decode, answer["error"])
        return await self.context.run(decode, answer["result"])

    def _give_up(self) -> None:
        """At the deadline: the clients without an answer, sent or not, are lost."""
        seconds = self.context.round_deadline
        for index in range(len(self.ids)):
            if index not in self.outcomes:
                self.outcomes[index] = _Lost(
                    TimeoutError(
                        f"client {self.ids[index]!r} did not answer within the round "
                        f"deadline of {seconds} s"
                    )
                )
        self.next_to_send = len(self.ids)

    async def drain(self) -> None:
        """Wait for the replies of every message sent (until the deadline, if any)."""
        self.next_to_send = len(self.ids)
        while self.outstanding and anyio.current_time() < self.deadline:
            await anyio.sleep(self.context.poll_interval)
            await self._pull()
