"""The service's runs: started, listed, cancelled, and resumed after a restart.

Each run trains in its own directory under ``runs/`` in the data directory. Beside it:
``runs.json`` (the runs' ids, configurations, directories, statuses and times, rewritten
atomically) and ``service.lock``, flocked while the registry is open: no second service
resumes the runs twice. Past ``max_running`` active runs a new one is refused (429), not
queued. The registry's file work has a worker thread of its own: no request waits
behind TensorFlow.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import secrets
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import anyio
import anyio.to_thread
from anyio.abc import TaskGroup
from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError
from starlette.exceptions import HTTPException

from managers.files import write_atomically
from samples.service.live_metrics import EVALUATION, LiveMetricsReleaseManager, Point, read_points
from samples.service.training import RECORDED, RunConfig, train

__all__ = ["DamagedIndexError", "DataDirectoryLockedError", "Record", "Run", "RunRegistry"]

logger = logging.getLogger(__name__)

INDEX, LOCK_FILE, RUNS = "runs.json", "service.lock", "runs"
RUNNING, FINISHED, CANCELLED, FAILED = "running", "finished", "cancelled", "failed"
RETRY_AFTER_S = 30  # runs last minutes, not seconds
_RUN_FILES_BYTES = 128  # room kept, under the system's longest path, for a run's files


class DataDirectoryLockedError(RuntimeError):
    """Another service holds the data directory."""


class DamagedIndexError(ValueError):
    """``runs.json`` is not the record of runs the service writes: the service cannot start."""


class Record(BaseModel):
    """A run as ``runs.json`` keeps it (``directory`` relative to the data directory)."""

    id: str
    config: RunConfig
    directory: str
    status: str = RUNNING
    error: str | None = None
    started: float | None = None
    ended: float | None = None


_INDEX = TypeAdapter(list[Record])


class Run(Record):
    """A run as this process knows it: also its metrics, models and training task, and
    the (time, round) it began training at in this process, for the estimate of the rest."""

    model_config = ConfigDict(arbitrary_types_allowed=True)

    live: LiveMetricsReleaseManager = Field(default_factory=LiveMetricsReleaseManager)
    models: list[str] = []
    cancel_scope: anyio.CancelScope | None = None
    done: anyio.Event = Field(default_factory=anyio.Event)
    pace: tuple[float, int] | None = None

    def summary(self) -> dict[str, Any]:
        """What ``GET /runs`` shows of the run."""
        latest, held_out = self.live.latest(), self.live.latest(EVALUATION)
        round_num = latest["round"] if latest else 0
        now, (since, first) = time.time(), self.pace or (0, round_num)
        done = round_num - first if self.status == RUNNING else 0
        eta = (now - since) * (self.config.rounds - round_num) / done if done > 0 else None
        return {
            "id": self.id,
            "status": self.status,
            "round": round_num,
            "rounds": self.config.rounds,
            "metrics": latest["metrics"] if latest else {},
            "evaluation": held_out["metrics"] if held_out else {},
            "evaluated_round": held_out["round"] if held_out else None,
            "directory": os.path.relpath(self.directory, RUNS),  # "../x" for an old run
            "error": self.error,
            "config": self.config.model_dump(),
            "elapsed_s": None if self.started is None else (self.ended or now) - self.started,
            "eta_s": eta,
            "models": [f"/runs/{self.id}/models/{name}" for name in self.models],
        }


class RunRegistry:
    """The runs of one data directory, trained (``max_running`` at once) while open."""

    def __init__(self, data_dir: Path, max_running: int = 4) -> None:
        self.data_dir, self.root = data_dir, data_dir.resolve()
        self.max_running = max_running
        self.runs: dict[str, Run] = {}  # oldest first
        self.failure: str | None = None  # why runs.json can no longer be written
        self._slots = anyio.CapacityLimiter(max_running)
        self._io = anyio.CapacityLimiter(1)  # the registry's file work
        self._index_lock = anyio.Lock()
        self._task_group: TaskGroup | None = None

    async def _thread(self, function: Callable[..., Any], *arguments: Any) -> Any:
        return await anyio.to_thread.run_sync(function, *arguments, limiter=self._io)

    def path(self, run: Run) -> Path:
        return self.root / run.directory

    def get(self, run_id: str) -> Run:
        """The run with id ``run_id``; 404 if there is none."""
        if run_id not in self.runs:
            raise HTTPException(404, f"no run has the id {run_id!r}")
        return self.runs[run_id]

    @contextlib.asynccontextmanager
    async def open(self) -> AsyncIterator[None]:
        """Lock the data directory and resume the runs that had not ended; on leaving,
        interrupt them (they resume at the next open) and unlock."""
        lock = await self._thread(_lock, self.data_dir)
        try:
            records = await self._thread(read_index, self.data_dir)
            async with anyio.create_task_group() as self._task_group:
                for record in records:
                    *history, models = await self._thread(_history, self.root / record.directory)
                    run = Run(
                        **dict(record), live=LiveMetricsReleaseManager(*history), models=models
                    )
                    self.runs[run.id] = run
                    if run.status == RUNNING:
                        logger.info("resuming run %s in %s", run.id, self.path(run))
                        self._task_group.start_soon(self._supervise, run)
                    else:
                        await run.live.aclose()
                        run.done.set()
                yield
                self._task_group.cancel_scope.cancel()
        finally:
            os.close(lock)  # closing the only descriptor releases the flock

    def _check_writable(self) -> None:
        if self.failure is not None:
            message = f"the service cannot record its runs ({self.failure}): restart it once fixed"
            raise HTTPException(503, message)

    def _admit(self) -> None:
        if sum(not run.done.is_set() for run in self.runs.values()) >= self.max_running:
            raise HTTPException(
                429,
                f"the service already trains {self.max_running} runs, its most "
                "(--max-running); cancel one or retry later",
                {"Retry-After": str(RETRY_AFTER_S)},
            )

    async def create(self, config: Any) -> Run:
        """A new run of ``config`` (a ``RunConfig`` as JSON data), started in the background;
        422, 409 (its directory), 503 (``failure``) or 429 (``max_running``) if refused."""
        try:
            config = RunConfig.model_validate(config)
        except ValidationError as error:
            raise HTTPException(422, one_line(error)) from None
        self._check_writable()
        self._admit()  # refused early: no disk work for a 429
        run_id = secrets.token_hex(6)
        try:
            path = await self._thread(confine, self.root / RUNS, config.directory or run_id)
        except ValueError as error:
            raise HTTPException(422, f"directory: {error}") from None
        for other in self.runs.values():
            if path.is_relative_to(self.path(other)) or self.path(other).is_relative_to(path):
                message = f"directory {config.directory!r} overlaps the directory of run {other.id}"
                raise HTTPException(409, message)
        if await self._thread(path.exists):
            raise HTTPException(409, f"directory {config.directory!r} exists already")
        self._admit()  # no await from here to the insertion: concurrent requests see it
        directory = str(path.relative_to(self.root))
        run = Run(id=run_id, config=config, directory=directory, started=time.time())
        self.runs[run_id] = run
        try:
            await self._write_index()
        except HTTPException:
            del self.runs[run_id]
            raise
        self._task_group.start_soon(self._supervise, run)
        logger.info("started run %s in %s", run_id, path)
        return run

    async def cancel(self, run_id: str) -> Run:
        """Cancel a running run and wait until it stopped; its checkpoints stay loadable."""
        run = self.get(run_id)
        if run.status != RUNNING:
            raise HTTPException(409, f"run {run_id} is {run.status}, not running")
        run.status, run.ended = CANCELLED, time.time()
        try:
            await self._write_index()
        except HTTPException:
            run.status, run.ended = RUNNING, None
            raise
        if run.cancel_scope is not None:
            run.cancel_scope.cancel()
        await run.done.wait()
        return run

    async def _supervise(self, run: Run) -> None:
        with anyio.CancelScope() as run.cancel_scope:
            try:
                async with self._slots:
                    run.pace = (time.time(), (run.live.latest() or {"round": 0})["round"])
                    await train(run.config, self.path(run), run.live)
            except Exception as error:
                logger.exception("run %s failed", run.id)
                await self._end(run, FAILED, f"{type(error).__name__}: {error}")
            else:
                await self._end(run, FINISHED, None)
            finally:
                await run.live.aclose()
                run.done.set()
            # A cancelled run does not get here: its status stays as the canceller left
            # it, "cancelled" after a DELETE, still "running" after a shutdown.
            with contextlib.suppress(HTTPException):  # kept in self.failure: /health tells
                await self._write_index()

    async def _end(self, run: Run, status: str, error: str | None) -> None:
        # Its end time and models before its status: who sees it ended sees them.
        run.ended = time.time()
        run.models = (await self._thread(_history, self.path(run)))[-1]
        run.status, run.error = status, error

    async def _write_index(self) -> None:
        """Rewrite ``runs.json``; 503 (and ``failure`` set) if it cannot."""
        async with self._index_lock:
            self._check_writable()
            records = _INDEX.dump_json(list(self.runs.values()), indent=2)
            try:
                with anyio.CancelScope(shield=True):  # a shutdown must not tear the index
                    await self._thread(write_atomically, self.data_dir / INDEX, records)
            except OSError as error:
                self.failure = f"writing {INDEX}: {type(error).__name__}: {error}"
                logger.error("the run registry failed: %s", self.failure)
                self._check_writable()


def one_line(error: ValidationError) -> str:
    """Pydantic's errors as ``field: message`` pairs on one line."""
    return "; ".join(
        ": ".join([".".join(map(str, detail["loc"])), detail["msg"]][not detail["loc"] :])
        for detail in error.errors(include_url=False)
    )


