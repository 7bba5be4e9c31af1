"""The distributed context: client work on a pool of Ray actors, on one machine or many.

The same program runs on a Ray cluster with one changed line,
``async with RayContext(address=...)`` instead of ``LocalContext()``. Ray schedules the
work, moves objects and detects dead workers; this module decides what runs where:

- A pool of ``num_workers`` actors, started when the context is entered and reused by
  every call (no actor per client). Each computes one unit of work at a time: a client,
  or a group of clients when the caller passes ``group_size``, split exactly as
  :class:`~programlogic.contexts.local.LocalContext` splits them.
- The broadcast value of a call is put in the object store once and shared by all its
  units. The client function (a learning process's bound method) is put there once per
  context, and each actor unpickles it once.
- Client data is loaded on the actor by the client handle's loader, which travels
  pickled. The table of an :class:`~programlogic.data.InMemoryDataSource` is put in the
  object store once and the loaders refer to it.
- Results are folded in client order as they arrive: a result that arrives before an
  earlier unit's waits only until that one is in, so driver memory holds at most the
  out-of-order results, not a round's.
- Ray cannot interrupt a task that an actor is running, so an actor whose unit must stop
  (the call was cancelled, another unit of the call failed, or the unit missed the
  round's deadline) is killed and replaced by a new one: later calls never queue
  behind work nobody waits for.
- Errors of Ray itself become ours: :class:`~programlogic.exceptions.ClusterConnectionError`
  when the cluster no longer answers, :class:`~programlogic.exceptions.ProgramLogicError`
  otherwise, with Ray's error as ``__cause__``.

Ray is imported when a context is entered, so ``programlogic`` works without it
(``pip install 'programlogic[ray]'``).
"""

from __future__ import annotations

import asyncio
import collections
import datetime
import logging
import math
import os
import socket
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import anyio
import sniffio

from managers.validation import check_int, check_number, check_str, check_timedelta, check_type
from programlogic.context import ClientFn, GroupFn, report_dropped_clients
from programlogic.contexts._threads import WorkerThreads
from programlogic.contexts.streaming import StreamingContext
from programlogic.contexts.units import check_group_size, compute_unit, split_units
from programlogic.data import TableBackedLoader, TableLoader
from programlogic.exceptions import (
    ClientError,
    ClusterConnectionError,
    NotEnoughClientsError,
    ProgramLogicError,
)
from programlogic.tasks import task_group

if TYPE_CHECKING:
    from programlogic.data import ClientHandle

__all__ = ["RayContext"]

logger = logging.getLogger(__name__)

T = TypeVar("T")

_CACHED_FUNCTIONS = 16
"""How many client functions a context (and each actor) keeps shipped; the oldest go first."""

_RESOURCE_OPTIONS = {"CPU": "num_cpus", "GPU": "num_gpus", "memory": "memory"}
"""Resource names that Ray's actor options take as keywords of their own."""

_KILL_WAIT = 10.0
"""Seconds a call waits for the actors it killed to be gone before it leaves them to Ray."""


class _ClientWorker:
    """The body of a pool actor: computes units of client work, caching what it unpickled."""

    def __init__(self) -> None:
        self._functions: collections.OrderedDict[str, Any] = collections.OrderedDict()
        self._tables: dict[str, Any] = {}

    def ready(self) -> tuple[str, int]:
        """The actor's machine (see :func:`_machine`) and process id, once the actor is up."""
        return _machine(), os.getpid()

    def run_unit(
        self,
        fn_key: str,
        fn_box: list[Any],
        broadcast: Any,
        client_ids: list[str],
        loaders: list[tuple[Any, ...]],
        grouped: bool,
    ) -> list[Any]:
        """The results of one unit of client work (see :func:`compute_unit`)."""
        import ray

        fn = self._functions.get(fn_key)
        if fn is None:
            fn = self._functions[fn_key] = ray.get(fn_box[0])
            if len(self._functions) > _CACHED_FUNCTIONS:
                self._functions.popitem(last=False)
        return compute_unit(fn, broadcast, client_ids, [self._loader(s) for s in loaders], grouped)

    def _loader(self, shipped: tuple[Any, ...]) -> Callable[[], Any]:
        if shipped[0] == "loader":
            return shipped[1]
        _, key, box, client_id = shipped
        table = self._tables.get(key)
        if table is None:
            import ray

            table = self._tables[key] = ray.get(box[0])
        return TableLoader(table, client_id)


