"""``train_model``: the program logic that trains a model round by round, resumably."""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import logging
from collections.abc import AsyncIterator
from typing import Any, Protocol, runtime_checkable

import anyio
from anyio.streams.memory import MemoryObjectReceiveStream

from managers.clock import Clock, SystemClock
from managers.release.base import ReleaseManager
from managers.state.base import ProgramStateManager
from managers.validation import (
    check_bool,
    check_int,
    check_interface,
    check_timedelta,
    describe,
)
from managers.values import materialize
from programlogic.context import get_context
from programlogic.data import FederatedDataSource
from programlogic.exceptions import ResumeError
from programlogic.process import LearningProcess, as_async
from programlogic.stopping import StoppingPolicy, StopReason
from programlogic.tasks import task_group

__all__ = [
    "EvaluationManagerProtocol",
    "StopReason",
    "TrainingResult",
    "final_model_key",
    "train_model",
]

logger = logging.getLogger(__name__)


@runtime_checkable
class EvaluationManagerProtocol(Protocol):
    """What ``train_model`` needs of an evaluation manager.

    Optionally also ``async aclose()``: stop the running evaluations (their saved state
    stays) and release what the manager holds. ``train_model`` calls it when it fails
    or is cancelled, so that no evaluation outlives the failed run.
    """

    async def resume_from_previous_state(self) -> None:
        """Resume the evaluations that were in flight when the program last stopped."""
        ...

    async def start_evaluation(
        self, train_round: int, start_timestamp: int, model_weights: Any
    ) -> None:
        """Start evaluating ``model_weights`` of ``train_round``; a no-op if started before."""
        ...

    async def wait_for_evaluations_to_finish(self) -> None:
        """Wait for every started evaluation; raise what failed."""
        ...


@dataclasses.dataclass(frozen=True)
class TrainingResult:
    """What ``train_model`` returns.

    ``state``: the train state after the last round; ``round_num``: that round;
    ``stop_reason``: why training stopped (a stopping policy's own reason when one
    stopped it, also on a rerun of a stopped run); ``resumed_from``: the round loaded from
    the program state manager, or ``None`` when the run started fresh.
    """

    state: Any
    round_num: int
    stop_reason: StopReason
    resumed_from: int | None


def final_model_key(round_num: int) -> str:
    """The key of the final model weights ``train_model`` releases: those of round ``round_num``.

    ``round_num`` is the last round trained: ``train_total_rounds``, or the round a
    stopping policy made the last (``TrainingResult.round_num``).
    """
    return f"final_training_checkpoint_round_{round_num}"


