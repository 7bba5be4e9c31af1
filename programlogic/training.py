"""``train_model``: the program logic that trains a model round by round, resumably."""

from __future__ import annotations

import dataclasses
import datetime
import enum
import logging
from typing import Any, Protocol, runtime_checkable

import anyio
from anyio.streams.memory import MemoryObjectReceiveStream

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
from programlogic.clock import Clock, SystemClock
from programlogic.context import get_context
from programlogic.data import FederatedDataSource
from programlogic.exceptions import ResumeError
from programlogic.process import LearningProcess, as_async
from programlogic.stopping import StoppingPolicy
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
    """What ``train_model`` needs of an evaluation manager."""

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


class StopReason(enum.StrEnum):
    """Why ``train_model`` returned."""

    COMPLETED = "completed"
    """This run trained up to ``train_total_rounds``."""
    ALREADY_COMPLETED = "already_completed"
    """The program state already held the last round; nothing was trained."""
    EARLY_STOPPED = "early_stopped"
    """The stopping policy stopped training before ``train_total_rounds``."""


@dataclasses.dataclass(frozen=True)
class TrainingResult:
    """What ``train_model`` returns.

    ``state``: the train state after the last round; ``round_num``: that round;
    ``stop_reason``: why training stopped; ``resumed_from``: the round loaded from
    the program state manager, or ``None`` when the run started fresh.
    """

    state: Any
    round_num: int
    stop_reason: StopReason
    resumed_from: int | None


