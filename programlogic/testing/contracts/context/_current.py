"""Tests of the federated-context suite: which context is the current one, and when."""

from __future__ import annotations

from collections.abc import Callable

import anyio
import pytest

from programlogic.context import FederatedContext, check_in_federated_context, get_context
from programlogic.exceptions import NoFederatedContextError
from programlogic.testing.contracts.context._work import _echo, _handles, _where

__all__ = ["CurrentContextTests"]


class CurrentContextTests:
    """Entering a context makes it the current one, for its program only, until it is left."""

    async def test_entering_makes_it_the_current_context_until_it_is_left(
        self, make_context: Callable[[], FederatedContext]
    ) -> None:
        context = make_context()
        with pytest.raises(NoFederatedContextError):
            check_in_federated_context()
        async with context as entered:
            assert entered is context
            assert get_context() is context
            check_in_federated_context()
        with pytest.raises(NoFederatedContextError):
            check_in_federated_context()

    async def test_nested_contexts_restore_the_outer_one(
        self, make_context: Callable[[], FederatedContext]
    ) -> None:
        async with make_context() as outer:
            async with make_context() as inner:
                assert get_context() is inner
            assert get_context() is outer

    async def test_two_programs_in_one_event_loop_each_see_their_own_context(
        self, make_context: Callable[[], FederatedContext]
    ) -> None:
        first_in, second_in, first_out = anyio.Event(), anyio.Event(), anyio.Event()
        seen: dict[str, list[bool]] = {"first": [], "second": []}

        async def first() -> None:
            async with make_context() as mine:
                first_in.set()
                await second_in.wait()
                seen["first"].append(get_context() is mine)
            first_out.set()

        async def second() -> None:
            await first_in.wait()
            async with make_context() as mine:
                second_in.set()
                seen["second"].append(get_context() is mine)
                await first_out.wait()
                seen["second"].append(get_context() is mine)

        async with anyio.create_task_group() as group:
            group.start_soon(first)
            group.start_soon(second)
        assert seen == {"first": [True], "second": [True, True]}

    async def test_a_context_cannot_be_entered_twice_at_once(
        self, make_context: Callable[[], FederatedContext]
    ) -> None:
        async with make_context() as context:
            with pytest.raises(RuntimeError, match="already entered"):
                await context.__aenter__()
            assert get_context() is context

    async def test_work_and_background_need_the_context_to_be_entered(
        self, make_context: Callable[[], FederatedContext]
    ) -> None:
        context = make_context()
        with pytest.raises(RuntimeError, match="not entered"):
            await context.run(_where)
        with pytest.raises(RuntimeError, match="not entered"):
            await context.map_clients(_echo, None, _handles(1))
        with pytest.raises(NoFederatedContextError, match="not entered"):
            context.background  # noqa: B018

    async def test_parallelism_is_a_positive_int(
        self, make_context: Callable[[], FederatedContext]
    ) -> None:
        context = make_context()
        values = [context.parallelism]
        async with context:
            values.append(context.parallelism)
        assert all(type(value) is int and value >= 1 for value in values), values

    async def test_a_context_that_replays_rounds_computes_a_call_again_the_same(
        self, make_context: Callable[[], FederatedContext]
    ) -> None:
        context = make_context()
        assert type(context.replays_rounds) is bool, context.replays_rounds
        async with context:
            first = await context.map_clients(_echo, 7, _handles(5))
            again = await context.map_clients(_echo, 7, _handles(5))
        if context.replays_rounds:  # train_model's checkpoint cadence relies on it
            assert again == first
