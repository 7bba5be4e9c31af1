import threading

import anyio
import anyio.from_thread
import anyio.lowlevel
import anyio.to_thread
import pytest

from programlogic import (
    ClientError,
    ClientHandle,
    InMemoryDataSource,
    LocalContext,
    NoFederatedContextError,
    check_in_federated_context,
    count_dropped_clients,
    get_context,
    report_dropped_clients,
)

pytestmark = pytest.mark.anyio

# How long a worker thread waits for the test before giving up: a hang guard only, the
# tests synchronize on events and never on how long something takes.
HANG_GUARD = 30


def handles(count: int, data=None) -> list[ClientHandle]:
    return [
        ClientHandle(f"c{i}", (lambda i=i: i if data is None else data[i])) for i in range(count)
    ]


class ThreadSignal:
    """An event that a context's worker thread sets and the event loop awaits."""

    def __init__(self) -> None:
        self._event = anyio.Event()
        self._token = anyio.lowlevel.current_token()

    def set(self) -> None:
        anyio.from_thread.run_sync(self._event.set, token=self._token)

    async def wait(self) -> None:
        await self._event.wait()


def reversed_in_groups_of(size: int):
    """Client work whose results arrive in reverse client order within each group of
    ``size`` consecutive clients (client i finishes after client i + 1 of its group),
    and the list of the clients in arrival order. Needs ``size`` workers."""
    finished: dict[int, threading.Event] = {}
    lock = threading.Lock()
    arrived: list[int] = []

    def done(data: int) -> threading.Event:
        with lock:
            return finished.setdefault(data, threading.Event())

    def work(broadcast: object, client_id: str, data: int) -> int:
        if data % size != size - 1:
            assert done(data + 1).wait(HANG_GUARD), f"client {data + 1} never finished"
        with lock:
            arrived.append(data)
        done(data).set()
        return data

    return work, arrived


async def test_outside_a_context_there_is_a_clear_error() -> None:
    with pytest.raises(NoFederatedContextError, match="async with LocalContext"):
        get_context()
    with pytest.raises(NoFederatedContextError, match="no federated context is active"):
        check_in_federated_context()


async def test_the_entered_context_is_current_until_it_is_left() -> None:
    context = LocalContext()
    async with context as entered:
        assert entered is context
        assert get_context() is context
        check_in_federated_context()
    with pytest.raises(NoFederatedContextError):
        get_context()


async def test_nested_contexts_restore_the_outer_one() -> None:
    async with LocalContext() as outer:
        async with LocalContext() as inner:
            assert get_context() is inner
        assert get_context() is outer


async def test_a_context_cannot_be_entered_twice_at_once() -> None:
    async with LocalContext() as context:
        with pytest.raises(RuntimeError, match="already entered"):
            await context.__aenter__()


async def test_two_programs_in_one_event_loop_see_their_own_context() -> None:
    seen: dict[str, bool] = {}
    entered: list[str] = []
    both_entered = anyio.Event()

    async def program(name: str) -> None:
        async with LocalContext() as mine:
            entered.append(name)
            if len(entered) == 2:
                both_entered.set()
            await both_entered.wait()  # the other program is inside its own context now
            seen[name] = get_context() is mine

    async with anyio.create_task_group() as group:
        group.start_soon(program, "a")
        group.start_soon(program, "b")
    assert seen == {"a": True, "b": True}


async def test_results_come_back_in_client_order_not_arrival_order() -> None:
    last_first, arrived = reversed_in_groups_of(4)

    def work(broadcast: int, client_id: str, data: int) -> str:
        return f"{client_id}:{last_first(broadcast, client_id, data) * broadcast}"

    async with LocalContext(max_workers=4) as context:
        results = await context.map_clients(work, 10, handles(4))
    assert arrived == [3, 2, 1, 0]
    assert results == ["c0:0", "c1:10", "c2:20", "c3:30"]


async def test_aggregate_consumes_results_in_client_order() -> None:
    first, first_arrived = reversed_in_groups_of(3)
    second, second_arrived = reversed_in_groups_of(3)

    async with LocalContext(max_workers=3) as context:
        order = await context.aggregate_clients(
            first, None, handles(12), lambda acc, r: [*acc, r], []
        )
        total = await context.aggregate_clients(
            second, None, handles(12), lambda acc, r: acc + r, 0
        )
    for arrived in (first_arrived, second_arrived):
        assert sorted(arrived) == list(range(12)) and arrived != sorted(arrived)
    assert order == list(range(12))
    assert total == sum(range(12))


async def test_client_data_is_loaded_on_the_worker_thread() -> None:
    loaded_on: list[threading.Thread] = []

    def loader() -> int:
        loaded_on.append(threading.current_thread())
        return 1

    async with LocalContext() as context:
        await context.map_clients(lambda b, cid, d: d, None, [ClientHandle("x", loader)])
    assert loaded_on and loaded_on[0] is not threading.main_thread()


