"""One call's units of work on the pool: handed to idle actors, retried when their actor
dies, dropped past the round's deadline, their results handed over in unit order."""

from __future__ import annotations

import collections
import logging
import math
from collections.abc import Callable, Sequence
from typing import Any

import anyio
from anyio.abc import TaskGroup
from anyio.streams.memory import MemoryObjectSendStream

from managers.taskgroups import task_group
from programlogic.context import report_dropped_clients
from programlogic.contexts.ray._events import (
    Died,
    Done,
    Event,
    Failed,
    Ready,
    StartFailed,
    Wake,
)
from programlogic.contexts.ray._pool import ActorPool
from programlogic.contexts.ray._session import RaySession
from programlogic.exceptions import ClientError, ClusterConnectionError, ProgramLogicError

__all__ = ["Submit", "UnitScheduler"]

logger = logging.getLogger("programlogic.contexts.ray")

Submit = Callable[[Any, int, Any], Any]
"""``submit(ray, index, actor)`` hands unit ``index`` to ``actor``; its result's reference."""


class UnitScheduler:
    """Runs the units of one call on ``pool`` and hands their results to ``consume``.

    ``ids`` holds the client ids of each unit. A unit whose actor dies is retried on
    another up to ``max_retries`` times, then its clients are dropped; once
    ``round_deadline`` seconds have passed since the first unit started, what has not
    finished is dropped and its actors replaced. Work that raises raises its
    :class:`ClientError`; whatever ends the call, the actors still running its units are
    replaced before it returns. Dropped clients are reported with
    :func:`report_dropped_clients`.
    """

    def __init__(
        self,
        session: RaySession,
        pool: ActorPool,
        ids: Sequence[Sequence[str]],
        submit: Submit,
        consume: Callable[[Any], None],
        *,
        max_retries: int,
        round_deadline: float | None,
    ) -> None:
        self._session, self._pool, self._ids = session, pool, ids
        self._submit, self._consume = submit, consume
        self._max_retries, self._round_deadline = max_retries, round_deadline
        self._results: dict[int, list[Any]] = {}
        self.dropped: set[int] = set()
        self._attempts = [0] * len(ids)
        self._queue = collections.deque(range(len(ids)))
        self._in_flight: dict[int, Any] = {}  # unit -> the actor it was handed to
        self._refs: dict[int, Any] = {}  # unit -> the reference to its result, once submitted
        self._next = 0  # the next unit to consume
        self._start_failures = 0
        self._deadline = math.inf  # set when the first unit starts
        self._watching: set[Any] = set()

    async def run(self) -> None:
        """Run every unit; return once each has been consumed or dropped."""
        send, receive = anyio.create_memory_object_stream[Event](math.inf)
        async with send, receive, task_group() as group:
            group.start_soon(self._check_cluster)
            self._pool.listen(send)
            try:
                while self._next < len(self._ids):
                    await self._hand_out(group, send)
                    with anyio.move_on_after(self._deadline - anyio.current_time()) as waiting:
                        event = await receive.receive()
                    if waiting.cancelled_caught:
                        await self._drop_stragglers()
                        break
                    await self._handle(event)
            except BaseException:
                await self._abandon()
                raise
            finally:
                self._pool.unlisten(send)
                group.cancel_scope.cancel()

    async def _hand_out(self, group: TaskGroup, send: MemoryObjectSendStream[Event]) -> None:
        """Watch the actors that are starting; hand queued units to the idle ones."""
        pool = self._pool
        for actor in pool.starting:
            if actor not in self._watching:
                self._watching.add(actor)
                group.start_soon(self._wait_ready, actor, send)
        while self._queue and pool.idle:
            index, actor = self._queue.popleft(), pool.acquire()
            self._in_flight[index] = actor
            ref = self._refs[index] = await self._session.call(
                "hand a unit of work to a worker", self._submit, index, actor
            )
            if self._round_deadline is not None and self._deadline == math.inf:
                self._deadline = anyio.current_time() + self._round_deadline
            group.start_soon(self._wait_unit, index, ref, send)
        if self._queue and not (pool.idle or pool.starting or pool.busy):
            raise ProgramLogicError("RayContext: no worker of the pool is left")

    async def _wait_ready(self, actor: Any, send: MemoryObjectSendStream[Event]) -> None:
        try:
            ref = await self._session.call("start a worker", lambda ray: actor.ready.remote())
            machine, pid = await self._session.wait(ref, "start a worker")
        except ClusterConnectionError:
            raise
        except ProgramLogicError as error:
            await send.send(StartFailed(actor, error))
        else:
            await send.send(Ready(actor, machine, pid))

    async def _wait_unit(self, index: int, ref: Any, send: MemoryObjectSendStream[Event]) -> None:
        try:
            results = await self._session.wait(ref, "compute a unit of work", self._ids[index])
        except ClientError as error:
            await send.send(Failed(index, error))
        except ClusterConnectionError:
            raise
        except ProgramLogicError as error:  # the actor, its node, or its result died
            await send.send(Died(index, error))
        else:
            await send.send(Done(index, results))

    async def _check_cluster(self) -> None:
        while True:
            await anyio.sleep(self._session.health_check_interval)
            await self._session.check_connection()

    async def _handle(self, event: Event) -> None:
        match event:
            case Wake():
                pass  # another call freed or started actors: look again
            case Ready():
                self._pool.ready(event)
            case StartFailed(actor, error):
                await self._start_failed(actor, error)
            case Done(index, results):
                self._pool.release(self._take(index))
                self._results[index] = results
                self._consume_ready()
            case Failed(index, error):
                self._pool.release(self._take(index))
                raise error
            case Died(index, error):
                await self._died(index, error)

    async def _start_failed(self, actor: Any, error: ProgramLogicError) -> None:
        if not self._pool.start_failed(actor):
            return
        logger.warning("RayContext: a worker failed to start: %s", error)
        await self._session.check_connection()
        self._start_failures += 1
        if self._start_failures > (self._max_retries + 1) * self._pool.size:
            raise ProgramLogicError(
                f"RayContext: {self._start_failures} workers failed to start in "
                f"this call, the last with: {error}"
            ) from error
        await self._pool.replace([actor])

    async def _died(self, index: int, error: ProgramLogicError) -> None:
        actor = self._take(index)
        await self._session.check_connection()
        self._attempts[index] += 1
        ids = self._ids[index]
        if self._attempts[index] > self._max_retries:
            logger.warning(
                "RayContext: dropping clients %s after %d failed attempts: %s",
                ids,
                self._attempts[index],
                error,
            )
            self._drop(index)
            self._consume_ready()
        else:
            cause = error.__cause__ or error
            logger.warning(
                "RayContext: a worker died (%s); retrying clients %s", type(cause).__name__, ids
            )
            self._queue.appendleft(index)
        await self._pool.replace([actor])

    def _take(self, index: int) -> Any:
        """The actor of unit ``index``, which no longer counts as busy."""
        self._refs.pop(index, None)
        return self._pool.retire(self._in_flight.pop(index))

    def _drop(self, index: int) -> None:
        self.dropped.add(index)
        report_dropped_clients(self._ids[index])

    def _consume_ready(self) -> None:
        while self._next in self._results or self._next in self.dropped:
            for result in self._results.pop(self._next, ()):
                self._consume(result)
            self._next += 1

    async def _drop_stragglers(self) -> None:
        """The deadline passed: drop what has not finished, replace the busy actors."""
        self._queue.clear()
        stragglers = [self._refs[index] for index in sorted(self._refs)]
        busy = [self._take(index) for index in sorted(self._in_flight)]
        for index in range(self._next, len(self._ids)):
            if index not in self._results and index not in self.dropped:
                self._drop(index)
        await self._pool.replace(busy, stragglers)
        self._consume_ready()

    async def _abandon(self) -> None:
        """Replace the actors still busy with the call's units: their work cannot be stopped."""
        abandoned = list(self._refs.values())
        busy = [self._take(index) for index in sorted(self._in_flight)]
        with anyio.CancelScope(shield=True):
            try:
                await self._pool.replace(busy, abandoned)
            except Exception:  # the call's own error is the one to raise
                logger.warning("RayContext: could not replace %d workers", len(busy), exc_info=True)
