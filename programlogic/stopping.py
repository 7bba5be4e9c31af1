"""Early stopping: the hook ``train_model`` asks, and policies whose state survives restarts.

:class:`StoppingPolicy` is the hook: ``train_model(stopping=policy)`` asks it before
each round and after each evaluation whether to stop, and a policy answers ``None``
or the :class:`StopReason` it stops for. :class:`MetricStoppingPolicy` is the base of
policies fed by evaluation metrics (they are release managers: give them to the
evaluation manager as, or inside, its aggregated metrics manager), with two built-in
rules, :class:`SpeechTrainerStopping` and :class:`PatienceStopping`. :class:`AnyOf`
stops when any of its policies does.

Example: stop on the validation loss, deciding on each evaluated round's own
evaluation before the next round starts::

    policy = SpeechTrainerStopping(
        "client_work/eval/total_rounds_metrics/loss", FileProgramStateManager(root / "stopping")
    )
    evaluations = EvaluationManager(..., aggregated_metrics_manager=GroupingReleaseManager(
        [CSVFileReleaseManager(root / "evaluation.csv"), policy]))
    result = await train_model(..., evaluation_manager=evaluations, stopping=policy,
                               stopping_waits_for_evaluations=True)
    result.stop_reason  # StopReason.EARLY_STOPPED if the policy stopped training
"""

from __future__ import annotations

import abc
import statistics
from typing import Any, ClassVar, final

import anyio

from managers.release.base import ReleaseKey, ReleaseManager, check_key
from managers.release.grouping import GroupingReleaseManager
from managers.state.base import ProgramStateManager
from managers.structure import flatten
from managers.validation import check_choice, check_int, check_interface, check_number, check_str
from managers.values import materialize

__all__ = [
    "AnyOf",
    "MetricStoppingPolicy",
    "PatienceStopping",
    "SpeechTrainerStopping",
    "StopReason",
    "StoppingPolicy",
]


@final
class StopReason(str):
    """Why ``train_model`` returned: a ``str``, one of the constants below or a policy's own.

    The set is open: a policy stops with a reason of its own, ``StopReason("pruned")``,
    which ``TrainingResult.stop_reason`` reports and the checkpoint keeps, so a rerun
    reports it too. Equal reasons are one object, so ``is`` compares them as it
    compares enum members, and a reason compares equal to its ``str``.
    """

    __slots__ = ()
    _interned: ClassVar[dict[str, StopReason]] = {}

    COMPLETED: ClassVar[StopReason]
    """This run trained up to ``train_total_rounds``."""
    ALREADY_COMPLETED: ClassVar[StopReason]
    """The program state already held the last round; nothing was trained."""
    EARLY_STOPPED: ClassVar[StopReason]
    """A metric-fed stopping policy stopped training before ``train_total_rounds``."""

    def __new__(cls, value: str) -> StopReason:
        if isinstance(value, StopReason):
            return value
        if not isinstance(value, str):
            raise TypeError(f"a stop reason must be a str, got {type(value).__name__} {value!r}")
        if not value:
            raise ValueError("a stop reason must be a non-empty str, got ''")
        reason = cls._interned.get(value)
        if reason is None:
            reason = cls._interned[value] = super().__new__(cls, value)
        return reason

    def __repr__(self) -> str:
        return f"StopReason({str(self)!r})"


StopReason.COMPLETED = StopReason("completed")
StopReason.ALREADY_COMPLETED = StopReason("already_completed")
StopReason.EARLY_STOPPED = StopReason("early_stopped")


async def metric_of_round(value: Any, metric: str, round_num: int, role: str) -> float:
    """The leaf ``metric`` of a round's released metrics, as a float.

    Raises a KeyError naming the ``role`` (``"the stopping metric"``), the round and
    the paths there are, when the metrics have no such leaf.
    """
    leaves = dict(flatten(await materialize(value)))
    if metric not in leaves:
        raise KeyError(
            f"{role} {metric!r} is not in the metrics of round {round_num}; found {sorted(leaves)}"
        )
    return float(leaves[metric])