async def test_work_is_bounded_by_max_workers() -> None:
    lock = threading.Lock()
    running = peak = 0
    pair = threading.Barrier(2)

    def work(broadcast: None, client_id: str, data: int) -> int:
        nonlocal running, peak
        with lock:
            running += 1
            peak = max(peak, running)
        pair.wait(HANG_GUARD)  # two clients compute at once, whichever threads run them
        with lock:
            running -= 1
        return data

    async with LocalContext(max_workers=2) as context:
        await context.map_clients(work, None, handles(10))
    assert peak == 2


async def test_a_failing_client_names_the_client_and_keeps_the_error() -> None:
    def work(broadcast: None, client_id: str, data: int) -> int:
        if client_id == "c3":
            raise ZeroDivisionError("bad client data")
        return data

    async with LocalContext() as context:
        with pytest.raises(ClientError, match="client 'c3' failed: ZeroDivisionError") as caught:
            await context.map_clients(work, None, handles(6))
    assert caught.value.client_ids == ("c3",)
    assert isinstance(caught.value.__cause__, ZeroDivisionError)
    assert caught.value.error is caught.value.__cause__


async def test_a_failed_call_hands_over_every_earlier_client_and_starts_no_later_one() -> None:
    # c0 finishes only after c1 has failed on the other worker: the results a failed call
    # hands over still do not depend on which thread was faster.
    c1_failed = threading.Event()
    started: list[str] = []

    def work(broadcast: None, client_id: str, data: int) -> int:
        started.append(client_id)
        if client_id == "c1":
            c1_failed.set()
            raise ZeroDivisionError("bad client data")
        if client_id == "c0":
            assert c1_failed.wait(HANG_GUARD)
        return data

    consumed: list[int] = []

    def accumulate(total: None, result: int) -> None:
        consumed.append(result)

    async with LocalContext(max_workers=2) as context:
        with pytest.raises(ClientError, match="'c1'"):
            await context.aggregate_clients(work, None, handles(4), accumulate, None)
    assert consumed == [0]
    assert sorted(started) == ["c0", "c1"]


async def test_a_failing_loader_names_the_client() -> None:
    def broken() -> None:
        raise FileNotFoundError("client file is gone")

    async with LocalContext() as context:
        with pytest.raises(ClientError, match=r"'lost'.*FileNotFoundError"):
            await context.map_clients(lambda b, c, d: d, None, [ClientHandle("lost", broken)])


async def test_groups_of_clients_run_in_one_call() -> None:
    calls: list[list[str]] = []

    def group_fn(broadcast: int, client_ids: list[str], datas: list[int]) -> list[int]:
        calls.append(list(client_ids))
        return [broadcast + d for d in datas]

    async with LocalContext(max_workers=2) as context:
        results = await context.map_clients(group_fn, 100, handles(7), group_size=3)
    assert results == [100, 101, 102, 103, 104, 105, 106]
    assert sorted(calls) == [["c0", "c1", "c2"], ["c3", "c4", "c5"], ["c6"]]


async def test_a_group_function_with_the_wrong_number_of_results_fails() -> None:
    async with LocalContext() as context:
        with pytest.raises(ClientError, match="returned 1 results for 2 clients"):
            await context.map_clients(lambda b, ids, ds: [0], None, handles(2), group_size=2)
        with pytest.raises(ValueError, match="group_size must be an int >= 1 or None, got 0"):
            await context.map_clients(lambda b, ids, ds: ds, None, handles(2), group_size=0)


async def test_no_clients_gives_no_results() -> None:
    async with LocalContext() as context:
        assert await context.map_clients(lambda b, c, d: d, None, []) == []


async def test_client_work_does_not_block_the_event_loop() -> None:
    working, loop_ran = threading.Event(), threading.Event()

    def work(broadcast: None, client_id: str, data: int) -> bool:
        working.set()
        return loop_ran.wait(HANG_GUARD)  # True once a task of the event loop ran meanwhile

    async def on_the_event_loop() -> None:
        assert await anyio.to_thread.run_sync(working.wait, HANG_GUARD)
        loop_ran.set()

    async with LocalContext(max_workers=1) as context, anyio.create_task_group() as group:
        group.start_soon(on_the_event_loop)
        results = await context.map_clients(work, None, handles(1))
    assert results == [True]


async def test_run_computes_off_the_event_loop_thread() -> None:
    async with LocalContext() as context:
        thread = await context.run(threading.current_thread)
        assert await context.run(pow, 2, 10) == 1024
    assert thread is not threading.current_thread()


