"""Fakes for testing program logic: a context that plays faults, a process, a data
source, a clock, a crashing manager.

They are deterministic and fast, run in any federated context, and are what this
library's own tests use. :class:`FakeContext` is a federated context whose fault plan
(:mod:`programlogic.testing.faults`) makes clients fail or drop out, loses the cluster
or makes calls take time on a :class:`FakeClock`. Example, a user's test that their
program resumes::

    async def test_my_program_resumes():
        state = MemoryProgramStateManager()
        async with LocalContext():
            with pytest.raises(SimulatedCrash):
                await my_program(CrashingStateManager(state, crash_on_version=3))
            await my_program(state)
        assert (await state.get_versions())[-1] == 10
"""

from __future__ import annotations

import datetime
from collections.abc import Sequence
from typing import Any

import numpy as np

from managers.state.base import ProgramStateManager, Retention
from managers.validation import (
    check_bool,
    check_int,
    check_interface,
    check_number,
    check_timedelta,
    check_type,
)
from programlogic.context import get_context
from programlogic.data import ClientHandle, InMemoryDataSource, Sampling
from programlogic.process import LearningProcessOutput
from programlogic.testing._fake_context import CallRecord, FakeContext
from programlogic.testing.faults import (
    DropClients,
    FailClient,
    Fault,
    LoseCluster,
    SimulatedCrash,
    SlowCall,
)

__all__ = [
    "CallRecord",
    "CrashingStateManager",
    "DropClients",
    "FailClient",
    "FakeClock",
    "FakeContext",
    "FakeDataSource",
    "FakeEvaluationProcess",
    "FakeLearningProcess",
    "Fault",
    "LoseCluster",
    "SimulatedCrash",
    "SlowCall",
]


class FakeDataSource(InMemoryDataSource):
    """``num_clients`` clients named ``client_0``, ``client_1``, ... with numeric data.

    Client ``i`` holds an array of shape ``(examples_per_client, dim)`` drawn from a
    normal distribution around ``i`` with NumPy's generator seeded ``[seed, i]``.
    """

    def __init__(
        self,
        num_clients: int = 10,
        *,
        examples_per_client: int = 5,
        dim: int = 2,
        seed: int = 0,
        sampling: Sampling | str = Sampling.UNIFORM,
    ) -> None:
        check_int("num_clients", num_clients, minimum=1)
        check_int("examples_per_client", examples_per_client, minimum=1)
        check_int("dim", dim, minimum=1)
        check_int("seed", seed, minimum=0)
        clients = {
            f"client_{i}": np.random.default_rng([seed, i]).normal(
                loc=float(i), size=(examples_per_client, dim)
            )
            for i in range(num_clients)
        }
        super().__init__(clients, sampling=sampling)


class FakeLearningProcess:
    """A learning process whose state and metrics are a deterministic function of its inputs.

    State: ``{"weights": float64 array of shape (dim,), "rounds": int}``. A round moves
    the weights toward the example-weighted mean of the clients' data by
    ``learning_rate``; the metrics are ``client_work/train/loss`` (the mean squared
    distance of the clients' means to the weights before the step) and
    ``client_work/train/num_examples``. Client work runs through the current federated
    context's ``map_clients``, so a fake round exercises the backend too.

    With a ``clock`` (a :class:`FakeClock`) and ``round_duration``, every round
    advances the clock, as if training took that long.
    """

    def __init__(
        self,
        *,
        dim: int = 2,
        learning_rate: float = 0.5,
        clock: FakeClock | None = None,
        round_duration: datetime.timedelta | None = None,
    ) -> None:
        check_int("dim", dim, minimum=1)
        check_number("learning_rate", learning_rate, minimum=0)
        check_interface("clock", clock, "Clock", ["now", "advance"], allow_none=True)
        check_timedelta(
            "round_duration", round_duration, minimum=datetime.timedelta(0), allow_none=True
        )
        if (clock is None) != (round_duration is None):
            raise ValueError(
                "clock and round_duration must be given together, got "
                f"clock={clock!r} and round_duration={round_duration!r}"
            )
        self.dim = dim
        self.learning_rate = learning_rate
        self._clock = clock
        self._round_duration = round_duration

    def describe_configuration(self) -> dict[str, Any]:
        """Its ``dim`` and ``learning_rate``: what a resumed run must share."""
        return {"dim": self.dim, "learning_rate": self.learning_rate}

    async def initialize(self) -> dict[str, Any]:
        return {"weights": np.zeros(self.dim), "rounds": 0}

    async def next(
        self, state: dict[str, Any], clients: Sequence[ClientHandle]
    ) -> LearningProcessOutput:
        weights = state["weights"]
        results = await get_context().map_clients(_client_mean, self.dim, clients)
        counts = np.array([count for _, count in results], dtype=np.float64)
        means = np.stack([mean for mean, _ in results])
        target = (means * counts[:, None]).sum(axis=0) / counts.sum()
        loss = float(np.mean(np.sum((means - weights) ** 2, axis=1)))
        new_state = {
            "weights": weights + self.learning_rate * (target - weights),
            "rounds": state["rounds"] + 1,
        }
        if self._clock is not None and self._round_duration is not None:
            self._clock.advance(self._round_duration)
        metrics = {"client_work": {"train": {"loss": loss, "num_examples": int(counts.sum())}}}
        return LearningProcessOutput(new_state, metrics)

    async def get_model_weights(self, state: dict[str, Any]) -> np.ndarray:
        return state["weights"]

    async def set_model_weights(self, state: dict[str, Any], weights: Any) -> dict[str, Any]:
        return {**state, "weights": np.asarray(weights, dtype=np.float64)}


