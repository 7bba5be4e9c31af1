"""Forked, resumable evaluation loops, and evaluating a model once on a whole test set."""

from __future__ import annotations

import contextlib
import datetime
import hashlib
import logging
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any

import anyio

from managers.clock import Clock, SystemClock
from managers.closing import AsyncClosing
from managers.release.base import ReleaseManager
from managers.state.base import ProgramStateManager
from managers.validation import (
    check_callable,
    check_int,
    check_interface,
    check_timedelta,
    describe,
)
from managers.values import materialize
from programlogic.context import get_context
from programlogic.data import AllClientsDataSource, ClientHandle, FederatedDataSource
from programlogic.process import LearningProcess, as_async
from programlogic.tasks import TrackedTask

__all__ = ["EvaluationManager", "evaluate_once"]

logger = logging.getLogger(__name__)

MANAGER_STATE_NAME = "evaluation_manager"
"""The name given to ``create_state_manager_fn`` for the manager's own bookkeeping."""


def evaluation_seed(seed: int, train_round: int) -> int:
    """The sampling seed of the evaluation of ``train_round``: a pure function of both."""
    digest = hashlib.sha256(f"evaluation/{seed}/{train_round}".encode()).digest()
    return int.from_bytes(digest[:8], "little")


def _evaluation_name(train_round: int) -> str:
    return f"evaluation_of_round_{train_round}"