def _lock(data_dir: Path) -> int:
    """A descriptor of ``service.lock`` holding its exclusive flock."""
    data_dir.mkdir(parents=True, exist_ok=True)
    descriptor = os.open(data_dir / LOCK_FILE, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(descriptor)
        raise DataDirectoryLockedError(
            f"{data_dir} is in use by another service (it holds {data_dir / LOCK_FILE}): "
            "stop that one, or pick another --data-dir"
        ) from None
    return descriptor


def read_index(data_dir: Path) -> list[Record]:
    """The runs ``runs.json`` in ``data_dir`` records; ``DamagedIndexError`` if it is not that."""
    path = data_dir / INDEX
    try:
        return _INDEX.validate_json(path.read_bytes(), context={RECORDED: True})
    except FileNotFoundError:
        return []
    except ValidationError as error:
        raise DamagedIndexError(
            f"{path} is damaged ({one_line(error)}): restore it from a backup, or move it "
            f"aside to start with no runs recorded (the runs' directories stay in {RUNS}/)"
        ) from None


def check_data_dir(data_dir: Path) -> None:
    """Raise now what opening a registry on ``data_dir`` would: a lock another service
    holds, a damaged ``runs.json``. Creates nothing."""
    if (data_dir / LOCK_FILE).exists():
        os.close(_lock(data_dir))
    read_index(data_dir)


def confine(runs_dir: Path, directory: str) -> Path:
    """``directory`` resolved under ``runs_dir``; ``ValueError`` if it lands elsewhere (a
    symbolic link out) or makes paths too long for the system."""
    resolved = (runs_dir / directory).resolve()
    if not resolved.is_relative_to(runs_dir):
        raise ValueError(f"directory must be inside the runs directory, got {directory!r}")
    existing = next(parent for parent in resolved.parents if parent.exists())
    length = len(os.fsencode(resolved)) + _RUN_FILES_BYTES
    if length > (path_max := os.pathconf(existing, "PC_PATH_MAX")):
        raise ValueError(
            f"directory makes paths too long ({length} bytes with the run's files, over "
            f"{path_max}), got {directory!r}"
        )
    return resolved


def _history(directory: Path) -> tuple[list[Point], list[Point], list[str]]:
    """A run's training and held-out metrics, and its models' names, from its directory."""
    models = sorted(path.name for path in directory.glob("models/*.model"))
    return read_points(directory / "metrics.csv"), read_points(directory / "evaluation.csv"), models
