"""What ``train_model`` does with a trained round: save its checkpoint, then release it."""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import logging
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING

import anyio
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream

from managers.clock import Clock
from managers.release.base import ReleaseManager
from managers.state.base import ProgramStateManager
from managers.values import materialize
from managers.writes import WriteBatch
from programlogic.checkpoint import Checkpoint
from programlogic.process import LearningProcess, as_async

if TYPE_CHECKING:
    from programlogic.training import EvaluationManagerProtocol

__all__ = ["Cadence", "Persister", "evaluations_stopped_on_failure"]

# Its messages are train_model's: users find them under that module's name.
logger = logging.getLogger("programlogic.training")


@dataclasses.dataclass
class Cadence:
    """Which rounds are checkpointed: every ``every``-th round since the last save, once
    at least ``interval`` has passed on ``clock`` since it (when given); and always the
    initial state, the last round and a round a stopping policy made the last.

    ``saved_round`` and ``last_save`` are the newest checkpoint's round and time.
    """

    clock: Clock
    total_rounds: int
    every: int = 1
    interval: datetime.timedelta | None = None
    saved_round: int = -1
    last_save: datetime.datetime | None = None

    @property
    def every_round(self) -> bool:
        """Whether every round is checkpointed."""
        return self.every == 1 and self.interval is None

    def due(self, checkpoint: Checkpoint) -> bool:
        """Whether ``checkpoint`` is saved."""
        round_num = checkpoint.round_num
        if self.every_round or round_num == 0:
            return True
        if self.is_last(checkpoint):
            return True
        if round_num - self.saved_round < self.every:
            return False
        return (
            self.interval is None
            or self.last_save is None
            or (self.clock.now() - self.last_save >= self.interval)
        )

    def is_last(self, checkpoint: Checkpoint) -> bool:
        """Whether ``checkpoint``'s round is the last: the total's, or a stopped one."""
        return checkpoint.stop_reason is not None or checkpoint.round_num >= self.total_rounds

    def saved(self, round_num: int) -> None:
        """Round ``round_num`` is the newest checkpoint, as of now."""
        self.saved_round = round_num
        self.last_save = self.clock.now()


@dataclasses.dataclass
class Persister:
    """Saves the checkpoints its cadence asks for, in order, and releases every round.

    A round's metrics go to ``metrics_manager`` with the round as key, and its
    evaluation is started when it is due, after the round's save when it is saved.
    ``persisted_round`` is the newest round whose save (if any) and releases are done.
    """

    process: LearningProcess
    state_manager: ProgramStateManager
    metrics_manager: ReleaseManager | None
    evaluation_manager: EvaluationManagerProtocol | None
    cadence: Cadence
    persisted_round: int = -1
    settled_round: int = -1
    handed_round: int = -1
    _progress: anyio.Event = dataclasses.field(default_factory=anyio.Event)
    _writes: WriteBatch = dataclasses.field(default_factory=WriteBatch)
    _gathered_rounds: int = 0

    async def persist(self, checkpoint: Checkpoint) -> None:
        """Save ``checkpoint`` when the cadence asks for it, then make its releases.

        File managers' writes go through one :class:`~managers.writes.WriteBatch`: a
        save is flushed at once (a worker-thread call that first makes the writes of the
        releases gathered before it), and the releases a file manager gathers wait for
        the next save's flush, or until more than ``cadence.every`` rounds' have
        gathered; the last round's are flushed at once. A crash replays the rounds after
        the newest save and makes their releases again; a manager that does not gather
        writes releases at once, after the round's save is on disk.
        """
        # Only what the process returned can hold value references.
        train_state, metrics = await materialize((checkpoint.train_state, checkpoint.metrics))
        saved = dataclasses.replace(checkpoint, train_state=train_state, metrics=metrics)
        try:
            if self.cadence.due(saved):
                with self._writes.gathering():
                    await self.state_manager.save(saved.to_saved(), saved.round_num)
                await self._flush()
                self.cadence.saved(saved.round_num)
            self.settled_round = saved.round_num
            self._notify()
            if saved.round_num > 0 and self.metrics_manager is not None:
                with self._writes.gathering():
                    await self.metrics_manager.release(saved.metrics, saved.round_num)
                self._gathered_rounds += 1
            if self._gathered_rounds > self.cadence.every or self.cadence.is_last(saved):
                await self._flush()
        except BaseException:
            self._writes.drop()
            raise
        if saved.evaluation_due:
            await self.start_evaluation(saved)
        self._persisted(saved.round_num)

    async def persist_each(self, checkpoints: MemoryObjectReceiveStream[Checkpoint]) -> None:
        """Persist the checkpoints in the order they arrive, until the sending end closes.

        Writes gathered for rounds after the newest checkpoint are dropped when this
        ends early (a failure, a cancellation): the rerun makes them again.
        """
        try:
            async for checkpoint in checkpoints:
                await self.persist(checkpoint)
        finally:
            self._writes.drop()

    async def hand_over(
        self, to_persister: MemoryObjectSendStream[Checkpoint], checkpoint: Checkpoint
    ) -> None:
        """Send ``checkpoint`` to :meth:`persist_each`, which persists it in turn."""
        await to_persister.send(checkpoint)
        self.handed_round = checkpoint.round_num

    @contextlib.asynccontextmanager
    async def saving_trained_rounds(self) -> AsyncIterator[None]:
        """On a failure in the block, wait until every round handed over is saved (or, under
        a cadence, passed over), then let the failure through: a round already trained
        is not lost to a later one's failure.

        Its releases are left to the rerun, which makes them again. Cancellation is not
        waited on.
        """
        try:
            yield
        except Exception:
            while self.settled_round < self.handed_round:
                await self._progress.wait()
            raise

    async def release_again(self, checkpoint: Checkpoint) -> None:
        """Make the releases of ``checkpoint``, saved by an earlier run, once more."""
        self.settled_round = checkpoint.round_num
        self.cadence.saved(checkpoint.round_num)
        await self._release(checkpoint)
        self._persisted(checkpoint.round_num)

    async def wait_until_persisted(self, round_num: int) -> None:
        """Wait until round ``round_num`` (or a later one) is saved and released."""
        while self.persisted_round < round_num:
            await self._progress.wait()

    async def start_evaluation(self, checkpoint: Checkpoint) -> None:
        """Start evaluating the round of ``checkpoint``; a no-op if started before."""
        if self.evaluation_manager is None:
            return
        get_weights = as_async(self.process.get_model_weights)
        weights = await materialize(await get_weights(checkpoint.train_state))
        await self.evaluation_manager.start_evaluation(
            checkpoint.round_num, checkpoint.last_evaluation, weights
        )

    async def _release(self, checkpoint: Checkpoint) -> None:
        """Release a saved round's metrics and start its evaluation if it was due."""
        if checkpoint.round_num > 0 and self.metrics_manager is not None:
            await self.metrics_manager.release(checkpoint.metrics, checkpoint.round_num)
        if checkpoint.evaluation_due:
            await self.start_evaluation(checkpoint)

    async def _flush(self) -> None:
        self._gathered_rounds = 0
        await self._writes.flush()

    def _persisted(self, round_num: int) -> None:
        self.persisted_round = round_num
        self._notify()

    def _notify(self) -> None:
        self._progress.set()
        self._progress = anyio.Event()


@contextlib.asynccontextmanager
async def evaluations_stopped_on_failure(
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
