"""Every built-in stopping policy keeps the stopping-policy contract."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest

from managers import FileProgramStateManager, MemoryProgramStateManager
from programlogic.stopping import AnyOf, PatienceStopping, SpeechTrainerStopping, StoppingPolicy
from programlogic.testing.contracts import StoppingPolicyContract

# Patience 2 and the speech trainer's rule over 3 losses both stop on the fifth: it is
# the second result after the best (3.0), and above the two before it.
RISING = (5.0, 4.0, 3.0, 3.5, 3.6)


class TestPatienceStopping(StoppingPolicyContract):
    stop_values = RISING

    @pytest.fixture
    def make_policy(self) -> Callable[[], StoppingPolicy]:
        state = MemoryProgramStateManager()
        return lambda: PatienceStopping(self.metric, state, patience=2)


class TestPatienceStoppingOnAnAccuracy(StoppingPolicyContract):
    stop_values = (0.5, 0.6, 0.65, 0.651, 0.64)
    metric = "client_work/eval/total_rounds_metrics/sparse_categorical_accuracy"

    @pytest.fixture
    def make_policy(self) -> Callable[[], StoppingPolicy]:
        state = MemoryProgramStateManager()
        return lambda: PatienceStopping(self.metric, state, patience=2, mode="max", min_delta=0.01)


class TestPatienceStoppingOnFiles(StoppingPolicyContract):
    stop_values = RISING

    @pytest.fixture
    async def make_policy(self, tmp_path: Path) -> AsyncIterator[Callable[[], StoppingPolicy]]:
        async with FileProgramStateManager(tmp_path, keep_total=2) as state:
            yield lambda: PatienceStopping(self.metric, state, patience=2)


class TestSpeechTrainerStopping(StoppingPolicyContract):
    stop_values = RISING

    @pytest.fixture
    def make_policy(self) -> Callable[[], StoppingPolicy]:
        state = MemoryProgramStateManager()
        return lambda: SpeechTrainerStopping(self.metric, state, window=3)


class TestSpeechTrainerStoppingOnAFlatLoss(StoppingPolicyContract):
    stop_values = (5.0, 4.0, 3.0, 3.0002, 3.0001)

    @pytest.fixture
    def make_policy(self) -> Callable[[], StoppingPolicy]:
        state = MemoryProgramStateManager()
        return lambda: SpeechTrainerStopping(self.metric, state, window=3)


class TestAnyOf(StoppingPolicyContract):
    stop_values = RISING

    @pytest.fixture
    def make_policy(self) -> Callable[[], StoppingPolicy]:
        patience, speech = MemoryProgramStateManager(), MemoryProgramStateManager()
        return lambda: AnyOf(
            PatienceStopping(self.metric, patience, patience=3),
            SpeechTrainerStopping(self.metric, speech, window=3),
        )
