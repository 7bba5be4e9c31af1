"""The service's training runs: started, listed, cancelled, and resumed after a restart.

Every run trains federated averaging on the handwritten digits with ``train_model`` in a
directory of its own under the data directory: ``state/`` (checkpoints) and
``metrics.csv``. The registry keeps ``runs.json`` in the data directory (each run's
id, configuration, directory and status, rewritten atomically on every change); on a
start it resumes every run whose status is still ``running``, from its last checkpoint.
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
from anyio.abc import TaskGroup

from managers import (
    CSVFileReleaseManager,
    FileProgramStateManager,
    GroupingReleaseManager,
    ModelFileReleaseManager,
)
from programlogic import LocalContext, train_model
from samples.service.admission import Admission
from samples.service.config import RunConfig, confine
from samples.service.live_metrics import LiveMetricsReleaseManager, Point, from_rows

__all__ = ["Run", "RunConflictError", "RunNotFoundError", "RunRegistry", "load_training"]

logger = logging.getLogger(__name__)

INDEX = "runs.json"
RUNNING, FINISHED, CANCELLED, FAILED = "running", "finished", "cancelled", "failed"


class RunNotFoundError(LookupError):
    """No run has the id asked for."""


class RunConflictError(Exception):
    """The request conflicts with a run's state or directory."""


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
            "directory": str(self.directory.relative_to(data_dir.resolve())),
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
        """Load ``runs.json`` and resume the runs that had not ended, in ``task_group``."""
        self._task_group = task_group
        await anyio.to_thread.run_sync(functools.partial(os.makedirs, self.data_dir, exist_ok=True))
        await anyio.to_thread.run_sync(load_training)
        index = self.data_dir / INDEX
        if not await anyio.Path(index).exists():
            return
        for record in orjson.loads(await anyio.Path(index).read_bytes()):
            directory = confine(self.data_dir, record["directory"])
            run = Run(
                id=record["id"],
                config=RunConfig.model_validate(record["config"]),
                directory=directory,
                status=record["status"],
                error=record["error"],
                live=LiveMetricsReleaseManager(await _history(directory)),
            )
            self._runs[run.id] = run
            if run.status == RUNNING:
                logger.info("resuming run %s in %s", run.id, directory)
                task_group.start_soon(self._train, run)
            else:
                await run.live.aclose()
                run.ended.set()

    async def create(self, config: RunConfig) -> Run:
        """A new run of ``config``, started in the background.

        Raises:
            ValueError: ``config.directory`` is outside the data directory.
            RunConflictError: another run uses the directory, or it exists already.
            TooManyRunsError: ``admission.max_running`` runs are active.
        """
        if self._task_group is None:
            raise RuntimeError("the registry is not open")
        self.admission.admit(self._active())  # refused early: no disk work for a 429
        run_id = secrets.token_hex(6)
        directory = confine(self.data_dir, config.directory or f"runs/{run_id}")
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
        await self._write_index()
        self._task_group.start_soon(self._train, run)
        logger.info("started run %s in %s", run_id, directory)
        return run

    async def cancel(self, run_id: str) -> Run:
        """Cancel a running run and wait until it stopped; its checkpoints stay loadable.

        Raises:
            RunNotFoundError: no run has the id.
            RunConflictError: the run has ended already.
        """
        run = self.get(run_id)
        if run.status != RUNNING:
            raise RunConflictError(f"run {run_id} is {run.status}, not running")
        run.status = CANCELLED
        await self._write_index()
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
        async with self._index_lock:
            records = [run.record(self.data_dir) for run in self._runs.values()]
            payload = orjson.dumps(records, option=orjson.OPT_INDENT_2)
            with anyio.CancelScope(shield=True):  # a shutdown must not tear the index
                await anyio.to_thread.run_sync(
                    _replace, self.data_dir / INDEX, payload, limiter=self.admission.registry_io
                )


def _replace(path: Path, payload: bytes) -> None:
    temporary = path.with_name(f".{path.name}.tmp")
    with open(temporary, "wb") as file:
        file.write(payload)
        file.flush()
        os.fsync(file.fileno())
    os.replace(temporary, path)


async def _history(directory: Path) -> list[Point]:
    """The points of a run's ``metrics.csv`` (none if it has no such file yet)."""

    def read() -> list[Point]:
        try:
            with open(directory / "metrics.csv", newline="") as file:
                return from_rows(list(csv.DictReader(file)))
        except FileNotFoundError:
            return []

    return await anyio.to_thread.run_sync(read)


def load_training() -> None:
    """Import TensorFlow, Keras and scikit-learn, and load the digits: before serving.

    Loading an extension module holds the GIL for up to half a second at a time, so
    in a worker thread it still stalls the event loop; at startup no request waits.
    """
    import programlogic.learning  # noqa: F401  (imported for its side effect: loaded)

    _digits()


@functools.cache
def _digits() -> Any:
    from programlogic.datasets import load_digits_writers

    return load_digits_writers()


def _build_process(config: RunConfig, feature_shape: tuple[int, ...], num_classes: int) -> Any:
    # Runs in a worker thread: building the model and its functions is Python work.
    from programlogic.datasets import Preprocessing
    from programlogic.learning import build_model, build_weighted_fed_avg, sgd

    model_fn = functools.partial(build_model, config.model, feature_shape, num_classes)
    return build_weighted_fed_avg(
        model_fn,
        sgd(config.client_lr),
        sgd(config.server_lr),
        preprocess=Preprocessing(
            epochs=config.epochs, batch_size=config.batch_size, shuffle_buffer=100
        ),
        seed=config.seed,
    )


async def train(
    config: RunConfig,
    directory: Path,
    live: LiveMetricsReleaseManager,
    *,
    build_limiter: anyio.CapacityLimiter | None = None,
) -> None:
    """Train (or resume) the run of ``config`` in ``directory``, releasing metrics to ``live``.

    The model is built on a worker thread of ``build_limiter`` (default: anyio's).
    """
    data = await anyio.to_thread.run_sync(_digits, limiter=build_limiter)
    process = await anyio.to_thread.run_sync(
        _build_process, config, data.feature_shape, data.num_classes, limiter=build_limiter
    )
    async with (
        LocalContext(max_workers=1),
        FileProgramStateManager(directory / "state", keep_total=3) as state,
        GroupingReleaseManager([CSVFileReleaseManager(directory / "metrics.csv"), live]) as metrics,
        ModelFileReleaseManager(directory / "models") as models,
    ):
        await train_model(
            train_process=process,
            train_data_source=data.train,
            train_per_round_clients=config.clients_per_round,
            train_total_rounds=config.rounds,
            program_state_manager=state,
            model_output_manager=models,
            train_metrics_manager=metrics,
            seed=config.seed,
        )
