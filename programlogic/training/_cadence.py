"""Which rounds ``train_model`` checkpoints: the checkpoint cadence."""

from __future__ import annotations

import dataclasses
import datetime

from managers.clock import Clock
from programlogic.training.checkpoint import Checkpoint

__all__ = ["Cadence"]


@dataclasses.dataclass
class Cadence:
    """Which rounds are checkpointed: every ``every``-th round since the last save, once
    at least ``interval`` has passed on ``clock`` since it (when given); and always the
    initial state, the last round and a round a stopping policy made the last.

    The training task decides, as each round's ``next`` returns, from the clock read
    then (:meth:`decide`): which rounds are saved does not depend on when the persister
    gets to them. ``saved_round`` and ``last_save`` are the newest saved round and the
    clock's time when it was decided.
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

    def decide(self, checkpoint: Checkpoint) -> None:
        """Mark ``checkpoint`` saved or not (``save_due``), as of its ``trained_at``."""
        now = checkpoint.trained_at
        checkpoint.save_due = self._due(checkpoint, now)
        if checkpoint.save_due:
            self.saved(checkpoint.round_num, now)

    def _due(self, checkpoint: Checkpoint, now: datetime.datetime) -> bool:
        round_num = checkpoint.round_num
        if self.every_round or round_num == 0 or self.is_last(checkpoint):
            return True
        if round_num - self.saved_round < self.every:
            return False
        if self.interval is None or self.last_save is None:
            return True
        return now - self.last_save >= self.interval

    def is_last(self, checkpoint: Checkpoint) -> bool:
        """Whether ``checkpoint``'s round is the last: the total's, or a stopped one."""
        return checkpoint.stop_reason is not None or checkpoint.round_num >= self.total_rounds

    def saved(self, round_num: int, when: datetime.datetime | None) -> None:
        """Round ``round_num`` is the newest checkpoint, decided at ``when`` (now when
        ``None``: a checkpoint written before the time was recorded)."""
        self.saved_round = round_num
        self.last_save = when if when is not None else self.clock.now()