async def train_model(
    *,
    train_process: LearningProcess,
    train_data_source: FederatedDataSource,
    train_per_round_clients: int,
    train_total_rounds: int,
    program_state_manager: ProgramStateManager,
    model_output_manager: ReleaseManager,
    train_metrics_manager: ReleaseManager | None = None,
    evaluation_manager: EvaluationManagerProtocol | None = None,
    evaluation_periodicity: int | datetime.timedelta = 1,
    seed: int = 0,
    clock: Clock | None = None,
    stopping: StoppingPolicy | None = None,
    stopping_waits_for_evaluations: bool = False,
) -> TrainingResult:
    """Train ``train_process`` for ``train_total_rounds`` rounds, resuming where it stopped.

    Runs in the current federated context (``async with LocalContext():``). Every
    argument is checked before anything starts: a wrong type is a ``TypeError``, a
    wrong value a ``ValueError``, each naming the argument.

    A round ``r`` (1 <= r <= ``train_total_rounds``):

    1. selects ``train_per_round_clients`` clients, a pure function of ``(seed, r)``;
    2. runs ``train_process.next``;
    3. saves the program state as version ``r``: the train state, the round, the
       sampler's description, the evaluation clock, and the round's metrics;
    4. releases the metrics to ``train_metrics_manager`` with key ``r``;
    5. starts an evaluation of the round's model when it is due (every
       ``evaluation_periodicity`` rounds, or once that much time has passed on
       ``clock``; the initial model and the last round are always evaluated).

    Steps 3-5 of a round overlap step 2 of the next round, but at most one save is in
    flight and a round's releases follow its save. The initial state is saved as
    version 0 before round 1 starts. After the last round ``n``, the final model weights
    are released to ``model_output_manager`` with key ``final_model_key(n)``, and
    ``train_model`` waits for the evaluations to finish.

    Early stopping: a ``stopping`` policy (:class:`~programlogic.stopping.StoppingPolicy`)
    is asked ``before_round(r + 1)`` once round ``r`` is trained, and
    ``after_evaluation(r)``: with ``stopping_waits_for_evaluations=True``, once round
    ``r``'s own evaluation has finished, for evaluated rounds only (the evaluation
    starts before step 3, and round ``r + 1`` waits for the decision); otherwise right
    after step 2 of every round, on the results that have arrived. Both are asked
    before step 3. When the policy stops, round ``r`` is the last: it is saved marked
    stopped with the policy's reason, evaluated, its model released as the final one,
    and the result's ``stop_reason`` is that reason, on a rerun too. The waiting mode
    waits for each evaluation's whole ``duration`` (24 hours by default): give the
    :class:`~programlogic.EvaluationManager` ``duration=timedelta(0)`` for one
    evaluation round (a warning is logged when it is longer).

    Resuming: the newest version of ``program_state_manager`` is loaded and checked
    first: a checkpoint written with another seed, number of clients per round or
    sampler (the data source's ``describe()``, compared as an opaque value; for a dict,
    the differing keys are named) raises :class:`~programlogic.exceptions.ResumeError`
    naming what differs, before any evaluation is resumed. Then the evaluations in
    flight are resumed, the loaded round's metrics are released again and its
    evaluation started again (releases are idempotent by key, starting an evaluation
    twice is a no-op), so a crash right after a save loses nothing; training continues
    with the next round. A larger ``train_total_rounds`` than before continues
    training; if the checkpoint already holds the last round, only the final release
    (and evaluation) is made sure of.

    Errors: when the process, a save, a release, the stopping policy or an evaluation
    raises, ``train_model`` fails with that same exception object, and with nothing
    else: the saves, releases and rounds that this failure cancels add no error of
    their own, and an exception group raised by user code comes back whole, as it was
    raised. Only failures that happen independently before either is cancelled (or
    several failed evaluations) come together in one ``ExceptionGroup``. A failed
    evaluation is raised when ``train_model`` waits for the evaluations, after the
    final release. Client work that raises in a backend arrives as
    :class:`~programlogic.exceptions.ClientError`, with the original as its cause.

    Cancellation, and what a failure leaves: ``train_model`` cancels its saves and
    releases; a save already writing finishes first (file managers write atomically),
    so the newest complete checkpoint stays loadable. When it fails or is cancelled,
    it closes an ``evaluation_manager`` that has an ``aclose`` (as
    :class:`~programlogic.EvaluationManager` has) before it returns: no evaluation it
    started or resumed keeps running, their saved state stays for a resume, and no
    state directory stays locked, so the same program can be run again in the same
    process.
    """
    periodicity = _check_arguments(
        train_process=train_process,
        train_data_source=train_data_source,
        train_per_round_clients=train_per_round_clients,
        train_total_rounds=train_total_rounds,
        program_state_manager=program_state_manager,
        model_output_manager=model_output_manager,
        train_metrics_manager=train_metrics_manager,
        evaluation_manager=evaluation_manager,
        evaluation_periodicity=evaluation_periodicity,
        seed=seed,
        clock=clock,
        stopping=stopping,
        stopping_waits_for_evaluations=stopping_waits_for_evaluations,
    )
    iterator = train_data_source.iterator(seed)
    try:
        iterator.select(train_per_round_clients, 1)
    except ValueError as error:
        raise ValueError(f"train_per_round_clients={train_per_round_clients}: {error}") from None
    get_context()  # a clear error outside a federated context
    _warn_of_long_waits(stopping, stopping_waits_for_evaluations, evaluation_manager)
    program = _Program(
        process=train_process,
        state_manager=program_state_manager,
        metrics_manager=train_metrics_manager,
        evaluation_manager=evaluation_manager,
        periodicity=periodicity,
        total_rounds=train_total_rounds,
        clock=clock or SystemClock(),
        stopping=stopping,
        stopping_waits=stopping_waits_for_evaluations,
        config={
            "sampler": iterator.describe(),
            "per_round_clients": train_per_round_clients,
        },
    )

    initial_state = await as_async(train_process.initialize)()
    template = {"train_state": initial_state}
    loaded, loaded_round = await program_state_manager.load_latest(template)
    resumed_from = None if loaded is None else loaded_round
    if loaded is not None:
        program.check_resumable(loaded, loaded_round)

    # The persister saves and releases one round while the loop computes the next; an
    # unbuffered stream holds the loop back until the previous round is taken. This
    # function owns the receiving end: it stays open when the persister fails, so the
    # loop, waiting to hand over a round, is cancelled instead of told the stream broke.
    send, receive = anyio.create_memory_object_stream[dict[str, Any]](0)
    stop_evaluations_on_failure = _evaluations_stopped_on_failure(evaluation_manager)
    async with send, receive, stop_evaluations_on_failure, task_group() as group:
        if evaluation_manager is not None:
            await evaluation_manager.resume_from_previous_state()
        if loaded is None:
            logger.info("starting training from the initial state")
            checkpoint = program.checkpoint(initial_state, 0, None, last_evaluation=None)
            await program.ask_before_round(checkpoint)
            await program.persist(checkpoint)
            state, first_round = initial_state, 1
        else:
            logger.info("resuming training after round %d", loaded_round)
            checkpoint = loaded
            state, first_round = loaded["train_state"], loaded_round + 1
            checkpoint["stop_reason"] = _saved_stop_reason(checkpoint)
            await program.ask_before_round(checkpoint)  # not saved again: its version exists
            await program.release_round(checkpoint)
            program.persisted_round = loaded_round
        last_evaluation = checkpoint["evaluation"]["last_time"]
        last_round = checkpoint["round"]

        next_round = as_async(train_process.next)
        group.start_soon(program.persist_each, receive, name="persist rounds")
        async with send:
            for round_num in range(first_round, train_total_rounds + 1):
                if checkpoint["stop_reason"] is not None:
                    break
                clients = iterator.select(train_per_round_clients, round_num)
                output = await next_round(state, clients)
                if not (hasattr(output, "state") and hasattr(output, "metrics")):
                    raise TypeError(
                        "train_process.next must return a LearningProcessOutput(state, "
                        f"metrics), got {type(output).__name__}"
                    )
                state, last_round = output.state, round_num
                checkpoint = program.checkpoint(state, round_num, output.metrics, last_evaluation)
                await program.ask_after_evaluation(checkpoint)
                await program.ask_before_round(checkpoint)
                last_evaluation = checkpoint["evaluation"]["last_time"]
                await send.send(checkpoint)
        await program.wait_until_persisted(last_round)

        weights = await as_async(train_process.get_model_weights)(state)
        await model_output_manager.release(weights, final_model_key(last_round))

    if evaluation_manager is not None:
        await evaluation_manager.wait_for_evaluations_to_finish()
    if checkpoint["stop_reason"] is not None:
        reason = StopReason(checkpoint["stop_reason"])
    elif first_round > train_total_rounds:
        reason = StopReason.ALREADY_COMPLETED
    else:
        reason = StopReason.COMPLETED
    return TrainingResult(
        state=state, round_num=last_round, stop_reason=reason, resumed_from=resumed_from
    )


