"""What ``train_model`` does with a trained round: save its checkpoint, then release it."""

from __future__ import annotations

import contextlib
import dataclasses
import logging
from collections.abc import AsyncIterator
from typing import Any

import anyio
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream

from managers.release.base import ReleaseManager
from managers.state.base import ProgramStateManager
from managers.values import materialize
from managers.writes import WriteBatch, preparer
from programlogic.process import LearningProcess, as_async
from programlogic.training._cadence import Cadence
from programlogic.training._evaluations import EvaluationManagerProtocol
from programlogic.training.checkpoint import Checkpoint

__all__ = ["Persister"]

logger = logging.getLogger(__name__)


@dataclasses.dataclass
class Persister:
    """Saves the checkpoints the cadence marked, in order, and releases every round.

    A round's metrics go to ``metrics_manager`` with the round as key, after the
    round's save, and its evaluation is started when it is due, after both.
    ``settled_round`` is the newest round whose save (if any) is made.
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

    async def persist(self, checkpoint: Checkpoint) -> None:
        """Save ``checkpoint`` when it is ``save_due``, then make its releases.

        Every save and release has been made when this returns. Write batching, for
        speed: the managers that prepare their writes (``prepare_save`` /
        ``prepare_release``, see :mod:`managers.writes`) hand them over, and the round's
        prepared writes are made in one worker-thread call, the save's first; a manager
        that does not prepare is awaited in turn, a release only once the save is made.
        """
        # Only what the process returned can hold value references.
        train_state, metrics = await materialize((checkpoint.train_state, checkpoint.metrics))
        saved = dataclasses.replace(checkpoint, train_state=train_state, metrics=metrics)
        round_num = saved.round_num
        try:
            if saved.save_due:
                await self._write(self.state_manager, "save", saved.to_saved(), round_num)
            if round_num > 0 and self.metrics_manager is not None:
                await self._write(self.metrics_manager, "release", saved.metrics, round_num)
            await self._writes.flush()
        except BaseException:
            self._writes.drop()
            raise
        self._settled(round_num)
        if saved.evaluation_due:
            await self.start_evaluation(saved)
        self._persisted(round_num)

    async def _write(self, manager: Any, method: str, value: Any, key: int) -> None:
        """``manager.{method}(value, key)``, or its write prepared into the round's batch
        when the manager prepares its writes.

        A manager awaited in turn first has the writes prepared before it made: a
        release never reaches a manager before the round's save is made.
        """
        prepare = preparer(manager, method)
        if prepare is None:
            await self._writes.flush()
            await getattr(manager, method)(value, key)
            return
        write = await prepare(value, key)
        if write is not None:
            self._writes.add(write)

    def _settled(self, round_num: int) -> None:
        self.settled_round = round_num
        self._notify()

    async def persist_each(self, checkpoints: MemoryObjectReceiveStream[Checkpoint]) -> None:
        """Persist the checkpoints in the order they arrive, until the sending end closes."""
        async for checkpoint in checkpoints:
            await self.persist(checkpoint)

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
        self.cadence.saved(checkpoint.round_num, checkpoint.trained_at)
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

    def _persisted(self, round_num: int) -> None:
        self.persisted_round = round_num
        self._notify()

    def _notify(self) -> None:
        self._progress.set()
        self._progress = anyio.Event()
