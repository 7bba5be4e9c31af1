"""The service's training runs: started, listed, cancelled, and resumed after a restart.

Every run trains in a directory of its own under ``runs/`` in the data directory (see
:mod:`samples.service.training`). The service's own files stay beside ``runs/``:
``runs.json`` (each run's id, configuration, directory relative to the data directory,
status and times, rewritten atomically on every change) and ``service.lock``, locked
(``fcntl.flock``, released by the system however the process ends) while the registry
is open, so that a second service cannot take the directory and resume its runs twice.
On a start the registry resumes every run whose status is still ``running``, from its
last checkpoint, wherever ``runs.json`` says it lives (runs started before ``runs/``
existed stay where they are).

Admission: a run holds a TensorFlow model and a thread, so past ``max_running`` active
runs a new one is refused (429, with ``Retry-After``), never queued; runs
resumed at a start are all admitted, and beyond the cap they wait for a training slot.
The registry's own file work and model builds each have a thread of their own, apart
from anyio's default ones that checkpoints share: a request never waits behind a build.
"""

from __future__ import annotations

import csv
import dataclasses
import fcntl
import functools
import logging
import os
import secrets
import time
from pathlib import Path
from typing import Any

import anyio
import anyio.to_thread
import orjson
from anyio.abc import TaskGroup, TaskStatus

from samples.service.live_metrics import EVALUATION, LiveMetricsReleaseManager, from_rows
from samples.service.training import RECORDED, RunConfig, load_training, train

__all__ = [
    "DamagedIndexError",
    "DataDirectoryLockedError",
    "Refused",
    "Run",
    "RunRegistry",
    "check_unlocked",
    "read_index",
]

logger = logging.getLogger(__name__)

INDEX, LOCK_FILE, RUNS = "runs.json", "service.lock", "runs"
RUNNING, FINISHED, CANCELLED, FAILED = "running", "finished", "cancelled", "failed"
RETRY_AFTER_S = 30
"""The ``Retry-After`` of a refused run, in seconds: runs last minutes, not seconds."""
_RUN_FILES_BYTES = 128  # room kept, under the system's longest path, for a run's files
_RECORD_KEYS = ("id", "config", "directory", "status", "error")


class DataDirectoryLockedError(RuntimeError):
    """Another service holds the data directory."""

    def __init__(self, data_dir: Path) -> None:
        super().__init__(
            f"{data_dir} is in use by another service (it holds {data_dir / LOCK_FILE}): "
            "stop that one, or pick another --data-dir"
        )


class DamagedIndexError(ValueError):
    """``runs.json`` is not the record of runs the service writes: the service cannot start."""

    def __init__(self, path: Path, reason: str) -> None:
        super().__init__(
            f"{path} is damaged ({reason}): restore it from a backup, or move it aside to "
            f"start with no runs recorded (the runs' directories stay under {RUNS}/)"
        )


