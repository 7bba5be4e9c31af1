"""The service's runs: started, listed, cancelled, and resumed after a restart.

Run ``<id>`` trains in ``runs/<id>`` under the data directory. Beside ``runs/``:
``runs.json`` (the runs' ids, configurations, statuses and times, rewritten atomically)
and ``service.lock``, flocked while the registry lives: no second service resumes the
runs twice. Past ``max_running`` active runs a new one is refused (429), not queued. The
registry's file work has a worker thread of its own: no request waits behind TensorFlow.
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
from samples.service.live_metrics import LiveMetrics, read_points
from samples.service.training import RunConfig, train

__all__ = ["DataDirectoryError", "Run", "RunRegistry"]

logger = logging.getLogger(__name__)

INDEX, LOCK_FILE, RUNS = "runs.json", "service.lock", "runs"
RUNNING, FINISHED, CANCELLED, FAILED = "running", "finished", "cancelled", "failed"
RETRY_AFTER_S = 30  # runs last minutes, not seconds


class DataDirectoryError(RuntimeError):
    """The data directory cannot be served: another service holds it, or its ``runs.json``
    is damaged."""


class Run(BaseModel):
    """A run: what ``runs.json`` records of it, and (not recorded) its metrics, models and
    training task, and the (time, round) it began training at in this process, for the
    estimate of the rest."""

    model_config = ConfigDict(arbitrary_types_allowed=True)

    id: str = Field(pattern=r"^[0-9a-f]{12}$")  # the service's own: a name under runs/
    config: RunConfig
    status: str = RUNNING
    error: str | None = None
    started: float | None = None
    ended: float | None = None
    metrics: LiveMetrics = Field(default_factory=LiveMetrics, exclude=True)
    evaluation: LiveMetrics = Field(default_factory=LiveMetrics, exclude=True)  # held out
    models: list[str] = Field(default=[], exclude=True)
    cancel_scope: anyio.CancelScope | None = Field(default=None, exclude=True)
    done: anyio.Event = Field(default_factory=anyio.Event, exclude=True)
    pace: tuple[float, int] | None = Field(default=None, exclude=True)

    def summary(self) -> dict[str, Any]:
        """What ``GET /runs`` shows of the run."""
        latest, held_out = self.metrics.latest(), self.evaluation.latest()
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
            "error": self.error,
            "config": self.config.model_dump(),
            "elapsed_s": None if self.started is None else (self.ended or now) - self.started,
            "eta_s": eta,
            "models": [f"/runs/{self.id}/models/{name}" for name in self.models],
        }


_INDEX = TypeAdapter(list[Run])


class RunRegistry:
    """The runs of one data directory, its lock held from now on (``DataDirectoryError``
    if it cannot be served) until :meth:`open` is left; trained ``max_running`` at once."""

    def __init__(self, data_dir: Path, max_running: int = 4) -> None:
        self.data_dir, self.max_running = data_dir, max_running
        self.failure: str | None = None  # why the last write of runs.json failed
        self._lock = _lock(data_dir)
        try:  # oldest first
            self.runs = {run.id: self._load(run) for run in read_index(data_dir)}
        except BaseException:
            os.close(self._lock)
            raise
        self._slots = anyio.CapacityLimiter(max_running)
        self._io = anyio.CapacityLimiter(1)  # the registry's file work
        self._index_lock = anyio.Lock()
        self._task_group: TaskGroup | None = None

    def _load(self, run: Run) -> Run:
        directory = self.path(run)
        run.metrics = LiveMetrics(read_points(directory / "metrics.csv"))
        run.evaluation = LiveMetrics(read_points(directory / "evaluation.csv"))
        run.models = _models(directory)
        return run

    async def _thread(self, function: Callable[..., Any], *arguments: Any) -> Any:
        return await anyio.to_thread.run_sync(function, *arguments, limiter=self._io)

    def path(self, run: Run) -> Path:
        """The directory ``run`` trains in."""
        return self.data_dir / RUNS / run.id

    def get(self, run_id: str) -> Run:
        """The run with id ``run_id``; 404 if there is none."""
        if run_id not in self.runs:
            raise HTTPException(404, f"no run has the id {run_id!r}")
        return self.runs[run_id]

    @contextlib.asynccontextmanager
    async def open(self) -> AsyncIterator[None]:
        """Resume the runs that had not ended; on leaving, interrupt them (they resume at
        the next start) and release the data directory's lock."""
        try:
            async with anyio.create_task_group() as self._task_group:
                for run in self.runs.values():
                    if run.status == RUNNING:
                        logger.info("resuming run %s in %s", run.id, self.path(run))
                        self._task_group.start_soon(self._supervise, run)
                    else:
                        await run.metrics.aclose()
                        await run.evaluation.aclose()
                        run.done.set()
                yield
                self._task_group.cancel_scope.cancel()
        finally:
            os.close(self._lock)  # closing the only descriptor releases the flock

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
        422, 429 (``max_running``) or 503 (``runs.json`` cannot be written) if refused."""
        try:
            config = RunConfig.model_validate(config)
        except ValidationError as error:
            raise HTTPException(422, one_line(error)) from None
        self._admit()
        run = Run(id=secrets.token_hex(6), config=config, started=time.time())
        self.runs[run.id] = run
        try:
            await self._write_index()
        except HTTPException:
            del self.runs[run.id]
            raise
        self._task_group.start_soon(self._supervise, run)
        logger.info("started run %s in %s", run.id, self.path(run))
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
                    run.pace = (time.time(), (run.metrics.latest() or {"round": 0})["round"])
                    await train(run.config, self.path(run), run.metrics, run.evaluation)
            except Exception as error:
                logger.exception("run %s failed", run.id)
                await self._end(run, FAILED, f"{type(error).__name__}: {error}")
            else:
                await self._end(run, FINISHED, None)
            finally:
                await run.metrics.aclose()
                await run.evaluation.aclose()
                run.done.set()
            # A cancelled run does not get here: its status stays as the canceller left
            # it, "cancelled" after a DELETE, still "running" after a shutdown.
            with contextlib.suppress(HTTPException):  # kept in self.failure: /health tells
                await self._write_index()

    async def _end(self, run: Run, status: str, error: str | None) -> None:
        # Its end time and models before its status: who sees it ended sees them.
        run.ended = time.time()
        run.models = await self._thread(_models, self.path(run))
        run.status, run.error = status, error

    async def _write_index(self) -> None:
        """Rewrite ``runs.json``; 503 (and ``failure`` set until a write succeeds) if it
        cannot."""
        async with self._index_lock:
            records = _INDEX.dump_json(list(self.runs.values()), indent=2)
            try:
                with anyio.CancelScope(shield=True):  # a shutdown must not tear the index
                    await self._thread(write_atomically, self.data_dir / INDEX, records)
            except OSError as error:
                self.failure = f"writing {INDEX}: {type(error).__name__}: {error}"
                logger.error("the service cannot record its runs: %s", self.failure)
                message = f"the service cannot record its runs ({self.failure})"
                raise HTTPException(503, message) from None
            self.failure = None


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
        raise DataDirectoryError(
            f"{data_dir} is in use by another service (it holds {data_dir / LOCK_FILE}): "
            "stop that one, or pick another --data-dir"
        ) from None
    return descriptor


def read_index(data_dir: Path) -> list[Run]:
    """The runs ``runs.json`` in ``data_dir`` records; ``DataDirectoryError`` if it is not that."""
    path = data_dir / INDEX
    try:
        return _INDEX.validate_json(path.read_bytes())
    except FileNotFoundError:
        return []
    except ValidationError as error:
        raise DataDirectoryError(
            f"{path} is damaged ({one_line(error)}): restore it from a backup, or move it "
            f"aside to start with no runs recorded (the runs' directories stay in {RUNS}/)"
        ) from None


def _models(directory: Path) -> list[str]:
    """The names of the models a run saved in ``directory``."""
    return sorted(path.name for path in directory.glob("models/*.model"))
