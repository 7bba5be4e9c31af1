"""``train_model``: the program logic that trains a model round by round, resumably."""

from __future__ import annotations

import dataclasses
import datetime
import logging
import os
from collections.abc import Sequence
from typing import Any

import anyio
from anyio.streams.memory import MemoryObjectSendStream

from managers.clock import Clock, SystemClock
from managers.release.base import ReleaseManager
from managers.state.base import ProgramStateManager
from managers.taskgroups import task_group
from programlogic.context import get_context
from programlogic.data import ClientHandle, FederatedDataSource, FederatedDataSourceIterator
from programlogic.process import LearningProcess, LearningProcessOutput, as_async
from programlogic.stopping import StoppingPolicy, StopReason
from programlogic.training._cadence import Cadence
from programlogic.training._checks import (
    check_arguments,
    check_cadence,
    check_output,
    warn_of_long_waits,
)
from programlogic.training._configuration import describe_run
from programlogic.training._evaluations import (
    EvaluationManagerProtocol,
    evaluations_stopped_on_failure,
)
from programlogic.training._persister import Persister
from programlogic.training._privacy import NO_PRIVACY, NoPrivacy, PrivateRun, run_privacy
from programlogic.training._resume import load_resumable
from programlogic.training._stopping import Stopper
from programlogic.training.checkpoint import Checkpoint

__all__ = [
    "TrainingResult",
    "final_model_key",
    "train_model",
]