def final_model_key(total_rounds: int) -> str:
    """The key under which ``train_model`` releases the final model weights."""
    return f"final_training_checkpoint_round_{total_rounds}"


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
    version 0 before round 1 starts. After the last round, the final model weights are
    released to ``model_output_manager`` with key :func:`final_model_key`, and
    ``train_model`` waits for the evaluations to finish.

    Early stopping: with a ``stopping`` policy (:mod:`programlogic.stopping`), after
    each round's ``next`` the policy is asked whether to stop; if so, that round is the
    last: it is saved (marked as stopped, so a rerun does not train on), evaluated,
    and its model released as the final one. With
    ``stopping_waits_for_evaluations=True``, every evaluation started before the round
    finishes before the policy is asked, which makes the stop round reproducible
    across restarts at the price of the overlap between evaluation and training.

    Resuming: the newest version of ``program_state_manager`` is loaded; its round's
    metrics are released again and its evaluation started again (releases are
    idempotent by key, starting an evaluation twice is a no-op), so a crash right after
    a save loses nothing; training continues with the next round. A checkpoint written
    with another seed, number of clients per round or set of clients raises
    :class:`~programlogic.exceptions.ResumeError` naming what differs. A larger
    ``train_total_rounds`` than before continues training; if the checkpoint already
    holds the last round, only the final release (and evaluation) is made sure of.

    Errors: an exception from the process, a save, a release or an evaluation fails
    ``train_model`` with that same exception (several at once as an
    ``ExceptionGroup``) and cancels the rest. Cancelling ``train_model`` cancels its
    saves and releases; a save already writing finishes first (file managers write
    atomically), so the newest complete checkpoint stays loadable.
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
    program = _Program(
        process=train_process,
        state_manager=program_state_manager,
        metrics_manager=train_metrics_manager,
        evaluation_manager=evaluation_manager,
        periodicity=periodicity,
        total_rounds=train_total_rounds,
        clock=clock or SystemClock(),
        config={
            "sampler": iterator.describe(),
            "per_round_clients": train_per_round_clients,
        },
    )

    if evaluation_manager is not None:
        await evaluation_manager.resume_from_previous_state()
    initial_state = await as_async(train_process.initialize)()
    template = {"train_state": initial_state}
    loaded, loaded_round = await program_state_manager.load_latest(template)
    resumed_from = None if loaded is None else loaded_round

    async with task_group() as group:
        if loaded is None:
            logger.info("starting training from the initial state")
            checkpoint = program.checkpoint(initial_state, 0, None, last_evaluation=None)
            await program.persist(checkpoint)
            state, first_round = initial_state, 1
        else:
            program.check_resumable(loaded, loaded_round)
            logger.info("resuming training after round %d", loaded_round)
            checkpoint = loaded
            state, first_round = loaded["train_state"], loaded_round + 1
            await program.release_round(checkpoint)
            program.persisted_round = loaded_round
        last_evaluation = checkpoint["evaluation"]["last_time"]
        stopped = bool(checkpoint.get("stopped"))
        last_round = checkpoint["round"]

        # The persister saves and releases one round while the loop computes the next;
        # an unbuffered stream holds the loop back until the previous round is taken.
        next_round = as_async(train_process.next)
        send, receive = anyio.create_memory_object_stream[dict[str, Any]](0)
        group.start_soon(program.persist_each, receive, name="persist rounds")
        async with send:
            for round_num in range(first_round, train_total_rounds + 1):
                if stopped:
                    break
                clients = iterator.select(train_per_round_clients, round_num)
                output = await next_round(state, clients)
                if not (hasattr(output, "state") and hasattr(output, "metrics")):
                    raise TypeError(
                        "train_process.next must return a LearningProcessOutput(state, "
                        f"metrics), got {type(output).__name__}"
                    )
                state, last_round = output.state, round_num
                if stopping is not None:
                    if stopping_waits_for_evaluations:
                        await program.wait_until_persisted(round_num - 1)
                        if evaluation_manager is not None:
                            await evaluation_manager.wait_for_evaluations_to_finish()
                    stopped = await stopping.should_stop()
                    if stopped:
                        logger.info("the stopping policy stopped training at round %d", round_num)
                checkpoint = program.checkpoint(
                    state, round_num, output.metrics, last_evaluation, stopped=stopped
                )
                last_evaluation = checkpoint["evaluation"]["last_time"]
                await send.send(checkpoint)
        await program.wait_until_persisted(last_round)

        weights = await as_async(train_process.get_model_weights)(state)
        await model_output_manager.release(weights, final_model_key(last_round))

    if evaluation_manager is not None:
        await evaluation_manager.wait_for_evaluations_to_finish()
    if stopped:
        reason = StopReason.EARLY_STOPPED
    elif first_round > train_total_rounds:
        reason = StopReason.ALREADY_COMPLETED
    else:
        reason = StopReason.COMPLETED
    return TrainingResult(
        state=state, round_num=last_round, stop_reason=reason, resumed_from=resumed_from
    )


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
    config: dict[str, Any]
    persisted_round: int = -1
    progress: anyio.Event = dataclasses.field(default_factory=anyio.Event)

    def checkpoint(
        self,
        state: Any,
        round_num: int,
        metrics: Any,
        last_evaluation: int | None,
        *,
        stopped: bool = False,
    ) -> dict[str, Any]:
        """The program state saved for ``round_num``; decides whether it is evaluated."""
        due = False
        if self.evaluation_manager is not None:
            now = int(self.clock.now().timestamp())
            if round_num in (0, self.total_rounds) or stopped:
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
            "stopped": stopped,
            **self.config,
        }

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
        """Persist the checkpoints in the order they arrive."""
        async with checkpoints:
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
        evaluation = checkpoint["evaluation"]
        if evaluation["due"] and self.evaluation_manager is not None:
            get_weights = as_async(self.process.get_model_weights)
            weights = await get_weights(checkpoint["train_state"])
            await self.evaluation_manager.start_evaluation(
                round_num, evaluation["last_time"], weights
            )

    def check_resumable(self, loaded: Any, loaded_round: int) -> None:
        """Raise ResumeError when ``loaded`` was written by another configuration."""
        if not isinstance(loaded, dict) or not {"train_state", "round", "sampler"} <= loaded.keys():
            raise ResumeError(
                f"version {loaded_round} of the program state manager was not written by "
                "train_model; give train_model a state manager of its own"
            )
        if loaded_round > self.total_rounds:
            raise ResumeError(
                f"the program state is at round {loaded_round}, beyond "
                f"train_total_rounds={self.total_rounds}"
            )
        saved_sampler, sampler = loaded["sampler"], self.config["sampler"]
        differences = [
            f"{name}={saved!r} (this run: {current!r})"
            for name, saved, current in [
                ("seed", saved_sampler["seed"], sampler["seed"]),
                (
                    "train_per_round_clients",
                    loaded["per_round_clients"],
                    self.config["per_round_clients"],
                ),
                ("sampling", saved_sampler["sampling"], sampler["sampling"]),
                ("number of clients", saved_sampler["num_clients"], sampler["num_clients"]),
            ]
            if saved != current
        ]
        if (
            saved_sampler["num_clients"] == sampler["num_clients"]
            and saved_sampler["client_ids_sha256"] != sampler["client_ids_sha256"]
        ):
            differences.append("another set of client ids")
        if differences:
            raise ResumeError(
                f"cannot resume from the program state of round {loaded_round}: it was "
                f"written with {', '.join(differences)}"
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
        "stopping", arguments["stopping"], "StoppingPolicy", ["should_stop"], allow_none=True
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