class StoppingPolicy:
    """The early-stopping hook: ``train_model`` asks it whether training goes on.

    A policy answers two questions, each with ``None`` (go on) or the
    :class:`StopReason` it stops for. Both default to ``None``: override what your
    policy decides on.

    - ``before_round(round_num)``: may round ``round_num`` start? Asked once round
      ``round_num - 1`` is trained (and, in the waiting mode, decided on), before its
      checkpoint is saved, for every round up to ``train_total_rounds``; on a fresh
      start ``before_round(1)`` is asked before the initial state (round 0) is saved,
      and a rerun asks it again for the first round it would train. A stop makes
      round ``round_num - 1`` the last. For decisions that need no evaluation: a
      privacy budget, a trial pruned by a tuner.
    - ``after_evaluation(round_num)``: is round ``round_num`` the last? The answer is
      a function of what the policy holds of rounds ``<= round_num``. It is never
      asked for ``train_total_rounds``, which is the last anyway. When it is asked
      depends on ``train_model``'s mode:

      - waiting (``stopping_waits_for_evaluations=True``): after round ``round_num``
        is trained, its evaluation is started and awaited (with every evaluation
        still running), then the policy is asked, before the round is saved and
        before round ``round_num + 1`` starts; the speech trainer's order (train
        epoch r, validate r, decide, stop at r). Rounds not evaluated (see
        ``evaluation_periodicity``) are not asked. The stop round is reproducible
        across restarts, and the final model is the one whose evaluation decided.
      - overlapping (the default): after each round's ``next``, without waiting,
        on whatever results have arrived; evaluations keep running beside training,
        so the stop round depends on their timing and comes one round or more after
        the evaluation that triggered it.

    What a stop does: that round is the last. Its checkpoint is saved marked stopped,
    with the reason (a rerun trains no further and reports the same reason); it is
    evaluated; its model weights are released as the final model with key
    ``final_model_key(that round)``; and ``train_model`` returns a ``TrainingResult``
    whose ``stop_reason`` is the reason. A stop answered on a rerun, before its first
    round, makes the loaded round the last; that round's checkpoint exists already, so
    the stop is not saved, and a later rerun asks again.

    What an implementation guarantees:

    - An answer is a pure function of ``round_num`` and the policy's durable state,
      so that a run that crashed and is run again decides as the first one did.
    - Asking has no side effects: a hook may be asked more than once for a round, and
      in the overlapping mode for rounds not evaluated; asking changes no later
      answer.
    - State the policy keeps (results it was fed) is durable before the call that
      fed it returns, and survives a new instance built on the same storage.

    ``train_model`` never asks two hooks at once; results may arrive (``release``)
    while a hook is being asked. A cancelled hook leaves nothing behind, since it
    changes nothing. Check a policy with
    :class:`programlogic.testing.contracts.StoppingPolicyContract`.

    Example, a policy that stops before a round budget is spent::

        class RoundBudget(StoppingPolicy):
            def __init__(self, rounds: int) -> None:
                self.rounds = rounds

            async def before_round(self, round_num: int) -> StopReason | None:
                if round_num > self.rounds:
                    return StopReason("budget_exhausted")
                return None
    """

    async def before_round(self, round_num: int) -> StopReason | None:
        """``None`` if round ``round_num`` may start, else why training stops before it."""
        return None

    async def after_evaluation(self, round_num: int) -> StopReason | None:
        """``None`` if training goes on after round ``round_num``, else why it stops there."""
        return None


class MetricStoppingPolicy(StoppingPolicy, ReleaseManager):
    """The base of policies fed by evaluation metrics: durable results by train round, a rule.

    The policy is a release manager: it receives each evaluated round's metrics with
    key = train round (str keys are ignored) and keeps the watched leaf, ``metric``,
    a path in the released metrics (e.g. ``"client_work/eval/total_rounds_metrics/loss"``,
    which :func:`~programlogic.learning.build_fed_eval` releases; see
    :mod:`managers.structure` for paths). Each result is saved in ``state_manager``
    before ``release`` returns; releasing a round again replaces its result; a new
    instance on the same state manager sees every result.

    ``after_evaluation(r)`` asks the rule, :meth:`decide`, over the results of rounds
    ``<= r`` in train-round order, and answers :attr:`reason` when it says stop.
    Subclasses implement :meth:`decide`.
    """

    reason: ClassVar[StopReason] = StopReason.EARLY_STOPPED
    """The reason this policy stops with."""

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
        metric = await metric_of_round(value, self.metric, key, "the stopping metric")
        if self._lock is None:
            self._lock = anyio.Lock()
        async with self._lock:  # evaluations may finish at the same time
            results = dict(await self._load())
            results[key] = metric
            await self._state_manager.save(
                {"results": [[round_num, results[round_num]] for round_num in sorted(results)]},
                self._version,
            )
            self._results = results
            self._version += 1

    async def results(self) -> list[tuple[int, float]]:
        """The results received so far, ``(train round, metric)`` in train-round order."""
        results = await self._load()
        return [(round_num, results[round_num]) for round_num in sorted(results)]

    async def after_evaluation(self, round_num: int) -> StopReason | None:
        values = [
            value for result_round, value in await self.results() if result_round <= round_num
        ]
        return self.reason if self.decide(values) else None

    @abc.abstractmethod
    def decide(self, values: list[float]) -> bool:
        """The rule: whether to stop, given the metric values in train-round order."""

    async def _load(self) -> dict[int, float]:
        if self._results is None:
            saved, version = await self._state_manager.load_latest()
            self._results = {} if saved is None else {int(r): v for r, v in saved["results"]}
            self._version = 0 if saved is None else version + 1
        return self._results


class SpeechTrainerStopping(MetricStoppingPolicy):
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


class PatienceStopping(MetricStoppingPolicy):
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


class AnyOf(StoppingPolicy, ReleaseManager):
    """Stops when any of ``policies`` does; the first in order that stops gives the reason.

    It is a release manager too: a release goes to every policy that is one
    (concurrently, as :class:`~managers.release.grouping.GroupingReleaseManager`
    does), so one ``AnyOf`` can receive the evaluation metrics for all its policies.
    ``aclose`` closes those policies.
    """

    def __init__(self, *policies: StoppingPolicy) -> None:
        if not policies:
            raise ValueError("AnyOf needs at least one policy, got none")
        for index, policy in enumerate(policies):
            if not isinstance(policy, StoppingPolicy):
                raise TypeError(
                    f"policies[{index}] must be a StoppingPolicy, "
                    f"got {type(policy).__name__} {policy!r}"
                )
        self.policies = policies
        self._fed = GroupingReleaseManager(
            policy for policy in policies if isinstance(policy, ReleaseManager)
        )

    async def before_round(self, round_num: int) -> StopReason | None:
        for policy in self.policies:
            reason = await policy.before_round(round_num)
            if reason is not None:
                return reason
        return None

    async def after_evaluation(self, round_num: int) -> StopReason | None:
        for policy in self.policies:
            reason = await policy.after_evaluation(round_num)
            if reason is not None:
                return reason
        return None

    async def release(self, value: Any, key: ReleaseKey) -> None:
        await self._fed.release(value, key)

    async def aclose(self) -> None:
        await self._fed.aclose()