class EvaluationManager(AsyncClosing):
    """Forks an evaluation loop per evaluated training round, and resumes them after a restart.

    - ``data_source``: the evaluation clients; each evaluation round samples
      ``cohort_size`` of them, seeded by ``(seed, train round)`` and the evaluation
      round, so a resumed evaluation samples what it would have sampled.
    - ``aggregated_metrics_manager``: receives each evaluation's final metrics (those of
      its last evaluation round; an evaluation process that aggregates across rounds
      makes them aggregated) with key = train round.
    - ``create_state_manager_fn(name)``: a program-state manager for a name: the
      manager's own bookkeeping (``"evaluation_manager"``) and each evaluation's state
      (``"evaluation_of_round_{r}"``). It is called whenever one is needed, and must
      return managers that see the same data for the same name, also after a restart
      (e.g. a file manager on ``root / name``, or one memory manager per name).
      Each manager it returns is closed (``aclose``) as soon as this manager is done
      with it: the bookkeeping's after each update, an evaluation's when its loop ends
      (finished, failed or cancelled).
    - ``create_process_fn(name)``: ``(evaluation_process, per_round_metrics_manager)``
      for an evaluation; the process is a :class:`~programlogic.LearningProcess`
      whose ``next`` evaluates (its state holds the weights under evaluation).
    - ``duration``: an evaluation runs at least one evaluation round, then more until
      its deadline, start time + ``duration``, on ``clock``.
    - ``max_concurrent``: at most this many loops evaluate at once; the others wait
      their turn in the order they were started.
    - ``evaluated_model_manager``: when given, receives each finished evaluation's model,
      ``{"weights": the weights evaluated, "metrics": its final metrics}``, with key =
      train round, right after its metrics (a
      :class:`~managers.BestModelReleaseManager` keeps the best by a metric).

    Ownership: loops run in the current federated context's background work. Leaving
    the context, or closing this manager (``async with EvaluationManager(...)`` or
    :meth:`aclose`), cancels unfinished loops; their saved state stays for a resume.
    ``train_model`` closes it when it fails or is cancelled, so no evaluation outlives
    a failed run. A failing loop never cancels its caller:
    :meth:`wait_for_evaluations_to_finish` raises its failure. Between calls, with no
    evaluation running, the manager holds no state manager open: a crashed program can
    be rerun in the same process with a new manager on the same directories, even
    while the old one is still referenced.

    What is durable, in order, so that a crash anywhere loses nothing and leaves no
    orphaned state: ``start_evaluation`` saves the in-flight list (train round, start
    time as int seconds), then the evaluation's initial state (the weights), then
    starts the loop. After each evaluation round the loop releases that round's
    metrics (key = evaluation round), then saves its state. At the end it releases the
    aggregated metrics (then the evaluated model), deletes its state, then records the
    round as finished. On resume, an in-flight evaluation whose state was never saved
    (or already deleted) is dropped with a warning: ``train_model`` starts the
    evaluation of the round it resumes from again, which covers both cases.
    """

    def __init__(
        self,
        data_source: FederatedDataSource,
        aggregated_metrics_manager: ReleaseManager,
        create_state_manager_fn: Callable[[str], ProgramStateManager],
        create_process_fn: Callable[[str], tuple[LearningProcess, ReleaseManager]],
        cohort_size: int,
        duration: datetime.timedelta = datetime.timedelta(hours=24),
        clock: Clock | None = None,
        max_concurrent: int | None = None,
        seed: int = 0,
        evaluated_model_manager: ReleaseManager | None = None,
    ) -> None:
        check_interface("data_source", data_source, "FederatedDataSource", ["iterator"])
        check_interface(
            "aggregated_metrics_manager", aggregated_metrics_manager, "ReleaseManager", ["release"]
        )
        check_callable("create_state_manager_fn", create_state_manager_fn)
        check_callable("create_process_fn", create_process_fn)
        check_int("cohort_size", cohort_size, minimum=1)
        check_timedelta("duration", duration, minimum=datetime.timedelta(0))
        check_interface("clock", clock, "Clock", ["now"], allow_none=True)
        check_int("max_concurrent", max_concurrent, minimum=1, allow_none=True)
        check_int("seed", seed, minimum=0)
        check_interface(
            "evaluated_model_manager",
            evaluated_model_manager,
            "ReleaseManager",
            ["release"],
            allow_none=True,
        )
        try:
            data_source.iterator(0).select(cohort_size, 0)
        except ValueError as error:  # more clients than the source holds
            raise ValueError(f"cohort_size={cohort_size}: {error}") from None
        self._data_source = data_source
        self._aggregated = aggregated_metrics_manager
        self._create_state_manager = create_state_manager_fn
        self._create_process = create_process_fn
        self._cohort_size = cohort_size
        self._duration = int(duration.total_seconds())
        self._clock = clock or SystemClock()
        self._max_concurrent = max_concurrent
        self._seed = seed
        self._evaluated_models = evaluated_model_manager
        self._in_flight: dict[int, int] = {}
        self._finished: list[int] = []
        self._tasks: dict[int, TrackedTask] = {}
        self._running: dict[int, tuple[anyio.CancelScope, anyio.Event]] = {}
        self._processes: dict[int, tuple[LearningProcess, ReleaseManager]] = {}
        self._turns: anyio.Semaphore | None = None
        self._lock: anyio.Lock | None = None

    @property
    def duration(self) -> datetime.timedelta:
        """How long each evaluation runs evaluation rounds (at least one)."""
        return datetime.timedelta(seconds=self._duration)

    @property
    def in_flight(self) -> dict[int, int]:
        """Train round -> start time (int seconds) of every unfinished evaluation."""
        return dict(self._in_flight)

    @property
    def finished(self) -> list[int]:
        """The train rounds whose evaluation finished, in the order they finished."""
        return list(self._finished)

    async def resume_from_previous_state(self) -> None:
        """Resume every evaluation that was in flight when the program last stopped."""
        async with self._guard():
            async with self._opened(MANAGER_STATE_NAME) as bookkeeping:
                saved, _ = await bookkeeping.load_latest()
            if saved is not None:
                self._in_flight = {int(r): int(start) for r, start in saved["in_flight"]}
                self._finished = [int(r) for r in saved["finished"]]
            resumable = {}
            for train_round, start in list(self._in_flight.items()):
                if train_round in self._tasks:
                    continue
                async with self._opened(_evaluation_name(train_round)) as state_manager:
                    versions = await state_manager.get_versions()
                if versions:
                    resumable[train_round] = start
                else:
                    logger.warning(
                        "dropping the evaluation of round %d: its state was never saved "
                        "or was already deleted",
                        train_round,
                    )
                    del self._in_flight[train_round]
            if len(resumable) != len(self._in_flight) or saved is None:
                await self._save_bookkeeping()
        for train_round, start in resumable.items():
            logger.info("resuming the evaluation of round %d", train_round)
            await self._fork(train_round, start)

    async def start_evaluation(
        self, train_round: int, start_timestamp: int, model_weights: Any
    ) -> None:
        """Start evaluating ``model_weights`` of ``train_round``; a no-op if started before.

        Returns once the bookkeeping and the evaluation's initial state are saved and
        the loop has started. ``start_timestamp`` (int seconds) fixes the deadline.
        """
        check_int("train_round", train_round, minimum=0)
        async with self._guard():
            if train_round in self._in_flight or train_round in self._finished:
                return
            self._in_flight[train_round] = int(start_timestamp)
            await self._save_bookkeeping()
            process, _ = self._process(train_round)
            initial = await as_async(process.initialize)()
            state = await as_async(process.set_model_weights)(initial, model_weights)
            checkpoint = {"process_state": state, "evaluation_round": 0, "metrics": None}
            async with self._opened(_evaluation_name(train_round)) as state_manager:
                await state_manager.save(await materialize(checkpoint), 0)
        await self._fork(train_round, int(start_timestamp))

    async def wait_for_evaluations_to_finish(self) -> None:
        """Wait for every started evaluation; raise what failed.

        One failure is raised as itself, several as an ExceptionGroup.
        """
        failures: list[Exception] = []
        for train_round, task in list(self._tasks.items()):
            try:
                await task.wait()
            except Exception as error:
                failures.append(error)
            self._tasks.pop(train_round, None)
        if len(failures) == 1:
            raise failures[0]
        if failures:
            raise ExceptionGroup(f"{len(failures)} evaluations failed", failures)

    async def aclose(self) -> None:
        """Stop the evaluations this manager runs and release what it holds.

        Running evaluations are cancelled, and this returns once they have stopped;
        their saved state stays, so :meth:`resume_from_previous_state` (of this manager
        or of a new one) continues them. A failure an evaluation raised before stays
        with the federated context's background work (raised when the context is left,
        unless something else is). The manager may be used again afterwards.
        """
        running = list(self._running.values())
        for scope, _ in running:
            scope.cancel()
        with anyio.CancelScope(shield=True):
            for _, stopped in running:
                await stopped.wait()
        self._tasks.clear()

    async def _fork(self, train_round: int, start: int) -> None:
        task = await get_context().background.start(
            self._loop, train_round, start, name=f"evaluation of round {train_round}"
        )
        self._tasks[train_round] = task

    async def _loop(
        self, train_round: int, start: int, *, task_status: anyio.abc.TaskStatus[None]
    ) -> None:
        stopped = anyio.Event()
        with anyio.CancelScope() as scope:
            self._running[train_round] = (scope, stopped)
            try:
                if self._max_concurrent is not None and self._turns is None:
                    self._turns = anyio.Semaphore(self._max_concurrent)
                turns = self._turns
                task_status.started()
                if turns is None:
                    await self._evaluate(train_round, start)
                else:
                    async with turns:
                        await self._evaluate(train_round, start)
            finally:
                self._processes.pop(train_round, None)
                del self._running[train_round]
                stopped.set()

    async def _evaluate(self, train_round: int, start: int) -> None:
        process, per_round_metrics = self._process(train_round)
        async with self._opened(_evaluation_name(train_round)) as state_manager:
            template = {"process_state": await as_async(process.initialize)()}
            saved, evaluation_round = await state_manager.load_latest(template)
            state, metrics = saved["process_state"], saved["metrics"]
            iterator = self._data_source.iterator(evaluation_seed(self._seed, train_round))
            deadline = start + self._duration
            run_round = as_async(process.next)
            while evaluation_round == 0 or int(self._clock.now().timestamp()) < deadline:
                evaluation_round += 1
                clients = iterator.select(self._cohort_size, evaluation_round)
                output = await run_round(state, clients)
                state, metrics = output.state, await materialize(output.metrics)
                await per_round_metrics.release(metrics, evaluation_round)
                checkpoint = {
                    "process_state": state,
                    "evaluation_round": evaluation_round,
                    "metrics": metrics,
                }
                await state_manager.save(await materialize(checkpoint), evaluation_round)
            await self._aggregated.release(metrics, train_round)
            if self._evaluated_models is not None:
                weights = await as_async(process.get_model_weights)(state)
                evaluated = {"weights": weights, "metrics": metrics}
                await self._evaluated_models.release(evaluated, train_round)
            await state_manager.remove_all()
        async with self._guard():
            self._in_flight.pop(train_round, None)
            self._finished.append(train_round)
            await self._save_bookkeeping()
        logger.info(
            "evaluation of round %d finished after %d evaluation rounds",
            train_round,
            evaluation_round,
        )

    def _guard(self) -> anyio.Lock:
        if self._lock is None:
            self._lock = anyio.Lock()
        return self._lock

    @contextlib.asynccontextmanager
    async def _opened(self, name: str) -> AsyncIterator[ProgramStateManager]:
        """A state manager from ``create_state_manager_fn(name)``, closed after use."""
        manager = self._create_state_manager(name)
        try:
            yield manager
        finally:
            with anyio.CancelScope(shield=True):  # also when cancelled: it may hold a lock
                await manager.aclose()

    def _process(self, train_round: int) -> tuple[LearningProcess, ReleaseManager]:
        if train_round not in self._processes:
            self._processes[train_round] = self._create_process(_evaluation_name(train_round))
        return self._processes[train_round]

    async def _save_bookkeeping(self) -> None:
        state = {
            "in_flight": [[r, start] for r, start in self._in_flight.items()],
            "finished": list(self._finished),
        }
        async with self._opened(MANAGER_STATE_NAME) as manager:
            versions = await manager.get_versions()
            await manager.save(state, versions[-1] + 1 if versions else 0)


async def evaluate_once(
    process: LearningProcess,
    model_weights: Any,
    clients: Sequence[ClientHandle] | AllClientsDataSource,
) -> Any:
    """The metrics of one evaluation round of ``model_weights`` on all of ``clients``.

    ``clients`` is a list of client handles, or a data source with ``all_clients()``
    (an :class:`~programlogic.data.AllClientsDataSource`) whose clients are all
    used (sorted by id). For the common case that needs no forking, no deadline and no
    state: a held-out federated test set evaluated once.
    """
    if not isinstance(clients, Sequence):
        if not isinstance(clients, AllClientsDataSource):
            raise TypeError(
                "clients must be a sequence of ClientHandle or a data source with "
                f"all_clients(), got {describe(clients)}"
            )
        clients = clients.all_clients()
    initial = await as_async(process.initialize)()
    state = await as_async(process.set_model_weights)(initial, model_weights)
    output = await as_async(process.next)(state, sorted(clients))
    return await materialize(output.metrics)
