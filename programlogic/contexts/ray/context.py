"""RayContext: the federated context whose client work runs on a pool of Ray actors."""

from __future__ import annotations

import collections
import datetime
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

import anyio

from managers.validation import check_int, check_number, check_seconds, check_str, check_type
from programlogic.context import ClientFn, FederatedContext, GroupFn
from programlogic.contexts._threads import WorkerThreads
from programlogic.contexts.ray._pool import ActorPool, kill
from programlogic.contexts.ray._scheduler import UnitScheduler
from programlogic.contexts.ray._session import RaySession
from programlogic.contexts.ray._worker import CACHED_FUNCTIONS
from programlogic.contexts.units import check_group_size, split_units
from programlogic.data import TableBackedLoader
from programlogic.exceptions import NotEnoughClientsError

if TYPE_CHECKING:
    from programlogic.data import ClientHandle

__all__ = ["RayContext"]

T = TypeVar("T")

_NOT_ENTERED = "RayContext is not entered: use `async with RayContext():`"


class RayContext(FederatedContext):
    """Runs client work on a pool of Ray actors; server-side steps in this process.

    - ``address``: the cluster to connect to (``"10.0.0.1:6379"``, or ``"auto"``: the
      one ``RAY_ADDRESS`` or ``ray start`` on this machine names); None starts a new
      local cluster on this machine, whatever ``RAY_ADDRESS`` says. If Ray is already
      initialized in this process, the context uses that connection and leaves it open.
    - ``max_workers``: the actors in the pool (default: the cluster's CPUs divided by
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
        max_workers: int | None = None,
        resources_per_worker: Mapping[str, float] | None = None,
        *,
        round_deadline: float | datetime.timedelta | None = None,
        min_clients: int = 1,
        max_retries: int = 3,
        health_check_interval: float = 2.0,
        init_options: Mapping[str, Any] | None = None,
    ) -> None:
        check_str("address", address, allow_empty=False, allow_none=True)
        check_int("max_workers", max_workers, minimum=1, allow_none=True)
        if resources_per_worker is None:
            resources_per_worker = {"CPU": 1}
        check_type("resources_per_worker", resources_per_worker, Mapping)
        for name, amount in resources_per_worker.items():
            check_str("a resource name of resources_per_worker", name)
            check_number(f"resources_per_worker[{name!r}]", amount, minimum=0)
        self.round_deadline = check_seconds("round_deadline", round_deadline)
        check_int("min_clients", min_clients, minimum=1)
        check_int("max_retries", max_retries, minimum=0)
        interval = check_seconds("health_check_interval", health_check_interval)
        if interval is None:
            raise ValueError(f"health_check_interval must be finite, got {health_check_interval!r}")
        check_type("init_options", init_options, Mapping, allow_none=True)
        self.address = address
        self.max_workers = max_workers
        self.resources_per_worker = dict(resources_per_worker)
        self.min_clients = min_clients
        self.max_retries = max_retries
        self.health_check_interval = interval
        self.init_options = dict(init_options or {})
        self._session = RaySession(address, self.init_options, interval)
        self._pool = ActorPool(self._session)
        self._steps: WorkerThreads | None = None
        self._functions: collections.OrderedDict[tuple[int, str], tuple[Any, str, Any]] = (
            collections.OrderedDict()
        )
        self._tables: dict[str, tuple[Any, Any]] = {}
        self._calls = 0

    @property
    def parallelism(self) -> int:
        """The actors in the pool (``max_workers``, or what the cluster fits once entered)."""
        return self._pool.size or self.max_workers or 1

    @property
    def replays_rounds(self) -> bool:
        """False with a ``round_deadline``: which clients it drops depends on timing."""
        return self.round_deadline is None

    @property
    def owns_connection(self) -> bool:
        """Whether this context initialized Ray (and shuts it down when left)."""
        return self._session.owns_connection

    # Entering and leaving.

    async def open(self) -> None:
        self._steps = WorkerThreads(2, "programlogic-ray-steps")
        try:
            await self._session.open()
            await self._pool.start(self.max_workers, self.resources_per_worker)
        except BaseException:
            with anyio.CancelScope(shield=True):
                await self._shut_down()
            raise

    async def close(self) -> None:
        await self._shut_down()

    async def _shut_down(self) -> None:
        steps, self._steps = self._steps, None
        actors = self._pool.empty()
        self._functions.clear()
        self._tables.clear()
        if self._session.lost:  # a lost cluster: its actors are gone, asking Ray would only wait
            actors = []
        try:
            await self._session.close(lambda ray: kill(ray, actors))
        finally:
            if steps is not None:
                await steps.stop()

    # Work.

    async def run(self, fn: Callable[..., T], /, *args: Any) -> T:
        if self._steps is None:
            raise RuntimeError(_NOT_ENTERED)
        return await self._steps.run(fn, *args)

    def _ship_function(self, ray: Any, fn: Any) -> tuple[str, list[Any]]:
        """The key and boxed object reference of ``fn``, put in the object store once."""
        owner = getattr(fn, "__self__", fn)
        name = getattr(fn, "__name__", "")
        key = (id(owner), name)
        cached = self._functions.get(key)
        if cached is None or cached[0] is not owner:
            self._calls += 1
            cached = (owner, f"{self._calls}:{name}", ray.put(fn))
            self._functions[key] = cached
            if len(self._functions) > CACHED_FUNCTIONS:
                self._functions.popitem(last=False)
        self._functions.move_to_end(key)
        return cached[1], [cached[2]]

    def _ship_loader(self, ray: Any, client: ClientHandle) -> tuple[Any, ...]:
        loader = client.loader
        if isinstance(loader, TableBackedLoader):
            table = loader.table
            shipped = self._tables.get(table.key)
            if shipped is None:
                shipped = self._tables[table.key] = (table, ray.put(table))
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
        if not self._session.is_open:
            raise RuntimeError(_NOT_ENTERED)
        check_group_size(group_size)
        units = split_units(clients, group_size)
        if not units:
            return
        grouped = group_size is not None

        def prepare(ray: Any) -> tuple[str, list[Any], Any, list[list[tuple[Any, ...]]]]:
            fn_key, fn_box = self._ship_function(ray, fn)
            loaders = [[self._ship_loader(ray, client) for client in unit] for unit in units]
            return fn_key, fn_box, ray.put(broadcast), loaders

        fn_key, fn_box, broadcast_ref, loaders = await self._session.call(
            "put the work of a call in the object store", prepare
        )
        ids = [[client.client_id for client in unit] for unit in units]

        def submit(ray: Any, index: int, actor: Any) -> Any:
            return actor.run_unit.remote(
                fn_key, fn_box, broadcast_ref, ids[index], loaders[index], grouped
            )

        scheduler = UnitScheduler(
            self._session,
            self._pool,
            ids,
            submit,
            consume,
            max_retries=self.max_retries,
            round_deadline=self.round_deadline,
        )
        await scheduler.run()
        finished = sum(len(ids[i]) for i in range(len(units)) if i not in scheduler.dropped)
        required = min(self.min_clients, len(clients))
        if finished < required:
            raise NotEnoughClientsError(finished, required, len(clients) - finished)
