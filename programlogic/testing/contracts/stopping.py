"""The stopping-policy contract: what ``train_model`` relies on when it asks a policy."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import anyio
import pytest

from programlogic.stopping import StoppingPolicy
from programlogic.testing.contracts._base import Contract

__all__ = ["StoppingPolicyContract"]


class StoppingPolicyContract(Contract):
    """Promises of a stopping policy fed results round by round (see ``StoppingPolicy``).

    Subclass it as ``Test...`` and give it:

    - a ``make_policy`` fixture: a callable that builds a new instance of the policy
      each time it is called; the instances one fixture builds share their durable
      state (the same state manager), as a restarted program's policy shares the
      storage of the one before it;
    - ``stop_values``: results for rounds 1, 2, ..., n such that the policy stops on
      round n's and on no earlier one;
    - ``metric`` (default ``"eval/loss"``): the path :meth:`feed` releases the values
      under; override :meth:`feed` for a policy fed another way.

    The promises: an answer is ``None`` or a non-empty ``str`` (a ``StopReason``);
    ``after_evaluation(r)`` stops on the result that completes the stop and is a pure
    function of the results of rounds ``<= r``; results are durable before ``release``
    returns and a new instance sees them; releasing a round again replaces its result,
    whatever order rounds arrive in, concurrently or not; asking has no side effects,
    on rounds evaluated or not; no call blocks the event loop (every test runs beside
    the loop watchdog of :class:`~programlogic.testing.contracts.Contract`, bounded by
    ``loop_stall_limit``, 0.25 s).
    """

    stop_values: Sequence[float] = ()
    metric: str = "eval/loss"

    @pytest.fixture
    def make_policy(self) -> Callable[[], StoppingPolicy]:
        """Builds a new policy over the test's durable state each call; override it."""
        raise NotImplementedError(f"{type(self).__name__} must override the make_policy fixture")

    async def feed(self, policy: StoppingPolicy, round_num: int, value: float) -> None:
        """Hand ``policy`` the result ``value`` of train round ``round_num``."""
        metrics: Any = value
        for name in reversed(self.metric.split("/")):
            metrics = {name: metrics}
        await policy.release(metrics, round_num)  # type: ignore[attr-defined]

    def rounds(self) -> range:
        """The rounds of ``stop_values``: 1 to n."""
        if len(self.stop_values) < 1:
            raise NotImplementedError(f"{type(self).__name__} must set stop_values")
        return range(1, len(self.stop_values) + 1)

    async def feed_all(self, policy: StoppingPolicy, rounds: Sequence[int]) -> None:
        """Feed ``policy`` the results of ``rounds``, in that order."""
        for round_num in rounds:
            await self.feed(policy, round_num, self.stop_values[round_num - 1])

    async def answers(self, policy: StoppingPolicy) -> list[Any]:
        """``after_evaluation(r)`` for every round of ``stop_values``."""
        return [await policy.after_evaluation(round_num) for round_num in self.rounds()]

    def assert_stops_at_the_last_round(self, answers: list[Any]) -> None:
        """Fail unless ``answers`` go on until the last round, and stop there with a reason."""
        *before, last = answers
        assert before == [None] * len(before), f"stopped before the last round: {answers}"
        assert isinstance(last, str) and last, f"did not stop at the last round: {answers}"

    async def test_a_new_policy_goes_on(self, make_policy: Callable[[], StoppingPolicy]) -> None:
        policy = make_policy()
        for round_num in self.rounds():
            assert await policy.before_round(round_num) is None
            assert await policy.after_evaluation(round_num) is None

    async def test_it_stops_on_the_result_that_completes_the_stop_and_not_before(
        self, make_policy: Callable[[], StoppingPolicy]
    ) -> None:
        policy = make_policy()
        answers = []
        for round_num in self.rounds():
            await self.feed_all(policy, [round_num])
            answers.append(await policy.after_evaluation(round_num))
        self.assert_stops_at_the_last_round(answers)

    async def test_the_answer_for_a_round_ignores_later_results(
        self, make_policy: Callable[[], StoppingPolicy]
    ) -> None:
        policy = make_policy()
        await self.feed_all(policy, self.rounds())
        self.assert_stops_at_the_last_round(await self.answers(policy))

    async def test_the_answer_is_a_pure_function_of_the_results(
        self, make_policy: Callable[[], StoppingPolicy]
    ) -> None:
        policy = make_policy()
        await self.feed_all(policy, self.rounds())
        first = await self.answers(policy)
        assert await self.answers(policy) == first
        assert await self.answers(make_policy()) == first

    async def test_results_are_durable_before_release_returns(
        self, make_policy: Callable[[], StoppingPolicy]
    ) -> None:
        policy = make_policy()
        for round_num in self.rounds():
            await self.feed_all(policy, [round_num])
            restarted = make_policy()
            assert await restarted.after_evaluation(round_num) == await policy.after_evaluation(
                round_num
            )
        self.assert_stops_at_the_last_round(await self.answers(make_policy()))

    async def test_a_new_instance_carries_on_where_the_last_one_stopped(
        self, make_policy: Callable[[], StoppingPolicy]
    ) -> None:
        *before, last = self.rounds()
        await self.feed_all(make_policy(), before)
        restarted = make_policy()
        await self.feed_all(restarted, [last])
        self.assert_stops_at_the_last_round(await self.answers(restarted))

    async def test_releasing_a_round_again_replaces_its_result(
        self, make_policy: Callable[[], StoppingPolicy]
    ) -> None:
        policy = make_policy()
        await self.feed(policy, 1, self.stop_values[-1])
        await self.feed_all(policy, self.rounds())
        self.assert_stops_at_the_last_round(await self.answers(policy))

    async def test_replaying_results_changes_no_answer(
        self, make_policy: Callable[[], StoppingPolicy]
    ) -> None:
        *before, last = self.rounds()
        await self.feed_all(make_policy(), before)
        restarted = make_policy()  # a resumed run releases its rounds again
        await self.feed_all(restarted, before)
        await self.feed_all(restarted, before)
        for round_num in before:
            assert await restarted.after_evaluation(round_num) is None
        await self.feed_all(restarted, [last])
        self.assert_stops_at_the_last_round(await self.answers(restarted))

    async def test_results_arrive_in_any_order(
        self, make_policy: Callable[[], StoppingPolicy]
    ) -> None:
        policy = make_policy()
        await self.feed_all(policy, list(reversed(self.rounds())))
        self.assert_stops_at_the_last_round(await self.answers(policy))

    async def test_concurrent_results_all_land(
        self, make_policy: Callable[[], StoppingPolicy]
    ) -> None:
        policy = make_policy()
        async with anyio.create_task_group() as group:
            for round_num in self.rounds():
                group.start_soon(self.feed_all, policy, [round_num])
        self.assert_stops_at_the_last_round(await self.answers(make_policy()))

    async def test_asking_has_no_side_effects_on_rounds_evaluated_or_not(
        self, make_policy: Callable[[], StoppingPolicy]
    ) -> None:
        policy = make_policy()
        everywhere = range(0, 2 * len(self.stop_values) + 2)
        for round_num in self.rounds():
            for asked in everywhere:
                await policy.before_round(asked)
                await policy.after_evaluation(asked)
            await self.feed_all(policy, [round_num])
        self.assert_stops_at_the_last_round(await self.answers(policy))
        self.assert_stops_at_the_last_round(await self.answers(make_policy()))
