"""The pool of actors of a Ray context: started once, shared by every call, and replaced
actor by actor when one must stop (Ray cannot interrupt the task an actor runs)."""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any

import anyio
from anyio.streams.memory import MemoryObjectSendStream

from programlogic.contexts.ray._events import Event, Ready, Wake
from programlogic.contexts.ray._session import RaySession
from programlogic.contexts.ray._worker import ClientWorker, machine, process_exists

__all__ = ["ActorPool"]

logger = logging.getLogger("programlogic.contexts.ray")

_RESOURCE_OPTIONS = {"CPU": "num_cpus", "GPU": "num_gpus", "memory": "memory"}
"""Resource names that Ray's actor options take as keywords of their own."""

KILL_WAIT = 10.0
"""Seconds a call waits for the actors it killed to be gone before it leaves them to Ray."""


def kill(ray: Any, actors: Sequence[Any]) -> None:
    """Kill ``actors``; those already gone are skipped."""
    for actor in actors:
        try:
            ray.kill(actor)
        except Exception:  # already gone with its node or the cluster
            logger.debug("RayContext: killing an actor failed", exc_info=True)


class ActorPool:
    """Actors that are starting, idle or busy; the running calls listen for changes.

    An actor is idle once a call saw it :class:`Ready`; a call takes it with
    :meth:`acquire` and hands it back with :meth:`release`, or with :meth:`replace`
    when its work must stop.
    """

    def __init__(self, session: RaySession) -> None:
        self._session = session
        self.size = 0
        self.idle: list[Any] = []
        self.starting: list[Any] = []
        self.busy: list[Any] = []
        self._listeners: set[MemoryObjectSendStream[Event]] = set()
        self._actor_class: Any = None
        self._machine = machine()
        self._local_pids: dict[Any, int] = {}  # actor -> its process, if on this machine

    async def start(self, size: int | None, resources: Mapping[str, float]) -> None:
        """Start ``size`` actors (None: as many as fit), each reserving ``resources``."""
        await self._session.call("start the workers", self._start, size, resources)

    def _start(self, ray: Any, size: int | None, resources: Mapping[str, float]) -> None:
        total = ray.cluster_resources()
        for name, amount in resources.items():
            if amount > total.get(name, 0):
                raise ValueError(
                    f"resources_per_worker asks {amount} {name} per worker, the cluster has "
                    f"{total.get(name, 0)}"
                )
        if size is None:
            cpus = resources.get("CPU", 0)
            size = max(1, int(total.get("CPU", 1) // cpus)) if cpus else 1
        self.size = size
        options: dict[str, Any] = {"num_cpus": 0, "max_restarts": 0}
        custom: dict[str, float] = {}
        for name, amount in resources.items():
            if name in _RESOURCE_OPTIONS:
                options[_RESOURCE_OPTIONS[name]] = amount
            else:
                custom[name] = amount
        if custom:
            options["resources"] = custom
        self._actor_class = ray.remote(ClientWorker).options(**options)
        self.starting = [self._actor_class.remote() for _ in range(size)]

    def empty(self) -> list[Any]:
        """Forget every actor (the context is left); the actors that were in the pool."""
        actors = [*self.idle, *self.starting, *self.busy]
        self.idle, self.starting, self.busy = [], [], []
        self._local_pids.clear()
        self.size = 0
        return actors

    def listen(self, send: MemoryObjectSendStream[Event]) -> None:
        """Send :class:`Wake` to ``send`` whenever actors become idle or start."""
        self._listeners.add(send)

    def unlisten(self, send: MemoryObjectSendStream[Event]) -> None:
        """Stop sending to ``send``."""
        self._listeners.discard(send)

    def ready(self, event: Ready) -> None:
        """A starting actor is up: it becomes idle (unless another call took it already)."""
        if event.actor in self.starting:
            self.starting.remove(event.actor)
            if event.machine == self._machine:
                self._local_pids[event.actor] = event.pid
            self.release(event.actor)

    def start_failed(self, actor: Any) -> bool:
        """A starting actor failed: whether it was still starting (no call saw it yet)."""
        if actor not in self.starting:
            return False
        self.starting.remove(actor)
        return True

    def acquire(self) -> Any:
        """An idle actor, now busy."""
        actor = self.idle.pop()
        self.busy.append(actor)
        return actor

    def retire(self, actor: Any) -> Any:
        """``actor`` is no longer busy, and not idle either (it will be replaced)."""
        self.busy.remove(actor)
        return actor

    def release(self, actor: Any) -> None:
        """Put ``actor`` (not busy) back in the pool and wake the calls that wait for one."""
        self.idle.append(actor)
        self._wake()

    def _wake(self) -> None:
        for listener in self._listeners:
            listener.send_nowait(Wake())

    async def replace(self, actors: list[Any], abandoned: Sequence[Any] = ()) -> None:
        """Kill ``actors`` and put as many new ones in the pool, starting.

        ``abandoned`` are the references to the results of what the actors were running.
        The call waits (up to ``KILL_WAIT`` seconds) until they fail, that is until Ray
        counts the actors dead, and until the processes of those on this machine have
        exited, so that no work of the call outlives it. Nothing is asked of a lost
        cluster.
        """
        pids = [self._local_pids.pop(actor) for actor in actors if actor in self._local_pids]
        if not actors or self._session.lost:
            return
        started: list[Any] = []

        def replace(ray: Any) -> None:
            kill(ray, actors)
            started.extend(self._actor_class.remote() for _ in actors)

        try:
            with anyio.CancelScope(shield=True):
                await self._session.call("replace a worker", replace)
                with anyio.move_on_after(KILL_WAIT) as waiting:
                    async with anyio.create_task_group() as group:
                        for ref in abandoned:
                            group.start_soon(self._settle, ref)
                        for pid in pids:
                            group.start_soon(_exited, pid)
                if waiting.cancelled_caught:
                    logger.warning(
                        "RayContext: %d killed workers were not gone after %s s; leaving them "
                        "to Ray",
                        len(actors),
                        KILL_WAIT,
                    )
        finally:
            self.starting.extend(started)
            self._wake()

    async def _settle(self, ref: Any) -> None:
        try:
            await self._session.wait(ref, "finish abandoned work")
        except Exception:  # how the abandoned work ended does not matter, only that it did
            logger.debug("RayContext: abandoned work ended with an error", exc_info=True)


async def _exited(pid: int) -> None:
    while process_exists(pid):
        await anyio.sleep(0.005)
