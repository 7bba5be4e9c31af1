"""The embedded local context: client work on a bounded pool of threads in this process."""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

from managers.taskgroups import task_group
from managers.validation import check_int
from programlogic.context import ClientFn, FederatedContext, GroupFn
from programlogic.contexts._threads import WorkerThreads
from programlogic.contexts.units import check_group_size, compute_unit, split_units
from programlogic.exceptions import ClientError

if TYPE_CHECKING:
    from programlogic.data import ClientHandle

__all__ = ["LocalContext"]

T = TypeVar("T")


class LocalContext(FederatedContext):
    """Runs client work and server-side steps on worker threads of this process.

    The context starts ``max_workers`` threads of its own when entered (default: the
    number of CPUs) and stops them when left; all its work runs there, so at most that
    many calls compute at once, always on the same threads (compiled code keeps its
    per-thread state warm). Client data is loaded on the worker thread that runs the
    client's work.
    NumPy, TensorFlow and other libraries that release the GIL get real parallelism;
    pure-Python client work runs one thread at a time but never blocks the event loop.

    Results come back in client order. :meth:`aggregate_clients` consumes them as soon
    as every earlier client's result is in, so at most the out-of-order results wait in
    memory. A client whose work raises fails the call with
    :class:`~programlogic.exceptions.ClientError` once every earlier client's result is
    handed over, and no later client starts, so what a failed call handed over does not
    depend on which thread was faster. Cancelling a call waits for the threads already
    computing to finish their current client (a thread cannot be interrupted) and starts
    no further client.
    """

    _thread_name = "programlogic-local"

    def __init__(self, max_workers: int | None = None) -> None:
        check_int("max_workers", max_workers, minimum=1, allow_none=True)
        self.max_workers = max_workers or os.cpu_count() or 1
        self._workers: WorkerThreads | None = None

    @property
    def parallelism(self) -> int:
        """``max_workers``: the threads that compute at once."""
        return self.max_workers

    async def open(self) -> None:
        self._workers = WorkerThreads(self.max_workers, name=self._thread_name)

    async def close(self) -> None:
        workers, self._workers = self._workers, None
        if workers is not None:
            await workers.stop()

    async def run(self, fn: Callable[..., T], /, *args: Any) -> T:
        return await self._require_workers().run(fn, *args)

    def _require_workers(self) -> WorkerThreads:
        if self._workers is None:
            name = type(self).__name__
            raise RuntimeError(f"{name} is not entered: use `async with {name}():`")
        return self._workers

    async def stream_units(
        self,
        fn: ClientFn | GroupFn,
        broadcast: Any,
        clients: Sequence[ClientHandle],
        group_size: int | None,
        consume: Callable[[Any], None],
    ) -> None:
        """Run the work of ``clients`` and hand each result to ``consume`` in client order."""
        workers = self._require_workers()
        check_group_size(group_size)
        units = split_units(clients, group_size)
        if not units:
            return
        pending: dict[int, list[Any] | ClientError] = {}
        next_unit_to_run = 0
        next_unit_to_consume = 0
        failed = False  # no unit starts once one has failed

        def compute(unit: list[ClientHandle]) -> list[Any]:
            nonlocal failed
            ids = [client.client_id for client in unit]
            try:
                return compute_unit(
                    fn, broadcast, ids, [c.load for c in unit], group_size is not None
                )
            except ClientError:
                # Set on the worker thread as the work fails: another worker that the
                # loop resumes first must not start a later unit meanwhile.
                failed = True
                raise

        async def worker() -> None:
            nonlocal next_unit_to_run, next_unit_to_consume
            while next_unit_to_run < len(units) and not failed:
                index = next_unit_to_run
                next_unit_to_run += 1
                try:
                    pending[index] = await workers.run(compute, units[index])
                except ClientError as error:
                    # Raised once every earlier unit is handed over, so that what finished
                    # before a failure does not depend on which thread was faster.
                    pending[index] = error
                while next_unit_to_consume in pending:
                    results = pending.pop(next_unit_to_consume)
                    if isinstance(results, ClientError):
                        raise results
                    for result in results:
                        consume(result)
                    next_unit_to_consume += 1

        async with task_group() as group:
            for _ in range(min(self.max_workers, len(units))):
                group.start_soon(worker)
