"""The service's training runs: started, listed, cancelled, and resumed after a restart.

Every run trains federated averaging on the handwritten digits with ``train_model`` in a
directory of its own under ``runs/`` in the data directory: ``state/`` (checkpoints) and
``metrics.csv``. The service's own files stay beside ``runs/``: ``runs.json`` (each
run's id, configuration, directory relative to the data directory, and status,
rewritten atomically on every change) and ``service.lock``, locked while the registry
is open so that a second service cannot take the directory. On a start the registry
resumes every run whose status is still ``running``, from its last checkpoint, wherever
``runs.json`` says it lives (runs started before ``runs/`` existed stay where they are).
"""

from __future__ import annotations

import csv
import dataclasses
import functools
import logging
import os
import secrets
from pathlib import Path
from typing import Any

import anyio
import anyio.to_thread
import orjson
from anyio.abc import TaskGroup, TaskStatus

from samples.service.admission import Admission
from samples.service.config import INDEX, RECORDED, RunConfig, confine
from samples.service.live_metrics import LiveMetricsReleaseManager, Point, from_rows
from samples.service.lock import DataDirectoryLock
from samples.service.training import load_training, train

__all__ = [
    "RUNS",
    "DamagedIndexError",
    "RegistryFailedError",
    "Run",
    "RunConflictError",
    "RunNotFoundError",
    "RunRegistry",
    "read_index",
]

logger = logging.getLogger(__name__)

RUNS = "runs"
"""The directory, in the data directory, that new runs' directories are relative to."""
RUNNING, FINISHED, CANCELLED, FAILED = "running", "finished", "cancelled", "failed"


class DamagedIndexError(ValueError):
    """``runs.json`` is not the record of runs the service writes: the service cannot start."""

    def __init__(self, path: Path, reason: str) -> None:
        super().__init__(
            f"{path} is damaged ({reason}): restore it from a backup, or move it aside to "
            f"start with no runs recorded (the runs' directories stay under {RUNS}/)"
        )
        self.path = path


class RunNotFoundError(LookupError):
    """No run has the id asked for."""


class RunConflictError(Exception):
    """The request conflicts with a run's state or directory."""


class RegistryFailedError(RunConflictError):
    """The registry failed (it could not write ``runs.json``): it starts and cancels nothing."""


@dataclasses.dataclass(eq=False)
class Run:
    """One training run: its configuration, where it lives, and how far it got."""

    id: str
    config: RunConfig
    directory: Path
    status: str
    error: str | None = None
    live: LiveMetricsReleaseManager = dataclasses.field(default_factory=LiveMetricsReleaseManager)
    cancel_scope: anyio.CancelScope | None = None
    ended: anyio.Event = dataclasses.field(default_factory=anyio.Event)

    def summary(self, data_dir: Path) -> dict[str, Any]:
        """What ``GET /runs`` shows of the run."""
        latest = self.live.latest
        return {
            "id": self.id,
            "status": self.status,
            "round": latest["round"] if latest else 0,
            "rounds": self.config.rounds,
            "metrics": latest["metrics"] if latest else {},
            # Relative to runs/ as clients name it; "../x" for a run of the old layout.
            "directory": os.path.relpath(self.directory, data_dir.resolve() / RUNS),
            "error": self.error,
        }

    def record(self, data_dir: Path) -> dict[str, Any]:
        """The run as ``runs.json`` keeps it."""
        return {
            "id": self.id,
            "config": self.config.model_dump(),
            "directory": str(self.directory.relative_to(data_dir.resolve())),
            "status": self.status,
            "error": self.error,
        }