@contextlib.asynccontextmanager
async def _evaluations_stopped_on_failure(
    evaluation_manager: EvaluationManagerProtocol | None,
) -> AsyncIterator[None]:
    """On failure or cancellation, stop the evaluations this call started or resumed.

    An evaluation manager with an ``aclose`` (:class:`~programlogic.EvaluationManager`)
    is closed: its running evaluations are cancelled (their saved state stays for a
    resume) and its state managers released. A failure of ``aclose`` itself is logged:
    it must not hide the failure that got here.
    """
    try:
        yield
    except BaseException:
        close = getattr(evaluation_manager, "aclose", None)
        if close is not None:
            with anyio.CancelScope(shield=True):
                try:
                    await close()
                except Exception:
                    logger.exception("closing the evaluation manager after a failure failed")
        raise


@dataclasses.dataclass
class _Program:
    """What one ``train_model`` call needs in its steps, gathered once."""

    process: LearningProcess
    state_manager: ProgramStateManager
    metrics_manager: ReleaseManager | None
    evaluation_manager: EvaluationManagerProtocol | None
    periodicity: int | datetime.timedelta
    total_rounds: int
    clock: Clock
    stopping: StoppingPolicy | None
    stopping_waits: bool
    config: dict[str, Any]
    persisted_round: int = -1
    progress: anyio.Event = dataclasses.field(default_factory=anyio.Event)

    def checkpoint(
        self,
        state: Any,
        round_num: int,
        metrics: Any,
        last_evaluation: int | None,
    ) -> dict[str, Any]:
        """The program state saved for ``round_num``; decides whether it is evaluated."""
        due = False
        if self.evaluation_manager is not None:
            now = int(self.clock.now().timestamp())
            if round_num in (0, self.total_rounds):
                due = True
            elif isinstance(self.periodicity, int):
                due = round_num % self.periodicity == 0
            else:
                due = (
                    last_evaluation is None
                    or now - last_evaluation >= self.periodicity.total_seconds()
                )
            if due:
                last_evaluation = now
        return {
            "train_state": state,
            "round": round_num,
            "metrics": metrics,
            "evaluation": {"due": due, "last_time": last_evaluation},
            "stop_reason": None,
            **self.config,
        }

    async def ask_after_evaluation(self, checkpoint: dict[str, Any]) -> None:
        """Ask the stopping policy whether the round of ``checkpoint``, not saved yet, is the
        last; in the waiting mode, once that round's evaluation has finished."""
        round_num = checkpoint["round"]
        if self.stopping is None or round_num >= self.total_rounds:
            return
        if self.stopping_waits:
            if not checkpoint["evaluation"]["due"] or self.evaluation_manager is None:
                return
            await self.start_evaluation(checkpoint)
            await self.evaluation_manager.wait_for_evaluations_to_finish()
        reason = await self.stopping.after_evaluation(round_num)
        self.stop(checkpoint, _check_answer(reason, "after_evaluation"))

    async def ask_before_round(self, checkpoint: dict[str, Any]) -> None:
        """Ask the stopping policy whether the round after ``checkpoint``'s may start."""
        round_num = checkpoint["round"]
        if (
            self.stopping is None
            or checkpoint["stop_reason"] is not None
            or round_num >= self.total_rounds
        ):
            return
        reason = await self.stopping.before_round(round_num + 1)
        self.stop(checkpoint, _check_answer(reason, "before_round"))

    def stop(self, checkpoint: dict[str, Any], reason: StopReason | None) -> None:
        """Make the round of ``checkpoint`` the last, for ``reason``; evaluate it."""
        if reason is None:
            return
        logger.info(
            "the stopping policy stopped training at round %d: %s", checkpoint["round"], reason
        )
        checkpoint["stop_reason"] = str(reason)
        evaluation = checkpoint["evaluation"]
        if self.evaluation_manager is not None and not evaluation["due"]:
            evaluation["due"], evaluation["last_time"] = True, int(self.clock.now().timestamp())

    async def persist(self, checkpoint: dict[str, Any]) -> None:
        """Save ``checkpoint``, then make its releases."""
        # Only what the process returned can hold value references.
        checkpoint["train_state"], checkpoint["metrics"] = await materialize(
            (checkpoint["train_state"], checkpoint["metrics"])
        )
        await self.state_manager.save(checkpoint, checkpoint["round"])
        await self.release_round(checkpoint)
        self.persisted_round = checkpoint["round"]
        self.progress.set()
        self.progress = anyio.Event()

    async def persist_each(self, checkpoints: MemoryObjectReceiveStream[dict[str, Any]]) -> None:
        """Persist the checkpoints in the order they arrive, until the sending end closes."""
        async for checkpoint in checkpoints:
            await self.persist(checkpoint)

    async def wait_until_persisted(self, round_num: int) -> None:
        """Wait until round ``round_num`` (or a later one) is saved and released."""
        while self.persisted_round < round_num:
            await self.progress.wait()

    async def release_round(self, checkpoint: dict[str, Any]) -> None:
        """Release a saved round's metrics and start its evaluation if it was due."""
        round_num = checkpoint["round"]
        if round_num > 0 and self.metrics_manager is not None:
            await self.metrics_manager.release(checkpoint["metrics"], round_num)
        if checkpoint["evaluation"]["due"]:
            await self.start_evaluation(checkpoint)

    async def start_evaluation(self, checkpoint: dict[str, Any]) -> None:
        """Start evaluating the round of ``checkpoint``; a no-op if started before."""
        if self.evaluation_manager is None:
            return
        get_weights = as_async(self.process.get_model_weights)
        weights = await materialize(await get_weights(checkpoint["train_state"]))
        await self.evaluation_manager.start_evaluation(
            checkpoint["round"], checkpoint["evaluation"]["last_time"], weights
        )

    def check_resumable(self, loaded: Any, loaded_round: int) -> None:
        """Raise ResumeError when ``loaded`` was written by another configuration.

        The sampler's description is opaque: it is compared as a whole value, and for a
        dict description the keys whose values differ are named.
        """
        written_by_us = {"train_state", "round", "sampler", "per_round_clients"}
        if not isinstance(loaded, dict) or not written_by_us <= loaded.keys():
            raise ResumeError(
                f"version {loaded_round} of the program state manager was not written by "
                "train_model; give train_model a state manager of its own"
            )
        if loaded_round > self.total_rounds:
            raise ResumeError(
                f"the program state is at round {loaded_round}, beyond "
                f"train_total_rounds={self.total_rounds}"
            )
        differences = _sampler_differences(loaded["sampler"], self.config["sampler"])
        saved_clients, clients = loaded["per_round_clients"], self.config["per_round_clients"]
        if saved_clients != clients:
            differences.insert(
                0, f"train_per_round_clients={saved_clients!r} (this run: {clients!r})"
            )
        if differences:
            raise ResumeError(
                f"cannot resume from the program state of round {loaded_round}: it was "
                f"written with {', '.join(differences)}"
            )