logger = logging.getLogger(__name__)


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
    resume_with_changed_configuration: bool = False,
    checkpoint_every: int = 1,
    checkpoint_interval: datetime.timedelta | None = None,
    privacy_ledger: str | os.PathLike[str] | None = None,
    privacy_spent_acknowledged: float | None = None,
) -> TrainingResult:
    """Train ``train_process`` for ``train_total_rounds`` rounds, resuming where it stopped.

    Runs in the current federated context (``async with LocalContext():``). Every
    argument is checked before anything starts: a wrong type is a ``TypeError``, a
    wrong value a ``ValueError``, each naming the argument.

    A round ``r`` (1 <= r <= ``train_total_rounds``):

    1. selects ``train_per_round_clients`` clients, a pure function of ``(seed, r)``;
    2. runs ``train_process.next``;
    3. saves the program state as version ``r``: a
       :class:`~programlogic.training.checkpoint.Checkpoint` of the train state, the round, the
       sampler's description, the evaluation clock, and the round's metrics;
    4. releases the metrics to ``train_metrics_manager`` with key ``r``;
    5. starts an evaluation of the round's model when it is due (every
       ``evaluation_periodicity`` rounds, or once that much time has passed on
       ``clock``; the initial model and the last round are always evaluated).

    Steps 3-5 of a round overlap step 2 of the next round, but at most one save is in
    flight and a round's releases follow its save. Saves and releases are made as
    their managers promise, whoever wraps them: a round counts as saved once its
    save's write is made, and a wrapper's ``save`` returns after the write it wraps.
    Managers that prepare their writes (``prepare_save`` / ``prepare_release``; see
    :mod:`managers.writes`) have a round's writes made in one worker-thread call. The
    initial state is saved as
    version 0 before round 1 starts. After the last round ``n``, the final model weights
    are released to ``model_output_manager`` with key ``final_model_key(n)``, and
    ``train_model`` waits for the evaluations to finish.

    Checkpoint cadence: with ``checkpoint_every=N`` a round is saved (step 3) only ``N``
    rounds after the last saved one, and with ``checkpoint_interval`` only once that much
    time has passed on ``clock`` since the last save (both, when both are given); the
    initial state, the last round and a round a stopping policy made the last are always
    saved. Which rounds are saved is decided as each round's ``next`` returns, from
    ``clock`` read then, and the time of the newest save is kept in the checkpoint, so a
    resumed run measures the interval from it. Every round's metrics are still released and
    its evaluation started. A crash loses the rounds after the newest checkpoint, which a
    rerun computes again (sampling and randomness are functions of ``seed`` and the round)
    and releases again under the same keys: the outputs are those of an uninterrupted run.
    That needs a context that replays rounds exactly (``FederatedContext.replays_rounds``;
    not a ``RayContext`` with a ``round_deadline``) and an ``int``
    ``evaluation_periodicity``: otherwise a cadence is refused with a ``ValueError``.

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
    before any evaluation is resumed. :class:`~programlogic.exceptions.ResumeError`
    names what differs when it was written with another seed, number of clients per
    round or sampler (the iterator's ``describe()``, opaque; for a dict, the differing
    keys), when its train state does not fit the process's initial state (the first
    path whose presence, shape or dtype differs), or when the configuration the process
    and the data source describe (their optional ``describe_configuration()``, recorded
    in every checkpoint) differs: that one, and only that one, may change on purpose
    with ``resume_with_changed_configuration=True``; the new one is saved from then on.
    A checkpoint in a format this code does not read (written by a newer version)
    raises :class:`~programlogic.exceptions.CheckpointFormatError`. Then the evaluations in
    flight are resumed, the loaded round's metrics are released again and its
    evaluation started again (releases are idempotent by key, starting an evaluation
    twice is a no-op), so a crash right after a save loses nothing; training continues
    with the next round. A larger ``train_total_rounds`` than before continues
    training; if the checkpoint already holds the last round, only the final release
    (and evaluation) is made sure of.

    Differential privacy: a process whose ``privacy_accounting()`` returns a
    :class:`~programlogic.privacy.PrivacyAccounting` (one built with ``dp_mean``) is a
    DP run. A :class:`~programlogic.privacy.PrivacyBudgetStopping` (in ``stopping`` or
    an ``AnyOf``) of another mechanism or delta than the aggregator's, or given to a
    process without noise, is refused before round 1 with a ``ValueError`` naming both
    values: build it with the aggregator's ``budget_stopping(epsilon)``. Each round is
    recorded, before its save, in a :class:`~programlogic.privacy_ledger.PrivacyLedger`
    at ``privacy_ledger``, by default beside a file state manager's directory
    (:func:`~programlogic.privacy_ledger.ledger_path_beside`; a DP run with neither is
    refused before round 1). Every start cross-checks it with the checkpoint:
    :class:`~programlogic.exceptions.PrivacySpentError`, naming the epsilon spent at
    delta and the rounds, refuses to start over while it holds rounds (the state
    deleted, or every version damaged) unless ``privacy_spent_acknowledged`` is that
    epsilon (then the budget and the released epsilon count it), and refuses a
    checkpoint whose aggregator counts other rounds than its round (an edited one).
    The ledger survives losing the program state; it does not survive deleting the
    run's root (the ledger with it), nor does it see a new root trained on the same data.

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
    periodicity = check_arguments(
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
        resume_with_changed_configuration=resume_with_changed_configuration,
        checkpoint_every=checkpoint_every,
        checkpoint_interval=checkpoint_interval,
        privacy_ledger=privacy_ledger,
        privacy_spent_acknowledged=privacy_spent_acknowledged,
    )
    iterator = train_data_source.iterator(seed)
    try:
        iterator.select(train_per_round_clients, 1)
    except ValueError as error:
        raise ValueError(f"train_per_round_clients={train_per_round_clients}: {error}") from None
    clock = clock or SystemClock()
    cadence = Cadence(clock, train_total_rounds, checkpoint_every, checkpoint_interval)
    check_cadence(cadence, get_context(), periodicity)
    warn_of_long_waits(stopping, stopping_waits_for_evaluations, evaluation_manager)
    privacy = run_privacy(
        process=train_process,
        state_manager=program_state_manager,
        stopping=stopping,
        ledger=privacy_ledger,
        acknowledged=privacy_spent_acknowledged,
        clock=clock,
    )
    persister = Persister(
        process=train_process,
        state_manager=program_state_manager,
        metrics_manager=train_metrics_manager,
        evaluation_manager=evaluation_manager,
        cadence=cadence,
    )
    program = _Program(
        process=train_process,
        data_source=train_data_source,
        allow_changed_configuration=resume_with_changed_configuration,
        iterator=iterator,
        sampler=iterator.describe(),
        per_round_clients=train_per_round_clients,
        total_rounds=train_total_rounds,
        state_manager=program_state_manager,
        model_output_manager=model_output_manager,
        evaluation_manager=evaluation_manager,
        periodicity=periodicity,
        clock=clock,
        persister=persister,
        stopper=Stopper(
            stopping=stopping,
            waits=stopping_waits_for_evaluations,
            total_rounds=train_total_rounds,
            evaluation_manager=evaluation_manager,
            persister=persister,
            clock=clock,
        ),
        privacy=privacy,
    )
    async with privacy:  # a DP run's ledger, open (and locked) for the whole run
        return await program.run()


@dataclasses.dataclass
class _Program:
    """One ``train_model`` call: its arguments, and the steps of a run over them."""

    process: LearningProcess
    data_source: FederatedDataSource
    allow_changed_configuration: bool
    iterator: FederatedDataSourceIterator
    sampler: Any
    per_round_clients: int
    total_rounds: int
    state_manager: ProgramStateManager
    model_output_manager: ReleaseManager
    evaluation_manager: EvaluationManagerProtocol | None
    periodicity: int | datetime.timedelta
    clock: Clock
    persister: Persister
    stopper: Stopper
    configuration: dict[str, Any] | None = None
    privacy: PrivateRun | NoPrivacy = NO_PRIVACY

    async def run(self) -> TrainingResult:
        """Train from the initial state or the newest checkpoint to the last round."""
        initial_state = await as_async(self.process.initialize)()
        self.configuration = await anyio.to_thread.run_sync(
            describe_run, self.process, self.data_source
        )
        loaded, resumed_from = await load_resumable(
            self.state_manager,
            initial_state,
            total_rounds=self.total_rounds,
            sampler=self.sampler,
            per_round_clients=self.per_round_clients,
            configuration=self.configuration,
            allow_changed_configuration=self.allow_changed_configuration,
        )
        await self.privacy.check_start(initial_state, loaded)  # a DP run's ledger, checked
        # The persister saves and releases one round while the loop computes the next; an
        # unbuffered stream holds the loop back until the previous round is taken. This
        # method owns the receiving end: it stays open when the persister fails, so the
        # loop, waiting to hand over a round, is cancelled instead of told the stream broke.
        send, receive = anyio.create_memory_object_stream[Checkpoint](0)
        stop_evaluations_on_failure = evaluations_stopped_on_failure(self.evaluation_manager)
        async with send, receive, stop_evaluations_on_failure, task_group() as group:
            if self.evaluation_manager is not None:
                await self.evaluation_manager.resume_from_previous_state()
            first = await self._start(initial_state, loaded)
            group.start_soon(self.persister.persist_each, receive, name="persist rounds")
            async with send, self.persister.saving_trained_rounds():
                last = await self._train_rounds(first, send)
            await self.persister.wait_until_persisted(last.round_num)
            await self._release_final(last)
        if self.evaluation_manager is not None:
            await self.evaluation_manager.wait_for_evaluations_to_finish()
        if last.stop_reason is not None:
            reason = last.stop_reason
        elif first.round_num >= self.total_rounds:
            reason = StopReason.ALREADY_COMPLETED
        else:
            reason = StopReason.COMPLETED
        return TrainingResult(
            state=last.train_state,
            round_num=last.round_num,
            stop_reason=reason,
            resumed_from=resumed_from,
        )

    async def _start(self, initial_state: Any, loaded: Checkpoint | None) -> Checkpoint:
        """The round training continues from: round 0, saved now, or the loaded round,
        released again."""
        if loaded is None:
            logger.info("starting training from the initial state")
            checkpoint = self._checkpoint(initial_state, 0, None, last_evaluation=None)
            await self.stopper.before_round(checkpoint)
            self.persister.cadence.decide(checkpoint)
            await self.persister.persist(checkpoint)
            return checkpoint
        logger.info("resuming training after round %d", loaded.round_num)
        await self.stopper.before_round(loaded)  # not saved again: its version exists
        await self.persister.release_again(loaded)
        return loaded

    async def _train_rounds(
        self, checkpoint: Checkpoint, to_persister: MemoryObjectSendStream[Checkpoint]
    ) -> Checkpoint:
        """Train the rounds after ``checkpoint``'s, handing each to the persister; returns
        the last round's checkpoint."""
        for round_num in range(checkpoint.round_num + 1, self.total_rounds + 1):
            if checkpoint.stop_reason is not None:
                break
            clients = self._select(round_num)
            output = await self._train_round(checkpoint.train_state, clients)
            output = await self.privacy.record(round_num, output)  # before the round's save
            checkpoint = self._checkpoint(
                output.state, round_num, output.metrics, checkpoint.last_evaluation
            )
            await self.stopper.after_round(checkpoint)
            self.persister.cadence.decide(checkpoint)
            await self.persister.hand_over(to_persister, checkpoint)
        return checkpoint

    def _select(self, round_num: int) -> Sequence[ClientHandle]:
        """The clients of round ``round_num``."""
        return self.iterator.select(self.per_round_clients, round_num)

    async def _train_round(
        self, state: Any, clients: Sequence[ClientHandle]
    ) -> LearningProcessOutput:
        """Run the learning process's ``next`` on ``state`` with ``clients``."""
        return check_output(await as_async(self.process.next)(state, clients))

    def _checkpoint(
        self, state: Any, round_num: int, metrics: Any, last_evaluation: int | None
    ) -> Checkpoint:
        """The checkpoint of ``round_num``, trained now; decides whether it is evaluated."""
        trained_at = self.clock.now()
        due = False
        if self.evaluation_manager is not None:
            now = int(trained_at.timestamp())
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
        return Checkpoint(
            train_state=state,
            round_num=round_num,
            metrics=metrics,
            sampler=self.sampler,
            per_round_clients=self.per_round_clients,
            evaluation_due=due,
            last_evaluation=last_evaluation,
            configuration=self.configuration,
            trained_at=trained_at,
        )

    async def _release_final(self, checkpoint: Checkpoint) -> None:
        """Release the final model: the weights of ``checkpoint``'s round."""
        weights = await as_async(self.process.get_model_weights)(checkpoint.train_state)
        await self.model_output_manager.release(weights, final_model_key(checkpoint.round_num))