async def test_a_cancelled_call_starts_no_further_clients() -> None:
    started: list[int] = []
    first_started, may_finish = ThreadSignal(), threading.Event()

    def work(broadcast: None, client_id: str, data: int) -> int:
        started.append(data)
        first_started.set()
        assert may_finish.wait(HANG_GUARD)
        return data

    async def cancel_while_the_first_client_runs(scope: anyio.CancelScope) -> None:
        await first_started.wait()
        scope.cancel()
        await anyio.wait_all_tasks_blocked()  # the cancellation has reached map_clients
        may_finish.set()

    async with LocalContext(max_workers=1) as context, anyio.create_task_group() as group:
        scope = anyio.CancelScope()
        group.start_soon(cancel_while_the_first_client_runs, scope)
        with scope:
            await context.map_clients(work, None, handles(20))
    # Leaving the context joined its threads: nothing can start any more.
    assert scope.cancelled_caught
    assert started == [0]


async def test_leaving_the_context_cancels_unfinished_background_work() -> None:
    outcome: list[str] = []

    async def forever() -> None:
        try:
            await anyio.sleep_forever()
        finally:
            outcome.append("cancelled")

    async with LocalContext() as context:
        context.background.start_soon(forever)
        await anyio.wait_all_tasks_blocked()  # forever is running
    assert outcome == ["cancelled"]
    with pytest.raises(NoFederatedContextError, match="not entered"):
        context.background  # noqa: B018


async def test_background_failures_do_not_cancel_the_program_and_surface_at_exit() -> None:
    async def fail() -> None:
        raise KeyError("evaluation 3")

    progress = []
    with pytest.raises(KeyError, match="evaluation 3"):
        async with LocalContext() as context:
            context.background.start_soon(fail)
            await anyio.wait_all_tasks_blocked()  # fail has raised; this task goes on
            progress.append("still running")
    assert progress == ["still running"]


async def test_invalid_max_workers_is_rejected() -> None:
    for bad, error in ((0, ValueError), (-2, ValueError), (1.5, TypeError), (True, TypeError)):
        with pytest.raises(error, match="max_workers must be an int >= 1 or None, got"):
            LocalContext(max_workers=bad)  # type: ignore[arg-type]


async def test_map_clients_outside_the_entered_context_is_an_error() -> None:
    source = InMemoryDataSource({"a": 1})
    with pytest.raises(RuntimeError, match="not entered"):
        await LocalContext().map_clients(lambda b, c, d: d, None, source.iterator(0).select(1, 1))


async def test_parallelism_is_the_number_of_workers() -> None:
    assert LocalContext(max_workers=3).parallelism == 3
    assert LocalContext().parallelism == LocalContext().max_workers >= 1


async def test_all_work_runs_on_the_context_s_own_threads_which_stop_when_it_is_left() -> None:
    pair = threading.Barrier(2)

    def in_pairs(*_: object) -> threading.Thread:
        pair.wait(HANG_GUARD)  # both threads take part
        return threading.current_thread()

    def thread_of(*_: object) -> threading.Thread:
        return threading.current_thread()

    async with LocalContext(max_workers=2) as context:
        first = await context.map_clients(in_pairs, None, handles(20))
        second = await context.map_clients(thread_of, None, handles(20))
        server = await context.run(thread_of)
    threads = set(first) | set(second) | {server}
    assert len(threads) == 2
    assert sorted(t.name for t in threads) == ["programlogic-local-0", "programlogic-local-1"]
    assert not any(thread.is_alive() for thread in threads)


async def test_a_cancelled_run_finishes_the_call_in_progress_and_withdraws_queued_ones() -> None:
    started, may_finish, finished, ran = ThreadSignal(), threading.Event(), threading.Event(), []

    def slow() -> None:
        started.set()
        assert may_finish.wait(HANG_GUARD)
        finished.set()

    async def finish_once_the_cancellation_is_handled() -> None:
        await anyio.wait_all_tasks_blocked()
        may_finish.set()

    async with LocalContext(max_workers=1) as context:
        async with anyio.create_task_group() as outer, anyio.create_task_group() as group:
            group.start_soon(context.run, slow)
            await started.wait()
            group.start_soon(context.run, ran.append, "queued")
            await anyio.wait_all_tasks_blocked()  # the queued call is handed in
            group.cancel_scope.cancel()
            outer.start_soon(finish_once_the_cancellation_is_handled)
        assert finished.is_set()  # the running call was waited for
        # Calls run in the order handed in: had the queued one stayed, it would run first.
        assert await context.run(sum, [1, 2]) == 3
        assert ran == []


async def test_dropped_clients_are_counted_by_the_innermost_collector_only() -> None:
    report_dropped_clients(["nobody-listens"])  # outside a collector: ignored
    with count_dropped_clients() as outer:
        report_dropped_clients(["a"])
        with count_dropped_clients() as inner:
            report_dropped_clients(["b", "c"])
    assert (outer.client_ids, outer.count) == (["a"], 1)
    assert (inner.client_ids, inner.count) == (["b", "c"], 2)


async def test_the_local_context_drops_no_client() -> None:
    async with LocalContext(max_workers=2) as context:
        with count_dropped_clients() as dropped:
            results = await context.map_clients(lambda b, cid, d: d, None, handles(5))
    assert (len(results), dropped.count) == (5, 0)