class FakeEvaluationProcess(FakeLearningProcess):
    """The evaluation process of :class:`FakeLearningProcess`: measures, never moves.

    A round keeps the weights and releases ``eval/loss``, the mean squared distance of
    the clients' means to the weights, and ``eval/num_examples``. Give it to an
    :class:`~programlogic.EvaluationManager` (or a tuner) for the fake's evaluations.
    """

    async def next(
        self, state: dict[str, Any], clients: Sequence[ClientHandle]
    ) -> LearningProcessOutput:
        output = await super().next(state, clients)
        train = output.metrics["client_work"]["train"]
        kept = {**output.state, "weights": state["weights"]}
        return LearningProcessOutput(kept, {"eval": dict(train)})


def _client_mean(dim: int, client_id: str, data: Any) -> tuple[np.ndarray, int]:
    examples = np.asarray(data, dtype=np.float64)
    if examples.ndim != 2 or examples.shape[1] != dim or len(examples) == 0:
        raise ValueError(
            f"FakeLearningProcess(dim={dim}) needs client data of shape (n >= 1, {dim}); "
            f"client {client_id!r} has shape {examples.shape}"
        )
    return examples.mean(axis=0), len(examples)


class FakeClock:
    """A clock that moves only when told to: ``advance(delta)`` or ``set(time)``."""

    def __init__(self, start: datetime.datetime | None = None) -> None:
        check_type("start", start, datetime.datetime, allow_none=True)
        self._now = start or datetime.datetime(2026, 1, 1, tzinfo=datetime.UTC)
        if self._now.tzinfo is None:
            raise ValueError(f"start must be a timezone-aware datetime, got {start!r}")

    def now(self) -> datetime.datetime:
        return self._now

    def advance(self, delta: datetime.timedelta) -> None:
        """Move the clock forward by ``delta``."""
        check_timedelta("delta", delta, minimum=datetime.timedelta(0))
        self._now += delta

    def set(self, time: datetime.datetime) -> None:
        """Move the clock to ``time`` (not before the current time)."""
        check_type("time", time, datetime.datetime)
        if time < self._now:
            raise ValueError(f"a clock cannot go back from {self._now} to {time}")
        self._now = time


class CrashingStateManager(ProgramStateManager):
    """Wraps a program-state manager and fails once, at the save of a chosen version.

    ``crash_on_version``: the version whose save fails. With ``after_save=True`` the
    inner manager saves it first, so the crash lands between the save and what a
    program does next (its releases); otherwise the version is never saved.
    ``error``: the exception raised (default: a :class:`SimulatedCrash`). Every other
    call goes to the inner manager.
    """

    def __init__(
        self,
        inner: ProgramStateManager,
        crash_on_version: int,
        *,
        after_save: bool = False,
        error: BaseException | None = None,
    ) -> None:
        check_type("inner", inner, ProgramStateManager)
        check_int("crash_on_version", crash_on_version, minimum=0)
        check_bool("after_save", after_save)
        check_type("error", error, BaseException, allow_none=True)
        self.inner = inner
        self.crash_on_version = crash_on_version
        self.after_save = after_save
        self.error = error or SimulatedCrash(
            f"simulated crash at the save of version {crash_on_version}"
        )
        self.crashed = False

    async def save(self, state: Any, version: int) -> None:
        crash = version == self.crash_on_version and not self.crashed
        if not crash or self.after_save:
            await self.inner.save(state, version)
        if crash:
            self.crashed = True
            raise self.error

    @property
    def retention(self) -> Retention | None:
        """The retention of the inner manager."""
        return self.inner.retention

    async def load(self, version: int, structure: Any = None) -> Any:
        return await self.inner.load(version, structure)

    async def load_latest(self, structure: Any = None) -> tuple[Any, int]:
        return await self.inner.load_latest(structure)

    async def get_versions(self) -> list[int]:
        return await self.inner.get_versions()

    async def remove(self, version: int) -> None:
        await self.inner.remove(version)

    async def remove_all(self) -> None:
        await self.inner.remove_all()

    async def aclose(self) -> None:
        await self.inner.aclose()