def _saved_stop_reason(checkpoint: dict[str, Any]) -> str | None:
    """The stop reason a saved checkpoint holds; checkpoints written before stop reasons
    existed hold ``stopped`` instead."""
    if checkpoint.get("stop_reason") is not None:
        return str(checkpoint["stop_reason"])
    return str(StopReason.EARLY_STOPPED) if checkpoint.get("stopped") else None


def _check_answer(answer: object, hook: str) -> StopReason | None:
    """A stopping policy's answer as a StopReason, or None to go on."""
    if answer is None or isinstance(answer, StopReason):
        return answer
    if isinstance(answer, str) and answer:
        return StopReason(answer)
    raise TypeError(
        f"the stopping policy's {hook} must return None or a StopReason, got "
        f"{type(answer).__name__} {answer!r}"
    )


_ABSENT = object()

# How the keys of the built-in samplers' descriptions (ClientSampler.describe) read.
_SAMPLER_KEY_NAMES = {"num_clients": "number of clients"}
_SAMPLER_KEYS_TOO_LONG_TO_SHOW = {"client_ids_sha256": "another set of client ids"}


def _sampler_differences(saved: Any, current: Any) -> list[str]:
    """What differs between two sampler descriptions, one phrase a difference."""
    if not (isinstance(saved, dict) and isinstance(current, dict)):
        if _equal(saved, current):
            return []
        return [f"the sampler description {saved!r} (this run: {current!r})"]
    differences = []
    for key in {**saved, **current}:
        was, now = saved.get(key, _ABSENT), current.get(key, _ABSENT)
        if _equal(was, now):
            continue
        if key in _SAMPLER_KEYS_TOO_LONG_TO_SHOW:
            differences.append(_SAMPLER_KEYS_TOO_LONG_TO_SHOW[key])
        else:
            name = _SAMPLER_KEY_NAMES.get(key, key)
            differences.append(f"{name}={_show(was)} (this run: {_show(now)})")
    return differences


