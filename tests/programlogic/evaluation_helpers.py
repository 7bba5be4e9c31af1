"""An evaluation manager for tests of when train_model starts evaluations."""

from __future__ import annotations

from typing import Any


class RecordingEvaluations:
    """Records the rounds whose evaluation started, with their start time."""

    def __init__(self) -> None:
        self.started: dict[int, int] = {}

    async def resume_from_previous_state(self) -> None:
        pass

    async def start_evaluation(
        self, train_round: int, start_timestamp: int, model_weights: Any
    ) -> None:
        self.started.setdefault(train_round, start_timestamp)

    async def wait_for_evaluations_to_finish(self) -> None:
        pass