class RunRegistry:
    """The runs of one data directory; their training tasks belong to ``open``'s task group.

    ``admission`` caps the active runs (``create`` raises ``TooManyRunsError`` at the
    cap) and gives the registry's file work and model builds their own threads.
    """

    def __init__(self, data_dir: Path, admission: Admission | None = None) -> None:
        self.data_dir = data_dir
        self.admission = admission or Admission()
        self._runs: dict[str, Run] = {}
        self._task_group: TaskGroup | None = None
        self._index_lock = anyio.Lock()
        self._failure: str | None = None

    @property
    def failure(self) -> str | None:
        """Why the registry failed (a write of ``runs.json``, or its own code), if it did."""
        return self._failure

    @property
    def runs(self) -> list[Run]:
        """Every run, oldest first."""
        return list(self._runs.values())

    def get(self, run_id: str) -> Run:
        """The run with id ``run_id``; ``RunNotFoundError`` if there is none."""
        try:
            return self._runs[run_id]
        except KeyError:
            raise RunNotFoundError(f"no run has the id {run_id!r}") from None

    async def open(self, task_group: TaskGroup) -> None:
        """Lock the data directory, load ``runs.json`` and resume the runs that had not ended.

        The runs train in ``task_group``; cancelling it stops them, then unlocks.

        Raises:
            DataDirectoryLockedError: another service holds the data directory.
            DamagedIndexError: ``runs.json`` cannot be read as a record of runs.
        """
        await anyio.to_thread.run_sync(functools.partial(os.makedirs, self.data_dir, exist_ok=True))
        lock = await anyio.to_thread.run_sync(DataDirectoryLock.acquire, self.data_dir)
        try:
            await anyio.to_thread.run_sync(load_training)
            records = await self._read_index()
        except BaseException:
            lock.release()
            raise
        await task_group.start(self._hold, lock)
        for record in records:
            directory = _recorded_directory(self.data_dir, record["directory"])
            run = Run(
                id=record["id"],
                config=RunConfig.model_validate(record["config"], context={RECORDED: True}),
                directory=directory,
                status=record["status"],
                error=record["error"],
                live=LiveMetricsReleaseManager(await _history(directory)),
            )
            self._runs[run.id] = run
            if run.status == RUNNING:
                logger.info("resuming run %s in %s", run.id, directory)
                self._start(run)
            else:
                await run.live.aclose()
                run.ended.set()

    async def _read_index(self) -> list[dict[str, Any]]:
        return await anyio.to_thread.run_sync(
            read_index, self.data_dir, limiter=self.admission.registry_io
        )

    async def _hold(
        self, lock: DataDirectoryLock, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED
    ) -> None:
        """Run the runs in a task group of their own; once they stopped, unlock."""
        try:
            async with anyio.create_task_group() as runs:
                self._task_group = runs
                task_status.started()
                await anyio.sleep_forever()
        finally:
            self._task_group = None
            with anyio.CancelScope(shield=True):
                await anyio.to_thread.run_sync(lock.release)

    def _start(self, run: Run) -> None:
        assert self._task_group is not None
        self._task_group.start_soon(self._supervise, run)

    async def _supervise(self, run: Run) -> None:
        """Train ``run``; a failure of the registry's own code is kept, not raised, so that
        it cannot end the other runs, and ``/health`` reports it."""
        try:
            await self._train(run)
        except RegistryFailedError:
            pass  # kept and logged where the write failed
        except Exception as error:
            self._fail(f"run {run.id}: {type(error).__name__}: {error}")

    def _fail(self, failure: str) -> None:
        if self._failure is None:
            self._failure = failure
        logger.error("the run registry failed: %s", failure)

    def _check_writable(self) -> None:
        if self._failure is not None:
            raise RegistryFailedError(
                f"the service cannot record its runs ({self._failure}): restart it once "
                "that is fixed"
            )

    async def create(self, config: RunConfig) -> Run:
        """A new run of ``config``, started in the background.

        Raises:
            ValueError: ``config.directory`` is outside ``runs/``, or too long for the system.
            RunConflictError: another run uses the directory, or it exists already.
            RegistryFailedError: the registry failed; it starts nothing.
            TooManyRunsError: ``admission.max_running`` runs are active.
        """
        if self._task_group is None:
            raise RuntimeError("the registry is not open")
        self._check_writable()
        self.admission.admit(self._active())  # refused early: no disk work for a 429
        run_id = secrets.token_hex(6)
        directory = await anyio.to_thread.run_sync(
            confine,
            self.data_dir / RUNS,
            config.directory or run_id,
            limiter=self.admission.registry_io,
        )
        for other in self._runs.values():
            if directory.is_relative_to(other.directory) or other.directory.is_relative_to(
                directory
            ):
                raise RunConflictError(
                    f"directory {config.directory!r} overlaps the directory of run {other.id}"
                )
        if await anyio.to_thread.run_sync(directory.exists, limiter=self.admission.registry_io):
            raise RunConflictError(f"directory {config.directory!r} exists already")
        # No await between the count and the insertion: concurrent requests see each other.
        self.admission.admit(self._active())
        run = Run(id=run_id, config=config, directory=directory, status=RUNNING)
        self._runs[run_id] = run
        try:
            await self._write_index()
        except RegistryFailedError:
            del self._runs[run_id]
            raise
        self._start(run)
        logger.info("started run %s in %s", run_id, directory)
        return run

    async def cancel(self, run_id: str) -> Run:
        """Cancel a running run and wait until it stopped; its checkpoints stay loadable.

        Raises:
            RunNotFoundError: no run has the id.
            RunConflictError: the run has ended already.
            RegistryFailedError: the registry failed; the run goes on.
        """
        run = self.get(run_id)
        if run.status != RUNNING:
            raise RunConflictError(f"run {run_id} is {run.status}, not running")
        run.status = CANCELLED
        try:
            await self._write_index()
        except RegistryFailedError:
            run.status = RUNNING
            raise
        if run.cancel_scope is not None:
            run.cancel_scope.cancel()
        await run.ended.wait()
        return run

    def _active(self) -> int:
        """The runs whose training has not ended: training, or stopping and still holding it."""
        return sum(not run.ended.is_set() for run in self._runs.values())

    async def _train(self, run: Run) -> None:
        with anyio.CancelScope() as scope:
            run.cancel_scope = scope
            try:
                async with self.admission.slots:
                    await train(
                        run.config, run.directory, run.live, build_limiter=self.admission.builds
                    )
            except Exception as error:
                logger.exception("run %s failed", run.id)
                run.status, run.error = FAILED, f"{type(error).__name__}: {error}"
            else:
                run.status = FINISHED
            finally:
                await run.live.aclose()
                run.ended.set()
            # A cancelled run does not get here: its status stays as the canceller left
            # it, "cancelled" after a DELETE, still "running" after a shutdown.
            await self._write_index()

    async def _write_index(self) -> None:
        """Rewrite ``runs.json``; ``RegistryFailedError`` (the registry failed) if it cannot."""
        async with self._index_lock:
            self._check_writable()
            records = [run.record(self.data_dir) for run in self._runs.values()]
            payload = orjson.dumps(records, option=orjson.OPT_INDENT_2)
            try:
                with anyio.CancelScope(shield=True):  # a shutdown must not tear the index
                    await anyio.to_thread.run_sync(
                        _replace, self.data_dir / INDEX, payload, limiter=self.admission.registry_io
                    )
            except OSError as error:
                self._fail(f"writing {INDEX}: {type(error).__name__}: {error}")
                self._check_writable()