class Refused(Exception):
    """A request the registry refuses; ``status`` is the HTTP status that answers it.

    404: no run has the id; 409: the run or its directory conflicts; 422: the directory
    is outside ``runs/`` or too long; 429 (``headers`` hold ``Retry-After``): as many
    runs train as may; 503: the registry failed (it could not write ``runs.json``),
    and starts and cancels nothing.
    """

    def __init__(self, status: int, message: str, headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status, self.headers = status, headers or {}


@dataclasses.dataclass(eq=False)
class Run:
    """One training run: its configuration, where it lives, and how far it got.

    ``started`` and ``ended`` are Unix times (None for runs recorded without them);
    ``pace`` is the (time, round) at which this process first showed the running run: the
    estimate of the rest assumes the pace since then.
    """

    id: str
    config: RunConfig
    directory: Path
    status: str
    error: str | None = None
    started: float | None = None
    ended: float | None = None
    live: LiveMetricsReleaseManager = dataclasses.field(default_factory=LiveMetricsReleaseManager)
    models: list[str] = dataclasses.field(default_factory=list)
    cancel_scope: anyio.CancelScope | None = None
    done: anyio.Event = dataclasses.field(default_factory=anyio.Event)
    pace: tuple[float, int] | None = None

    def summary(self, data_dir: Path) -> dict[str, Any]:
        """What ``GET /runs`` shows of the run: also its settings, held-out metrics, elapsed
        seconds, estimated seconds left (None until this process saw a round) and models."""
        latest, held_out = self.live.latest(), self.live.latest(EVALUATION)
        round_num = latest["round"] if latest else 0
        now = time.time()
        if self.status != RUNNING:
            self.pace = None
        elif self.pace is None:
            self.pace = (now, round_num)
        since, first = self.pace or (now, round_num)
        done = round_num - first
        return {
            "id": self.id,
            "status": self.status,
            "round": round_num,
            "rounds": self.config.rounds,
            "metrics": latest["metrics"] if latest else {},
            "evaluation": held_out["metrics"] if held_out else {},
            "evaluated_round": held_out["round"] if held_out else None,
            # Relative to runs/ as clients name it; "../x" for a run of the old layout.
            "directory": os.path.relpath(self.directory, data_dir.resolve() / RUNS),
            "error": self.error,
            "config": self.config.model_dump(),
            "elapsed_s": None if self.started is None else (self.ended or now) - self.started,
            "eta_s": (now - since) * (self.config.rounds - round_num) / done if done > 0 else None,
            "models": [f"/runs/{self.id}/models/{name}" for name in self.models],
        }

    def record(self, data_dir: Path) -> dict[str, Any]:
        """The run as ``runs.json`` keeps it."""
        return {
            "id": self.id,
            "config": self.config.model_dump(),
            "directory": str(self.directory.relative_to(data_dir.resolve())),
            "status": self.status,
            "error": self.error,
            "started": self.started,
            "ended": self.ended,
        }


class RunRegistry:
    """The runs of one data directory; their training tasks belong to ``open``'s task group.

    At most ``max_running`` runs train at once (``create`` refuses more with 429).
    """

    def __init__(self, data_dir: Path, max_running: int = 4) -> None:
        if max_running < 1:
            raise ValueError(f"max_running must be at least 1, got {max_running}")
        self.data_dir = data_dir
        self.max_running = max_running
        self.failure: str | None = None
        """Why the registry failed (a write of ``runs.json``, or its own code), if it did."""
        self._slots = anyio.CapacityLimiter(max_running)
        self._io = anyio.CapacityLimiter(1)  # the registry's file work
        self._builds = anyio.CapacityLimiter(1)  # builds take an exclusive graph lock anyway
        self._runs: dict[str, Run] = {}
        self._task_group: TaskGroup | None = None
        self._index_lock = anyio.Lock()

    @property
    def runs(self) -> list[Run]:
        """Every run, oldest first."""
        return list(self._runs.values())

    def get(self, run_id: str) -> Run:
        """The run with id ``run_id``; refused with 404 if there is none."""
        try:
            return self._runs[run_id]
        except KeyError:
            raise Refused(404, f"no run has the id {run_id!r}") from None

    async def _thread(self, function: Any, *arguments: Any) -> Any:
        return await anyio.to_thread.run_sync(function, *arguments, limiter=self._io)

    async def open(self, task_group: TaskGroup) -> None:
        """Lock the data directory, load ``runs.json`` and resume the runs that had not ended.

        The runs train in ``task_group``; cancelling it stops them, then unlocks.

        Raises:
            DataDirectoryLockedError: another service holds the data directory.
            DamagedIndexError: ``runs.json`` cannot be read as a record of runs.
        """
        await self._thread(functools.partial(os.makedirs, self.data_dir, exist_ok=True))
        lock = await self._thread(_lock, self.data_dir)
        try:
            await anyio.to_thread.run_sync(load_training)
            records = await self._thread(read_index, self.data_dir)
        except BaseException:
            os.close(lock)
            raise
        await task_group.start(self._hold, lock)
        for record in records:
            directory = (self.data_dir.resolve() / record["directory"]).resolve()
            if not directory.is_relative_to(self.data_dir.resolve()):
                raise DamagedIndexError(self.data_dir / INDEX, f"a run outside it: {directory}")
            history, evaluations, models = await self._thread(_history, directory)
            run = Run(
                id=record["id"],
                config=RunConfig.model_validate(record["config"], context={RECORDED: True}),
                directory=directory,
                status=record["status"],
                error=record["error"],
                started=record.get("started"),
                ended=record.get("ended"),
                live=LiveMetricsReleaseManager(history, evaluations),
                models=models,
            )
            self._runs[run.id] = run
            if run.status == RUNNING:
                logger.info("resuming run %s in %s", run.id, directory)
                self._task_group.start_soon(self._supervise, run)
            else:
                await run.live.aclose()
                run.done.set()

    async def _hold(self, lock: int, *, task_status: TaskStatus[None]) -> None:
        """Run the runs in a task group of their own; once they stopped, unlock."""
        try:
            async with anyio.create_task_group() as runs:
                self._task_group = runs
                task_status.started()
                await anyio.sleep_forever()
        finally:
            self._task_group = None
            os.close(lock)  # closing the only descriptor releases the flock

    def _check_writable(self) -> None:
        if self.failure is not None:
            raise Refused(
                503,
                f"the service cannot record its runs ({self.failure}): restart it once "
                "that is fixed",
            )

    def _admit(self) -> None:
        if sum(not run.done.is_set() for run in self._runs.values()) >= self.max_running:
            raise Refused(
                429,
                f"the service already trains {self.max_running} runs, its most "
                "(--max-running); cancel one or retry later",
                {"Retry-After": str(RETRY_AFTER_S)},
            )

    async def create(self, config: RunConfig) -> Run:
        """A new run of ``config``, started in the background.

        Refused: 422 (``config.directory`` is outside ``runs/`` or too long for the
        system), 409 (another run uses the directory, or it exists already), 503 (the
        registry failed), 429 (``max_running`` runs are active).
        """
        if self._task_group is None:
            raise RuntimeError("the registry is not open")
        self._check_writable()
        self._admit()  # refused early: no disk work for a 429
        run_id = secrets.token_hex(6)
        try:
            directory = await self._thread(
                confine, self.data_dir / RUNS, config.directory or run_id
            )
        except ValueError as error:
            raise Refused(422, f"directory: {error}") from None
        for other in self._runs.values():
            if directory.is_relative_to(other.directory) or other.directory.is_relative_to(
                directory
            ):
                raise Refused(
                    409, f"directory {config.directory!r} overlaps the directory of run {other.id}"
                )
        if await self._thread(directory.exists):
            raise Refused(409, f"directory {config.directory!r} exists already")
        self._admit()  # no await from here to the insertion: concurrent requests see it
        run = Run(run_id, config, directory, RUNNING, started=time.time())
        self._runs[run_id] = run
        try:
            await self._write_index()
        except Refused:
            del self._runs[run_id]
            raise
        self._task_group.start_soon(self._supervise, run)
        logger.info("started run %s in %s", run_id, directory)
        return run

    async def cancel(self, run_id: str) -> Run:
        """Cancel a running run and wait until it stopped; its checkpoints stay loadable.

        Refused: 404 (no run has the id), 409 (the run has ended already), 503 (the
        registry failed; the run goes on).
        """
        run = self.get(run_id)
        if run.status != RUNNING:
            raise Refused(409, f"run {run_id} is {run.status}, not running")
        run.status, run.ended = CANCELLED, time.time()
        try:
            await self._write_index()
        except Refused:
            run.status, run.ended = RUNNING, None
            raise
        if run.cancel_scope is not None:
            run.cancel_scope.cancel()
        await run.done.wait()
        return run

    async def _supervise(self, run: Run) -> None:
        """Train ``run``; a failure of the registry's own code is kept, not raised, so that
        it cannot end the other runs, and ``/health`` reports it."""
        try:
            with anyio.CancelScope() as run.cancel_scope:
                try:
                    async with self._slots:
                        await train(run.config, run.directory, run.live, build_limiter=self._builds)
                except Exception as error:
                    logger.exception("run %s failed", run.id)
                    await self._end(run, FAILED, f"{type(error).__name__}: {error}")
                else:
                    await self._end(run, FINISHED, None)
                finally:
                    await run.live.aclose()
                    run.done.set()
                # A cancelled run does not get here: its status stays as the canceller
                # left it, "cancelled" after a DELETE, still "running" after a shutdown.
                await self._write_index()
        except Refused:
            pass  # kept and logged where the write failed
        except Exception as error:
            self._fail(f"run {run.id}: {type(error).__name__}: {error}")

    def _fail(self, failure: str) -> None:
        self.failure = self.failure or failure
        logger.error("the run registry failed: %s", failure)

    async def _end(self, run: Run, status: str, error: str | None) -> None:
        """Record that ``run`` ended: its end time and saved models first, its status
        last, so that whoever sees it ended (a client once its events stop) sees both."""
        run.ended = time.time()
        run.models = (await self._thread(_history, run.directory))[2]
        run.status, run.error = status, error

    async def _write_index(self) -> None:
        """Rewrite ``runs.json``; refused with 503 (the registry failed) if it cannot."""
        async with self._index_lock:
            self._check_writable()
            records = [run.record(self.data_dir) for run in self._runs.values()]
            payload = orjson.dumps(records, option=orjson.OPT_INDENT_2)
            try:
                with anyio.CancelScope(shield=True):  # a shutdown must not tear the index
                    await self._thread(_replace, self.data_dir / INDEX, payload)
            except OSError as error:
                self._fail(f"writing {INDEX}: {type(error).__name__}: {error}")
                self._check_writable()


def _lock(data_dir: Path) -> int:
    """A descriptor of ``service.lock`` holding its exclusive flock."""
    descriptor = os.open(data_dir / LOCK_FILE, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(descriptor)
        raise DataDirectoryLockedError(data_dir) from None
    return descriptor


def check_unlocked(data_dir: Path) -> None:
    """``DataDirectoryLockedError`` now if a service holds ``data_dir``; creates nothing."""
    try:
        descriptor = os.open(data_dir / LOCK_FILE, os.O_RDONLY | os.O_CLOEXEC)
    except (FileNotFoundError, NotADirectoryError):
        return  # no lock file: nobody holds it
    try:
        fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        raise DataDirectoryLockedError(data_dir) from None
    finally:
        os.close(descriptor)


def read_index(data_dir: Path) -> list[dict[str, Any]]:
    """The runs ``runs.json`` in ``data_dir`` records (none without the file).

    Raises:
        DamagedIndexError: the file is not a list of run records.
    """
    path = data_dir / INDEX
    try:
        records = orjson.loads(path.read_bytes())
    except FileNotFoundError:
        return []
    except orjson.JSONDecodeError as error:
        raise DamagedIndexError(path, f"not JSON: {error}") from None
    if not isinstance(records, list):
        raise DamagedIndexError(path, f"a JSON {type(records).__name__}, not a list of runs")
    for number, record in enumerate(records):
        missing = [key for key in _RECORD_KEYS if not isinstance(record, dict) or key not in record]
        if missing:
            raise DamagedIndexError(path, f"run {number} lacks {', '.join(missing)}")
    return records


def confine(runs_dir: Path, directory: str) -> Path:
    """``directory`` resolved under ``runs_dir``; ``ValueError`` if it would land elsewhere
    (``..``, absolute, a symbolic link out, ``runs_dir`` itself) or make paths too long."""
    root, candidate = runs_dir.resolve(), Path(directory)
    if ".." in candidate.parts:
        raise ValueError(f"directory must not contain '..', got {directory!r}")
    resolved = (root / candidate).resolve()
    if resolved == root or not resolved.is_relative_to(root):
        raise ValueError(f"directory must be inside the runs directory, got {directory!r}")
    existing = next(parent for parent in (resolved, *resolved.parents) if parent.exists())
    longest = max(len(os.fsencode(part)) for part in candidate.parts)
    if longest > (name_max := os.pathconf(existing, "PC_NAME_MAX")):
        raise ValueError(
            f"each part of directory must be at most {name_max} bytes (one has {longest}), "
            f"got {directory!r}"
        )
    length = len(os.fsencode(resolved)) + _RUN_FILES_BYTES
    if length > (path_max := os.pathconf(existing, "PC_PATH_MAX")):
        raise ValueError(
            f"directory makes paths too long ({length} bytes with the run's files, over "
            f"{path_max}), got {directory!r}"
        )
    return resolved


def _replace(path: Path, payload: bytes) -> None:
    # One temporary name is enough: the service holds the lock, and writes under its own.
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


def _history(directory: Path) -> tuple[list[Any], list[Any], list[str]]:
    """A run's training and held-out points from its CSV files, and its models' names."""
    found: list[list[Any]] = []
    for name in ("metrics.csv", "evaluation.csv"):
        try:
            with open(directory / name, newline="") as file:
                found.append(from_rows(csv.DictReader(file)))
        except (FileNotFoundError, NotADirectoryError):
            found.append([])
    models = sorted(path.name for path in directory.glob("models/*.model"))
    return found[0], found[1], models
