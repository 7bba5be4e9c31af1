"""Tests of the federated-context suite: client work run by ``map_clients`` and
``aggregate_clients``."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import anyio
import pytest

from programlogic.context import FederatedContext
from programlogic.data import ClientHandle
from programlogic.exceptions import ClientError
from programlogic.testing.contracts.context._work import (
    _add_value,
    _alive,
    _append,
    _broken_loader,
    _data_of,
    _echo,
    _fail_on_c3,
    _finish_pairs_in_reverse,
    _group_echo,
    _group_fail_on_c3,
    _handles,
    _last_waits_for_the_first_to_be_folded,
    _markers,
    _until_exists,
    _wait_for_go,
    _where,
    _work_a_while,
)

__all__ = ["ClientWorkTests"]


class ClientWorkTests:
    """Client work: its results, its groups, its failures and its cancellation."""

    streams_aggregation: bool
    """Whether results are folded as they arrive: see :class:`FederatedContextContract`."""

    async def test_map_clients_returns_results_in_client_order_whatever_finishes_first(
        self, make_context: Callable[[], FederatedContext], tmp_path: Path
    ) -> None:
        count = 6
        async with make_context() as context:
            parallelism = context.parallelism
            results = await context.map_clients(
                _finish_pairs_in_reverse, (str(tmp_path), count, parallelism), _handles(count)
            )
        assert results == [("c" + str(i), i * 10) for i in range(count)]
        finished = (tmp_path / "finished").read_text().split()
        assert sorted(finished) == sorted(f"c{i}" for i in range(count))
        if parallelism >= 2:  # the suite made some client finish before an earlier one
            assert finished != [f"c{i}" for i in range(count)], finished

    async def test_map_clients_passes_the_broadcast_the_client_id_and_its_data(
        self, make_context: Callable[[], FederatedContext]
    ) -> None:
        async with make_context() as context:
            results = await context.map_clients(_echo, {"weights": [1.5]}, _handles(3))
        assert results == [({"weights": [1.5]}, f"c{i}", i) for i in range(3)]

    async def test_no_clients_give_no_results_and_the_initial_total(
        self, make_context: Callable[[], FederatedContext]
    ) -> None:
        async with make_context() as context:
            assert await context.map_clients(_echo, None, []) == []
            total = await context.aggregate_clients(_echo, None, [], _append, ["initial"])
        assert total == ["initial"]

    async def test_client_data_is_loaded_off_the_event_loop_thread(
        self, make_context: Callable[[], FederatedContext]
    ) -> None:
        handles = [ClientHandle(f"c{i}", _where) for i in range(3)]
        async with make_context() as context:
            results = await context.map_clients(_data_of, None, handles)
        assert len(results) == 3
        assert _where() not in results

    async def test_client_work_lets_the_event_loop_run_while_it_computes(
        self, make_context: Callable[[], FederatedContext], tmp_path: Path
    ) -> None:
        async with make_context() as context, anyio.create_task_group() as group:
            results: list[Any] = []

            async def call() -> None:
                results.extend(await context.map_clients(_wait_for_go, str(tmp_path), _handles(1)))

            group.start_soon(call)
            await _until_exists(tmp_path / "started-c0")
            (tmp_path / "go").touch()
        assert results == [True]

    async def test_a_group_function_gets_at_most_group_size_clients_results_in_order(
        self, make_context: Callable[[], FederatedContext]
    ) -> None:
        async with make_context() as context:
            results = await context.map_clients(_group_echo, 100, _handles(7), group_size=3)
        assert [(client_id, value) for client_id, value, _ in results] == [
            (f"c{i}", 100 + i) for i in range(7)
        ]
        assert all(1 <= size <= 3 for _, _, size in results)

    async def test_group_size_must_be_a_positive_int(
        self, make_context: Callable[[], FederatedContext]
    ) -> None:
        async with make_context() as context:
            for bad in (0, -2):
                with pytest.raises(ValueError, match=rf"group_size.*{bad}"):
                    await context.map_clients(_group_echo, 0, _handles(2), group_size=bad)
            assert len(await context.map_clients(_group_echo, 0, _handles(2), group_size=2)) == 2

    async def test_aggregate_clients_folds_every_result_in_client_order(
        self, make_context: Callable[[], FederatedContext], tmp_path: Path
    ) -> None:
        count = 6
        async with make_context() as context:
            order = await context.aggregate_clients(
                _finish_pairs_in_reverse,
                (str(tmp_path), count, context.parallelism),
                _handles(count),
                _append,
                [],
            )
            grouped = await context.aggregate_clients(
                _group_echo, 0, _handles(count), _add_value, 0, group_size=4
            )
        assert order == [(f"c{i}", i * 10) for i in range(count)]
        assert grouped == sum(range(count))

    async def test_aggregate_clients_folds_results_as_they_arrive(
        self, make_context: Callable[[], FederatedContext], tmp_path: Path
    ) -> None:
        if not self.streams_aggregation:
            pytest.skip(f"{type(self).__name__}.streams_aggregation is False")
        consumed = tmp_path / "consumed-c0"

        def accumulate(total: list[Any], result: Any) -> list[Any]:
            consumed.touch()
            return [*total, result]

        async with make_context() as context:
            results = await context.aggregate_clients(
                _last_waits_for_the_first_to_be_folded,
                (str(consumed), 3),
                _handles(3),
                accumulate,
                [],
            )
        assert results == [None, None, True]

    async def test_a_failing_client_fails_the_call_with_client_error_naming_it(
        self, make_context: Callable[[], FederatedContext]
    ) -> None:
        async with make_context() as context:
            with pytest.raises(ClientError, match=r"'c3'.*ZeroDivisionError") as caught:
                await context.map_clients(_fail_on_c3, None, _handles(5))
            assert await context.map_clients(_echo, 1, _handles(1)) == [(1, "c0", 0)]
        assert caught.value.client_ids == ("c3",)
        assert isinstance(caught.value.error, ZeroDivisionError)
        assert str(caught.value.error) == "no examples on c3"
        assert caught.value.__cause__ is caught.value.error

    async def test_a_failing_loader_fails_the_call_with_client_error_naming_it(
        self, make_context: Callable[[], FederatedContext]
    ) -> None:
        handles = [*_handles(2), ClientHandle("lost", _broken_loader)]
        async with make_context() as context:
            with pytest.raises(ClientError, match=r"'lost'.*FileNotFoundError") as caught:
                await context.map_clients(_echo, None, handles)
        assert caught.value.client_ids == ("lost",)
        assert isinstance(caught.value.error, FileNotFoundError)

    async def test_a_failing_group_fails_the_call_with_client_error_naming_the_group(
        self, make_context: Callable[[], FederatedContext]
    ) -> None:
        async with make_context() as context:
            with pytest.raises(ClientError) as caught:
                await context.map_clients(_group_fail_on_c3, None, _handles(6), group_size=2)
        assert caught.value.client_ids == ("c2", "c3")
        assert isinstance(caught.value.error, ZeroDivisionError)

    async def test_a_cancelled_call_leaves_no_work_running_and_the_next_call_completes(
        self, make_context: Callable[[], FederatedContext], tmp_path: Path
    ) -> None:
        async with make_context() as context:
            count = context.parallelism + 3
            async with anyio.create_task_group() as group:
                group.start_soon(context.map_clients, _work_a_while, str(tmp_path), _handles(count))
                await _until_exists(tmp_path / "started-c0")
                group.cancel_scope.cancel()
            started = _markers(tmp_path, "started-")
            running = [
                client_id
                for client_id, pid in started.items()
                if client_id not in _markers(tmp_path, "ended-") and _alive(int(pid))
            ]
            assert running == [], "client work of the cancelled call still runs"
            assert await context.map_clients(_echo, 2, _handles(count)) == [
                (2, f"c{i}", i) for i in range(count)
            ]
            assert await context.run(pow, 2, 5) == 32
            assert _markers(tmp_path, "started-") == started, "a cancelled client started late"
        assert len(started) < count, "the cancelled call ran every client"
