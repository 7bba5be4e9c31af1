"""Early stopping: policies fed by evaluation metrics, whose state survives restarts.

A policy is a release manager: give it to the evaluation manager as (or inside) its
aggregated metrics manager, so it receives each evaluated round's metrics with key =
train round. ``train_model(stopping=policy)`` asks it after each round whether to stop.
Every result is saved in the policy's own program-state manager before ``release``
returns, so a crash loses none; releasing a round again replaces its result.

Evaluations run beside training, so which results a policy has seen when it is asked
depends on timing. ``train_model(..., stopping_waits_for_evaluations=True)`` waits for
every started evaluation before asking, which makes the stop round reproducible.
"""

from __future__ import annotations

import abc
import statistics
from typing import Any

import anyio

from managers.release.base import ReleaseKey, ReleaseManager, check_key
from managers.state.base import ProgramStateManager
from managers.structure import flatten
from managers.validation import check_choice, check_int, check_interface, check_number, check_str
from managers.values import materialize

__all__ = ["PatienceStopping", "SpeechTrainerStopping", "StoppingPolicy"]


class StoppingPolicy(ReleaseManager):
    """The base of early-stopping policies: durable results by train round, and a rule.

    ``metric`` is the path of the watched leaf in the released metrics (e.g.
    ``"eval/loss"``; see :mod:`managers.structure`). ``state_manager`` keeps the
    results. Subclasses implement :meth:`decide` over the results in train-round order.
    Only int keys are results; str keys are ignored.
    """

    def __init__(self, metric: str, state_manager: ProgramStateManager) -> None:
        check_str("metric", metric, allow_empty=False)
        check_interface("state_manager", state_manager, "ProgramStateManager", ["save"])
        self.metric = metric
        self._state_manager = state_manager
        self._results: dict[int, float] | None = None
        self._version = 0
        self._lock: anyio.Lock | None = None

    async def release(self, value: Any, key: ReleaseKey) -> None:
        check_key(key)
        if isinstance(key, str):
            return
        leaves = dict(flatten(await materialize(value)))
        if self.metric not in leaves:
            raise KeyError(
                f"the stopping metric {self.metric!r} is not in the metrics of round {key}; "
                f"found {sorted(leaves)}"
            )
        if self._lock is None:
            self._lock = anyio.Lock()
        async with self._lock:  # evaluations may finish at the same time
            results = await self._load()
            results[key] = float(leaves[self.metric])
            await self._state_manager.save(
                {"results": [[round_num, results[round_num]] for round_num in sorted(results)]},
                self._version,
            )
            self._version += 1

    async def results(self) -> list[tuple[int, float]]:
        """The results received so far, ``(train round, metric)`` in train-round order."""
        results = await self._load()
        return [(round_num, results[round_num]) for round_num in sorted(results)]

    async def should_stop(self) -> bool:
        """Whether training should stop, given the results received so far."""
        return self.decide([value for _, value in await self.results()])

    @abc.abstractmethod
    def decide(self, values: list[float]) -> bool:
        """The rule: whether to stop, given the metric values in train-round order."""

    async def _load(self) -> dict[int, float]:
        if self._results is None:
            saved, version = await self._state_manager.load_latest()
            self._results = {} if saved is None else {int(r): v for r, v in saved["results"]}
            self._version = 0 if saved is None else version + 1
        return self._results


class SpeechTrainerStopping(StoppingPolicy):
    """The rule of the classic distributed speech trainer, over the last ``window`` losses.

    With ``L`` the watched values in train-round order and at least ``window`` of them:
    stop when ``L[-1] > max(L[-window:-1])`` (the loss went up), or when
    ``|L[-1] - mean(L[-window:-1])| < mean_threshold`` and
    ``std(L[-window:-1]) < std_threshold`` (it flattened out). ``std`` is the
    population standard deviation.
    """

    def __init__(
        self,
        metric: str,
        state_manager: ProgramStateManager,
        *,
        window: int = 5,
        mean_threshold: float = 1e-3,
        std_threshold: float = 1e-3,
    ) -> None:
        super().__init__(metric, state_manager)
        check_int("window", window, minimum=2)
        check_number("mean_threshold", mean_threshold, minimum=0)
        check_number("std_threshold", std_threshold, minimum=0)
        self.window = window
        self.mean_threshold = mean_threshold
        self.std_threshold = std_threshold

    def decide(self, values: list[float]) -> bool:
        if len(values) < self.window:
            return False
        previous, last = values[-self.window : -1], values[-1]
        if last > max(previous):
            return True
        return (
            abs(last - statistics.fmean(previous)) < self.mean_threshold
            and statistics.pstdev(previous) < self.std_threshold
        )


class PatienceStopping(StoppingPolicy):
    """Stop when the metric has not improved by ``min_delta`` for ``patience`` results.

    ``mode="min"`` for losses (improving means lower), ``"max"`` for accuracies. The
    best value so far counts from the first result.
    """

    def __init__(
        self,
        metric: str,
        state_manager: ProgramStateManager,
        *,
        patience: int = 3,
        mode: str = "min",
        min_delta: float = 0.0,
    ) -> None:
        super().__init__(metric, state_manager)
        check_int("patience", patience, minimum=1)
        check_choice("mode", mode, ("min", "max"))
        check_number("min_delta", min_delta, minimum=0)
        self.patience = patience
        self.mode = mode
        self.min_delta = min_delta

    def decide(self, values: list[float]) -> bool:
        if not values:
            return False
        sign = 1.0 if self.mode == "min" else -1.0
        best, since_best = sign * values[0], 0
        for value in values[1:]:
            if sign * value < best - self.min_delta:
                best, since_best = sign * value, 0
            else:
                since_best += 1
        return since_best >= self.patience
