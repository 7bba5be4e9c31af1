"""``TFFContext``: a federated context that runs TensorFlow Federated computations."""

from __future__ import annotations

import inspect
import logging
import signal
import subprocess
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

import anyio
import tensorflow_federated as tff

from managers.validation import check_int
from programlogic.context import ClientFn, FederatedContext, GroupFn
from programlogic.contexts.local import LocalContext

if TYPE_CHECKING:
    from programlogic.data import ClientHandle

__all__ = ["TFFContext"]

logger = logging.getLogger(__name__)

T = TypeVar("T")

_STOP_TIMEOUT_S = 10.0


class TFFContext(FederatedContext):
    """Runs TFF computations on TFF's C++ runtime, on a thread of its own.

    Entering the context starts one worker thread and makes a new TFF synchronous
    execution context (``tff.backends.native.create_sync_local_cpp_execution_context``
    with ``default_num_clients`` and ``max_concurrent_computation_calls``) the default
    TFF context of that thread only. Every call of the context runs there, one at a
    time: :meth:`run`, the client work of :meth:`map_clients`, and so every method of
    a :class:`~programlogic.contexts.tff.TFFLearningProcess`. The event loop is never
    blocked, and TFF computations invoked on other threads are not affected.

    TFF's runtime starts a ``worker_binary`` process on the first computation it runs;
    leaving the context stops it (SIGINT, then SIGKILL after 10 s), closes the
    executors and ends TFF's own event-loop thread and the worker thread. A context
    may be entered again afterwards; it then starts a fresh runtime.

    A computation cannot be interrupted: cancelling a call that already runs waits for
    it to finish (its result is discarded); calls not yet started are withdrawn.
    """

    def __init__(
        self, *, default_num_clients: int = 0, max_concurrent_computation_calls: int = -1
    ) -> None:
        check_int("default_num_clients", default_num_clients, minimum=0)
        check_int("max_concurrent_computation_calls", max_concurrent_computation_calls)
        self.default_num_clients = default_num_clients
        self.max_concurrent_computation_calls = max_concurrent_computation_calls
        self._thread: LocalContext | None = None
        self._runtime: tff.framework.SyncContext | None = None

    @property
    def worker_pid(self) -> int | None:
        """The process id of TFF's ``worker_binary`` while it runs, else ``None``."""
        process = _service_manager_process(self._runtime)
        return None if process is None or process.poll() is not None else process.pid

    async def open(self) -> None:
        thread = LocalContext(max_workers=1)
        await thread.open()
        try:
            self._runtime = await thread.run(self._start_runtime)
        except BaseException:
            with anyio.CancelScope(shield=True):
                await thread.close()
            raise
        self._thread = thread

    async def close(self) -> None:
        thread, self._thread = self._thread, None
        runtime, self._runtime = self._runtime, None
        if thread is None:
            return
        with anyio.CancelScope(shield=True):
            try:
                if runtime is not None:
                    await thread.run(_stop_runtime, runtime)
            finally:
                await thread.close()

    async def run(self, fn: Callable[..., T], /, *args: Any) -> T:
        return await self._require_thread().run(fn, *args)

    async def stream_units(
        self,
        fn: ClientFn | GroupFn,
        broadcast: Any,
        clients: Sequence[ClientHandle],
        group_size: int | None,
        consume: Callable[[Any], None],
    ) -> None:
        await self._require_thread().stream_units(fn, broadcast, clients, group_size, consume)

    def _require_thread(self) -> LocalContext:
        if self._thread is None:
            raise RuntimeError("TFFContext is not entered: use `async with TFFContext():`")
        return self._thread

    def _start_runtime(self) -> tff.framework.SyncContext:
        """A new TFF runtime, made the default TFF context of the calling thread."""
        runtime = tff.backends.native.create_sync_local_cpp_execution_context(
            default_num_clients=self.default_num_clients,
            max_concurrent_computation_calls=self.max_concurrent_computation_calls,
        )
        tff.framework.set_default_context(runtime)
        return runtime


def _service_manager(runtime: tff.framework.SyncContext | None) -> Any:
    """The object of TFF 0.87's local executor factory that owns the worker process."""
    if runtime is None:
        return None
    stack_fn = getattr(runtime.executor_factory, "_executor_stack_fn", None)
    if stack_fn is None:
        return None
    return inspect.getclosurevars(stack_fn).nonlocals.get("service_manager")


def _service_manager_process(runtime: tff.framework.SyncContext | None) -> Any:
    manager = _service_manager(runtime)
    process = getattr(manager, "_process", None)
    return process if isinstance(process, subprocess.Popen) else None


def _stop_runtime(runtime: tff.framework.SyncContext | tff.framework.AsyncContext) -> None:
    """Stop what a TFF runtime made by ``create_*_local_cpp_execution_context`` started.

    TFF 0.87 stops these only when the objects are garbage collected; the executors, the
    worker process and TFF's event-loop thread are reached through TFF's private
    attributes, which that pinned release will not change. Each step runs even if an
    earlier one failed.
    """
    try:
        executors = getattr(runtime.executor_factory, "_executors", None)
        if executors is not None:
            for executor in list(executors.values()):
                executor.close()
            executors.clear()
    finally:
        try:
            _stop_worker_process(runtime)
        finally:
            _stop_event_loop_thread(runtime)


def _stop_worker_process(runtime: Any) -> None:
    manager = _service_manager(runtime)
    process = _service_manager_process(runtime)
    if process is None:
        return
    if process.poll() is None:
        process.send_signal(signal.SIGINT)
        try:
            process.wait(_STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            logger.warning("TFF's worker process %d ignored SIGINT; killing it", process.pid)
            process.kill()
            process.wait()
    # Its finalizer would otherwise signal the (reaped, maybe reused) pid again.
    manager._process = None
    manager._stub = None


def _stop_event_loop_thread(runtime: Any) -> None:
    runner = getattr(runtime, "_async_runner", None)
    loop = getattr(runner, "_event_loop", None)
    thread = getattr(runner, "_thread", None)
    if loop is None or thread is None or loop.is_closed():
        return
    loop.call_soon_threadsafe(loop.stop)
    thread.join()
    loop.close()
    runner._finalizer = _stopped_already


def _stopped_already(loop: Any, thread: Any) -> None:
    """The finalizer of a TFF event-loop runner that :func:`_stop_runtime` stopped."""