_RECORD_KEYS = ("id", "config", "directory", "status", "error")


def read_index(data_dir: Path) -> list[dict[str, Any]]:
    """The runs ``runs.json`` in ``data_dir`` records (none without the file).

    Raises:
        DamagedIndexError: the file is not a list of run records.
    """
    path = data_dir / INDEX
    try:
        payload = path.read_bytes()
    except FileNotFoundError:
        return []
    try:
        records = orjson.loads(payload)
    except orjson.JSONDecodeError as error:
        raise DamagedIndexError(path, f"not JSON: {error}") from None
    if not isinstance(records, list):
        raise DamagedIndexError(path, f"a JSON {type(records).__name__}, not a list of runs")
    for number, record in enumerate(records):
        missing = [key for key in _RECORD_KEYS if not isinstance(record, dict) or key not in record]
        if missing:
            raise DamagedIndexError(path, f"run {number} lacks {', '.join(missing)}")
    return records


def _replace(path: Path, payload: bytes) -> None:
    # The service holds the data directory's lock and writes under the index lock, so
    # one temporary name is enough.
    temporary = path.with_name(f".{path.name}.tmp")
    with open(temporary, "wb") as file:
        file.write(payload)
        file.flush()
        os.fsync(file.fileno())
    os.replace(temporary, path)
    directory = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(directory)  # makes the rename itself durable
    finally:
        os.close(directory)


def _recorded_directory(data_dir: Path, directory: str) -> Path:
    """A run directory as ``runs.json`` records it (relative to the data directory)."""
    root = data_dir.resolve()
    resolved = (root / directory).resolve()
    if not resolved.is_relative_to(root):
        raise ValueError(f"{data_dir / INDEX} records a run directory outside it: {directory!r}")
    return resolved


async def _history(directory: Path) -> list[Point]:
    """The points of a run's ``metrics.csv`` (none if it has no such file yet)."""

    def read() -> list[Point]:
        try:
            with open(directory / "metrics.csv", newline="") as file:
                return from_rows(list(csv.DictReader(file)))
        except (FileNotFoundError, NotADirectoryError):
            return []

    return await anyio.to_thread.run_sync(read)