def _machine() -> str:
    """Names this machine (or container): where a process id names the same process."""
    try:
        boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        boot = ""
    return f"{socket.gethostname()} {boot}"


def _process_exists(pid: int) -> bool:
    """Whether process ``pid`` of this machine exists (it may be exiting)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's: it exists
        return True
    return True


def _import_ray() -> Any:
    try:
        import ray
    except ImportError as error:  # pragma: no cover - depends on the environment
        raise ImportError("RayContext needs Ray: pip install 'programlogic[ray]'") from error
    return ray


def _positive_int(name: str, value: object, *, allow_none: bool, minimum: int = 1) -> None:
    check_int(name, value, minimum=minimum, allow_none=allow_none)


def _seconds(name: str, value: object) -> float | None:
    if isinstance(value, datetime.timedelta):
        value = check_timedelta(name, value, above=datetime.timedelta(0)).total_seconds()
    if check_number(name, value, above=0, allow_none=True) is None:
        return None
    if math.isinf(value):
        return None
    return float(value)


async def _await_ref(ref: Any) -> Any:
    """The value of a Ray object reference, awaited on asyncio or trio without blocking."""
    future = ref.future()
    if sniffio.current_async_library() == "asyncio":
        return await asyncio.wrap_future(future)
    import trio

    done = trio.Event()
    token = trio.lowlevel.current_trio_token()

    def wake(_: Any) -> None:
        try:
            token.run_sync_soon(done.set)
        except trio.RunFinishedError:  # the run is over: nobody waits any more
            pass

    future.add_done_callback(wake)
    await done.wait()
    return future.result()


class RayContext(StreamingContext):
    """Runs client work on a pool of Ray actors; server-side steps in this process.

    - ``address``: the cluster to connect to (``"10.0.0.1:6379"``, or ``"auto"``: the
      one ``RAY_ADDRESS`` or ``ray start`` on this machine names); None starts a new
      local cluster on this machine, whatever ``RAY_ADDRESS`` says. If Ray is already
      initialized in this process, the context uses that connection and leaves it open.
    - ``num_workers``: the actors in the pool (default: the cluster's CPUs divided by
      the CPUs a worker takes, at least 1); it is the context's ``parallelism``.
    - ``resources_per_worker``: what each actor reserves, e.g. ``{"CPU": 1, "GPU": 0.5}``
      (default ``{"CPU": 1}``); a need the cluster cannot meet is a ``ValueError``.
    - ``round_deadline`` (seconds or a timedelta, counted from the start of a call's
      first unit of work): a call that runs longer drops the clients not finished by
      then (stragglers); their actors are killed and replaced
      (the replacements compile again). Over-select to use it: sample more clients
      than ``min_clients``.
    - ``min_clients``: a call in which fewer clients finish (after the deadline or
      after retries) raises :class:`~programlogic.exceptions.NotEnoughClientsError`;
      a call with fewer clients needs them all.
    - ``max_retries``: how many times the unit of a dead actor is retried on another
      actor before its clients are dropped.
    - ``health_check_interval``: how often (seconds) a running call checks that the
      cluster's control service still answers; a lost cluster raises
      :class:`~programlogic.exceptions.ClusterConnectionError`.
    - ``init_options``: more keyword arguments for ``ray.init``.

    Dropped clients are reported with :func:`~programlogic.context.report_dropped_clients`
    (FedAvg counts them in its metrics). A call that is cancelled, or fails because
    the work of a client raised, kills the actors still running its other units and
    starts new ones in their place (which compile again); it returns once the killed
    actors are gone, so the next call never waits for abandoned work. Leaving the
    context kills the pool, and shuts down the Ray connection (and the local cluster)
    only if it started them.
    """

    def __init__(
        self,
        address: str | None = None,
        num_workers: int | None = None,
        resources_per_worker: Mapping[str, float] | None = None,
        *,
        round_deadline: float | datetime.timedelta | None = None,
        min_clients: int = 1,
        max_retries: int = 3,
        health_check_interval: float = 2.0,
        init_options: Mapping[str, Any] | None = None,
    ) -> None:
        check_str("address", address, allow_empty=False, allow_none=True)
        _positive_int("num_workers", num_workers, allow_none=True)
        if resources_per_worker is None:
            resources_per_worker = {"CPU": 1}
        check_type("resources_per_worker", resources_per_worker, Mapping)
        for name, amount in resources_per_worker.items():
            check_str("a resource name of resources_per_worker", name)
            check_number(f"resources_per_worker[{name!r}]", amount, minimum=0)
        self.round_deadline = _seconds("round_deadline", round_deadline)
        _positive_int("min_clients", min_clients, allow_none=False)
        _positive_int("max_retries", max_retries, allow_none=False, minimum=0)
        interval = _seconds("health_check_interval", health_check_interval)
        if interval is None:
            raise ValueError(f"health_check_interval must be finite, got {health_check_interval!r}")
        check_type("init_options", init_options, Mapping, allow_none=True)
        self.address = address
        self.num_workers = num_workers
        self.resources_per_worker = dict(resources_per_worker)
        self.min_clients = min_clients
        self.max_retries = max_retries
        self.health_check_interval = interval
        self.init_options = dict(init_options or {})
        self._ray: Any = None
        self._ray_thread: WorkerThreads | None = None
        self._steps: WorkerThreads | None = None
        self._owns_connection = False
        self._gcs_address: tuple[str, int] | None = None
        self._workers = 0
        self._idle: list[Any] = []
        self._starting: list[Any] = []
        self._busy: list[Any] = []
        self._listeners: set[Any] = set()
        self._actor_class: Any = None
        self._functions: collections.OrderedDict[tuple[int, str], tuple[Any, str, Any]] = (
            collections.OrderedDict()
        )
        self._tables: dict[str, tuple[Any, Any]] = {}
        self._calls = 0
        self._lost = False
        self._machine = _machine()
        self._local_pids: dict[Any, int] = {}  # actor -> its process, if on this machine

    @property
    def parallelism(self) -> int:
        """The actors in the pool (``num_workers``, or what the cluster fits once entered)."""
        return self._workers or self.num_workers or 1

    @property
    def owns_connection(self) -> bool:
        """Whether this context initialized Ray (and shuts it down when left)."""
        return self._owns_connection

    # Entering and leaving.

    async def open(self) -> None:
        self._ray = _import_ray()
        # Ray's processes die with the thread that started them (Linux's parent-death
        # signal is per thread): a thread of our own, alive as long as the context.
        self._ray_thread = WorkerThreads(1, "programlogic-ray", daemon=False)
        self._steps = WorkerThreads(2, "programlogic-ray-steps")
        try:
            await self._ray_thread.run(self._connect)
            await self._ray_thread.run(self._start_pool)
        except BaseException:
            with anyio.CancelScope(shield=True):
                await self._shut_down()
            raise

    def _connect(self) -> None:
        ray = self._ray
        if ray.is_initialized():
            logger.info("RayContext: using the Ray connection this process already has")
        else:
            options: dict[str, Any] = {
                "include_dashboard": False,
                "logging_level": logging.WARNING,
                **self.init_options,
            }
            try:
                # "local": a new cluster even if RAY_ADDRESS names a running one.
                ray.init(address=self.address or "local", **options)
            except ConnectionError as error:
                raise ClusterConnectionError(
                    f"could not connect to the Ray cluster at {self.address!r}: {error}"
                ) from error
            self._owns_connection = True
        host, _, port = ray.get_runtime_context().gcs_address.rpartition(":")
        self._gcs_address = (host, int(port))

    def _start_pool(self) -> None:
        ray = self._ray
        total = ray.cluster_resources()
        for name, amount in self.resources_per_worker.items():
            if amount > total.get(name, 0):
                raise ValueError(
                    f"resources_per_worker asks {amount} {name} per worker, the cluster has "
                    f"{total.get(name, 0)}"
                )
        workers = self.num_workers
        if workers is None:
            cpus = self.resources_per_worker.get("CPU", 0)
            workers = max(1, int(total.get("CPU", 1) // cpus)) if cpus else 1
        self._workers = workers
        options: dict[str, Any] = {"num_cpus": 0, "max_restarts": 0}
        custom: dict[str, float] = {}
        for name, amount in self.resources_per_worker.items():
            if name in _RESOURCE_OPTIONS:
                options[_RESOURCE_OPTIONS[name]] = amount
            else:
                custom[name] = amount
        if custom:
            options["resources"] = custom
        self._actor_class = ray.remote(_ClientWorker).options(**options)
        self._starting = [self._actor_class.remote() for _ in range(workers)]

    async def close(self) -> None:
        await self._shut_down()

    async def _shut_down(self) -> None:
        ray_thread, self._ray_thread = self._ray_thread, None
        steps, self._steps = self._steps, None
        actors = [*self._idle, *self._starting, *self._busy]
        self._idle, self._starting, self._busy = [], [], []
        self._functions.clear()
        self._tables.clear()
        self._local_pids.clear()
        owns, self._owns_connection = self._owns_connection, False
        self._workers = 0
        if self._lost:  # a lost cluster: its actors are gone, asking Ray would only wait
            actors = []
        self._lost = False

        def shut_down() -> None:
            ray = self._ray
            if not ray.is_initialized():
                return
            for actor in actors:
                try:
                    ray.kill(actor)
                except Exception:  # already gone with its node or the cluster
                    logger.debug("RayContext: killing an actor failed", exc_info=True)
            if owns:
                ray.shutdown()

        if ray_thread is not None:
            try:
                await ray_thread.run(shut_down)
            finally:
                await ray_thread.stop()
        if steps is not None:
            await steps.stop()

    # Work.

    async def run(self, fn: Callable[..., T], /, *args: Any) -> T:
        if self._steps is None:
            raise RuntimeError("RayContext is not entered: use `async with RayContext():`")
        return await self._steps.run(fn, *args)

    def _require_ray_thread(self) -> WorkerThreads:
        if self._ray_thread is None:
            raise RuntimeError("RayContext is not entered: use `async with RayContext():`")
        return self._ray_thread

    def _ship_function(self, fn: Any) -> tuple[str, list[Any]]:
        """The key and boxed object reference of ``fn``, put in the object store once."""
        owner = getattr(fn, "__self__", fn)
        name = getattr(fn, "__name__", "")
        key = (id(owner), name)
        cached = self._functions.get(key)
        if cached is None or cached[0] is not owner:
            self._calls += 1
            cached = (owner, f"{self._calls}:{name}", self._ray.put(fn))
            self._functions[key] = cached
            if len(self._functions) > _CACHED_FUNCTIONS:
                self._functions.popitem(last=False)
        self._functions.move_to_end(key)
        return cached[1], [cached[2]]

    def _ship_loader(self, client: ClientHandle) -> tuple[Any, ...]:
        loader = client.loader
        if isinstance(loader, TableBackedLoader):
            table = loader.table
            shipped = self._tables.get(table.key)
            if shipped is None:
                shipped = self._tables[table.key] = (table, self._ray.put(table))
            return ("table", table.key, [shipped[1]], loader.client_id)
        return ("loader", loader)

    async def stream_units(
        self,
        fn: ClientFn | GroupFn,
        broadcast: Any,
        clients: Sequence[ClientHandle],
        group_size: int | None,
        consume: Callable[[Any], None],
    ) -> None:
        """Run the work of ``clients`` on the pool; hand each result to ``consume`` in order."""
        self._require_ray_thread()
        check_group_size(group_size)
        units = split_units(clients, group_size)
        if not units:
            return
        ray = self._ray
        grouped = group_size is not None

        def prepare() -> tuple[str, list[Any], Any, list[list[tuple[Any, ...]]]]:
            fn_key, fn_box = self._ship_function(fn)
            loaders = [[self._ship_loader(client) for client in unit] for unit in units]
            return fn_key, fn_box, ray.put(broadcast), loaders

        fn_key, fn_box, broadcast_ref, loaders = await self._call_ray(
            "put the work of a call in the object store", prepare
        )
        ids = [[client.client_id for client in unit] for unit in units]
        results: dict[int, list[Any]] = {}
        dropped: set[int] = set()
        attempts = [0] * len(units)
        queue = collections.deque(range(len(units)))
        in_flight: dict[int, Any] = {}  # unit -> the actor it was handed to
        refs: dict[int, Any] = {}  # unit -> the reference to its result, once submitted
        next_to_consume = 0
        start_failures = 0
        send, receive = anyio.create_memory_object_stream[tuple[Any, ...]](math.inf)
        deadline = math.inf  # set when the first unit starts

        def consume_ready() -> None:
            nonlocal next_to_consume
            while next_to_consume in results or next_to_consume in dropped:
                for result in results.pop(next_to_consume, ()):
                    consume(result)
                next_to_consume += 1

        async def wait_ready(actor: Any) -> None:
            try:
                machine, pid = await _await_ref(actor.ready.remote())
            except ray.exceptions.RayError as error:
                await send.send(("start_failed", actor, error))
            else:
                await send.send(("ready", actor, machine, pid))

        async def wait_unit(index: int, actor: Any, ref: Any) -> None:
            try:
                value = await _await_ref(ref)
            except ray.exceptions.RayTaskError as error:
                cause = error.cause
                if not isinstance(cause, ClientError):
                    cause = ClientError(ids[index], cause)
                await send.send(("failed", index, actor, cause))
            except ray.exceptions.RayError as error:  # the actor, its node, or its result died
                await send.send(("died", index, actor, error))
            else:
                await send.send(("done", index, actor, value))

        def submit(index: int, actor: Any) -> Any:
            return actor.run_unit.remote(
                fn_key, fn_box, broadcast_ref, ids[index], loaders[index], grouped
            )

        def take(index: int) -> Any:
            """The actor of unit ``index``, which no longer counts as busy."""
            actor = in_flight.pop(index)
            refs.pop(index, None)
            self._busy.remove(actor)
            return actor

        async def check_cluster() -> None:
            while True:
                await anyio.sleep(self.health_check_interval)
                await self._check_connection()

        def drop(index: int) -> None:
            dropped.add(index)
            report_dropped_clients(ids[index])

        async with send, receive, task_group() as group:
            group.start_soon(check_cluster)
            self._listeners.add(send)
            watching: set[Any] = set()
            try:
                while next_to_consume < len(units):
                    for actor in self._starting:
                        if actor not in watching:
                            watching.add(actor)
                            group.start_soon(wait_ready, actor)
                    while queue and self._idle:
                        index, actor = queue.popleft(), self._idle.pop()
                        self._busy.append(actor)
                        in_flight[index] = actor
                        ref = refs[index] = await self._call_ray(
                            "hand a unit of work to a worker", submit, index, actor
                        )
                        if self.round_deadline is not None and deadline == math.inf:
                            deadline = anyio.current_time() + self.round_deadline
                        group.start_soon(wait_unit, index, actor, ref)
                    if queue and not (self._idle or self._starting or self._busy):
                        raise ProgramLogicError("RayContext: no worker of the pool is left")
                    with anyio.move_on_after(deadline - anyio.current_time()) as waiting:
                        event = await receive.receive()
                    if waiting.cancelled_caught:
                        # Stragglers: drop what has not finished, replace busy actors.
                        queue.clear()
                        stragglers = [refs[index] for index in sorted(refs)]
                        busy = [take(index) for index in sorted(in_flight)]
                        for index in range(next_to_consume, len(units)):
                            if index not in results and index not in dropped:
                                drop(index)
                        await self._replace(busy, stragglers)
                        consume_ready()
                        break
                    kind = event[0]
                    if kind == "wake":
                        pass  # another call freed or started actors: look again
                    elif kind == "ready":
                        _, actor, machine, pid = event
                        if actor in self._starting:  # not taken by a concurrent call
                            self._starting.remove(actor)
                            if machine == self._machine:
                                self._local_pids[actor] = pid
                            self._release(actor)
                    elif kind == "start_failed":
                        if event[1] not in self._starting:
                            continue
                        self._starting.remove(event[1])
                        logger.warning("RayContext: a worker failed to start: %s", event[2])
                        await self._check_connection()
                        start_failures += 1
                        if start_failures > (self.max_retries + 1) * self.parallelism:
                            raise ProgramLogicError(
                                f"RayContext: {start_failures} workers failed to start in "
                                f"this call, the last with: {event[2]}"
                            ) from event[2]
                        await self._replace([event[1]])
                    elif kind == "done":
                        _, index, _, value = event
                        self._release(take(index))
                        results[index] = value
                        consume_ready()
                    elif kind == "failed":
                        _, index, _, error = event
                        self._release(take(index))
                        raise error
                    else:  # died
                        _, index, _, error = event
                        actor = take(index)
                        await self._check_connection()
                        attempts[index] += 1
                        if attempts[index] > self.max_retries:
                            logger.warning(
                                "RayContext: dropping clients %s after %d failed attempts: %s",
                                ids[index],
                                attempts[index],
                                error,
                            )
                            drop(index)
                            consume_ready()
                        else:
                            logger.warning(
                                "RayContext: a worker died (%s); retrying clients %s",
                                type(error).__name__,
                                ids[index],
                            )
                            queue.appendleft(index)
                        await self._replace([actor])
            except BaseException:
                # Nothing of this call may keep running, and a running actor task cannot
                # be interrupted: the actors still busy with its units are replaced.
                abandoned = list(refs.values())
                busy = [take(index) for index in sorted(in_flight)]
                with anyio.CancelScope(shield=True):
                    try:
                        await self._replace(busy, abandoned)
                    except Exception:  # the call's own error is the one to raise
                        logger.warning(
                            "RayContext: could not replace %d workers", len(busy), exc_info=True
                        )
                raise
            finally:
                self._listeners.discard(send)
                group.cancel_scope.cancel()
        finished = sum(len(ids[index]) for index in range(len(units)) if index not in dropped)
        dropped_count = len(clients) - finished
        required = min(self.min_clients, len(clients))
        if finished < required:
            raise NotEnoughClientsError(finished, required, dropped_count)

    async def _call_ray(self, what: str, fn: Callable[..., T], /, *args: Any) -> T:
        """``fn(*args)`` on the context's Ray thread; an error of Ray's becomes ours.

        A lost cluster raises :class:`ClusterConnectionError`; any other error of Ray's
        a :class:`ProgramLogicError` saying what could not be done. Other errors (a
        value Ray cannot serialize is a ``TypeError``) propagate unchanged.
        """
        ray_thread = self._require_ray_thread()
        try:
            return await ray_thread.run(fn, *args)
        except self._ray.exceptions.RayError as error:
            await self._check_connection()
            raise ProgramLogicError(
                f"RayContext could not {what}: {type(error).__name__}: {error}"
            ) from error

    async def _replace(self, actors: list[Any], abandoned: Sequence[Any] = ()) -> None:
        """Kill ``actors`` and put as many new ones in the pool, starting.

        ``abandoned`` are the references to the results of what the actors were running.
        The call waits (up to ``_KILL_WAIT`` seconds) until they fail, that is until Ray
        counts the actors dead, and until the processes of those on this machine have
        exited, so that no work of the call outlives it. Nothing is asked of a lost
        cluster.
        """
        pids = [self._local_pids.pop(actor) for actor in actors if actor in self._local_pids]
        if not actors or self._lost:
            return
        ray = self._ray
        started: list[Any] = []

        def replace() -> None:
            for actor in actors:
                try:
                    ray.kill(actor)
                except Exception:  # already gone
                    logger.debug("RayContext: killing an actor failed", exc_info=True)
            for _ in actors:
                started.append(self._actor_class.remote())

        async def settle(ref: Any) -> None:
            try:
                await _await_ref(ref)
            except Exception:  # how the abandoned work ended does not matter, only that it did
                logger.debug("RayContext: abandoned work ended with an error", exc_info=True)

        async def exited(pid: int) -> None:
            while _process_exists(pid):
                await anyio.sleep(0.005)

        try:
            with anyio.CancelScope(shield=True):
                await self._call_ray("replace a worker", replace)
                with anyio.move_on_after(_KILL_WAIT) as waiting:
                    async with anyio.create_task_group() as group:
                        for ref in abandoned:
                            group.start_soon(settle, ref)
                        for pid in pids:
                            group.start_soon(exited, pid)
                if waiting.cancelled_caught:
                    logger.warning(
                        "RayContext: %d killed workers were not gone after %s s; leaving them "
                        "to Ray",
                        len(actors),
                        _KILL_WAIT,
                    )
        finally:
            self._add_starting(started)

    def _release(self, actor: Any) -> None:
        """Put ``actor`` back in the pool and wake the calls that wait for one."""
        self._idle.append(actor)
        self._wake()

    def _add_starting(self, actors: list[Any]) -> None:
        """Add actors that are starting; the running calls watch them too."""
        self._starting.extend(actors)
        self._wake()

    def _wake(self) -> None:
        for listener in self._listeners:
            listener.send_nowait(("wake",))

    async def _check_connection(self) -> None:
        """Raise :class:`ClusterConnectionError` unless the cluster's control service answers."""
        assert self._gcs_address is not None
        host, port = self._gcs_address
        try:
            with anyio.fail_after(max(5.0, self.health_check_interval)):
                stream = await anyio.connect_tcp(host, port)
            await stream.aclose()
        except (OSError, TimeoutError) as error:
            self._lost = True
            raise ClusterConnectionError(
                f"lost the connection to the Ray cluster (its control service at "
                f"{host}:{port} does not answer: {error or type(error).__name__}); rerun the "
                "program to resume from its last checkpoint"
            ) from error