def _equal(saved: Any, current: Any) -> bool:
    """Whether two description values are equal; values that cannot tell are unequal."""
    try:
        return bool(saved == current)
    except (TypeError, ValueError):  # e.g. arrays, whose == is elementwise
        return False


def _show(value: Any) -> str:
    return "nothing" if value is _ABSENT else repr(value)


def _warn_of_long_waits(
    stopping: StoppingPolicy | None,
    stopping_waits_for_evaluations: bool,
    evaluation_manager: EvaluationManagerProtocol | None,
) -> None:
    """Log a warning when the waiting mode would hold each round for a long evaluation."""
    duration = getattr(evaluation_manager, "duration", None)
    if (
        stopping is not None
        and stopping_waits_for_evaluations
        and isinstance(duration, datetime.timedelta)
        and duration > datetime.timedelta(0)
    ):
        logger.warning(
            "stopping_waits_for_evaluations=True: each evaluated round waits until its "
            "evaluation's duration (%s) is over; give the EvaluationManager "
            "duration=timedelta(0) to decide after one evaluation round",
            duration,
        )


def _check_arguments(**arguments: Any) -> int | datetime.timedelta:
    """Validate ``train_model``'s arguments; returns the evaluation periodicity."""
    check_interface(
        "train_process",
        arguments["train_process"],
        "LearningProcess",
        ["initialize", "next", "get_model_weights", "set_model_weights"],
    )
    check_interface(
        "train_data_source", arguments["train_data_source"], "FederatedDataSource", ["iterator"]
    )
    check_int("train_per_round_clients", arguments["train_per_round_clients"], minimum=1)
    check_int("train_total_rounds", arguments["train_total_rounds"], minimum=1)
    check_int("seed", arguments["seed"], minimum=0)
    check_interface(
        "program_state_manager",
        arguments["program_state_manager"],
        "ProgramStateManager",
        ["save", "load_latest"],
    )
    check_interface(
        "model_output_manager", arguments["model_output_manager"], "ReleaseManager", ["release"]
    )
    check_interface(
        "train_metrics_manager",
        arguments["train_metrics_manager"],
        "ReleaseManager",
        ["release"],
        allow_none=True,
    )
    check_interface(
        "evaluation_manager",
        arguments["evaluation_manager"],
        "EvaluationManager",
        ["resume_from_previous_state", "start_evaluation", "wait_for_evaluations_to_finish"],
        allow_none=True,
    )
    check_interface(
        "stopping",
        arguments["stopping"],
        "StoppingPolicy",
        ["before_round", "after_evaluation"],
        allow_none=True,
    )
    check_bool("stopping_waits_for_evaluations", arguments["stopping_waits_for_evaluations"])
    check_interface("clock", arguments["clock"], "Clock", ["now"], allow_none=True)
    periodicity = arguments["evaluation_periodicity"]
    if isinstance(periodicity, datetime.timedelta):
        return check_timedelta("evaluation_periodicity", periodicity, above=datetime.timedelta(0))
    if isinstance(periodicity, bool) or not isinstance(periodicity, int):
        raise TypeError(
            "evaluation_periodicity must be an int >= 1 (rounds) or a timedelta > 0, "
            f"got {describe(periodicity)}"
        )
    return check_int("evaluation_periodicity", periodicity, minimum=1)
