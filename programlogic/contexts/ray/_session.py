"""Ray in this process: the connection, the thread Ray is called on, and the one seam
through which every call of Ray and every wait for its results passes (and has its
errors translated by :mod:`programlogic.contexts.ray._errors`)."""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeVar

import anyio

from programlogic.contexts._threads import WorkerThreads
from programlogic.contexts.ray._bridge import await_future
from programlogic.contexts.ray._errors import translate
from programlogic.exceptions import ClientError, ClusterConnectionError, ProgramLogicError

__all__ = ["RaySession", "import_ray"]

logger = logging.getLogger("programlogic.contexts.ray")

T = TypeVar("T")


def import_ray() -> Any:
    """The ``ray`` module; an ImportError naming the extra to install without it."""
    try:
        import ray
    except ImportError as error:  # pragma: no cover - depends on the environment
        raise ImportError("RayContext needs Ray: pip install 'programlogic[ray]'") from error
    return ray


class RaySession:
    """A connection to a Ray cluster, opened by :meth:`open` and ended by :meth:`close`.

    Every call of Ray runs through :meth:`call` on one thread of the session's own (Ray's
    processes die with the thread that started them, and Ray's calls block), and every
    result of Ray is awaited through :meth:`wait`; both raise our exceptions only.
    """

    def __init__(
        self, address: str | None, init_options: Mapping[str, Any], health_check_interval: float
    ) -> None:
        self.address = address
        self.init_options = dict(init_options)
        self.health_check_interval = health_check_interval
        self.ray: Any = None
        self.owns_connection = False
        self.lost = False
        self._thread: WorkerThreads | None = None
        self._gcs_address: tuple[str, int] | None = None

    @property
    def is_open(self) -> bool:
        """Whether the session is open (between :meth:`open` and :meth:`close`)."""
        return self._thread is not None

    async def open(self) -> None:
        """Connect (or start a local cluster when there is no address)."""
        self.ray = import_ray()
        self._thread = WorkerThreads(1, "programlogic-ray", daemon=False)
        await self.call(f"connect to the Ray cluster at {self.address!r}", self._connect)

    def _connect(self, ray: Any) -> None:
        if ray.is_initialized():
            logger.info("RayContext: using the Ray connection this process already has")
        else:
            options: dict[str, Any] = {
                "include_dashboard": False,
                "logging_level": logging.WARNING,
                **self.init_options,
            }
            # "local": a new cluster even if RAY_ADDRESS names a running one.
            ray.init(address=self.address or "local", **options)
            self.owns_connection = True
        host, _, port = ray.get_runtime_context().gcs_address.rpartition(":")
        self._gcs_address = (host, int(port))

    async def close(self, last: Callable[[Any], None]) -> None:
        """Run ``last(ray)`` unless Ray is gone, shut down what the session started, end it."""
        thread, self._thread = self._thread, None
        owns, self.owns_connection = self.owns_connection, False
        self.lost = False
        if thread is None:
            return

        def shut_down(ray: Any) -> None:
            if not ray.is_initialized():
                return
            last(ray)
            if owns:
                ray.shutdown()

        try:
            await thread.run(self._translated, "shut down Ray", shut_down, ())
        finally:
            await thread.stop()

    def _translated(self, what: str, fn: Callable[..., T], args: tuple[Any, ...]) -> T:
        try:
            return fn(self.ray, *args)
        except Exception as error:
            translated = translate(self.ray, error, what)
            if translated is error:
                raise
            raise translated from translated.__cause__

    async def call(self, what: str, fn: Callable[..., T], /, *args: Any) -> T:
        """``fn(ray, *args)`` on the session's thread; Ray's errors become ours.

        ``what`` says what the call does, for the error message. After an error of Ray,
        a cluster that no longer answers raises :class:`ClusterConnectionError`.
        """
        if self._thread is None:
            raise RuntimeError("RayContext is not entered: use `async with RayContext():`")
        try:
            return await self._thread.run(self._translated, what, fn, args)
        except ProgramLogicError as error:
            if not isinstance(error, ClusterConnectionError | ClientError):
                await self.check_connection()
            raise

    async def wait(self, ref: Any, what: str, client_ids: Sequence[str] = ()) -> Any:
        """The value of the Ray object reference ``ref``; Ray's errors become ours."""
        try:
            return await await_future(ref.future())
        except Exception as error:
            translated = translate(self.ray, error, what, client_ids)
            if translated is error:
                raise
            raise translated from translated.__cause__

    async def check_connection(self) -> None:
        """Raise :class:`ClusterConnectionError` unless the cluster's control service answers."""
        if self._gcs_address is None:
            return
        host, port = self._gcs_address
        try:
            with anyio.fail_after(max(5.0, self.health_check_interval)):
                stream = await anyio.connect_tcp(host, port)
            await stream.aclose()
        except (OSError, TimeoutError) as error:
            self.lost = True
            raise ClusterConnectionError(
                f"lost the connection to the Ray cluster (its control service at "
                f"{host}:{port} does not answer: {error or type(error).__name__}); rerun the "
                "program to resume from its last checkpoint"
            ) from error
