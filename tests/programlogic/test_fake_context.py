"""FakeContext plays its fault plan call by call, and records what each call did."""

from __future__ import annotations

import datetime
import functools
import pickle
import threading
from collections.abc import Sequence
from typing import Any

import anyio
import anyio.to_thread
import pytest

from programlogic import (
    ClientError,
    ClientHandle,
    ClusterConnectionError,
    NotEnoughClientsError,
    count_dropped_clients,
)
from programlogic.testing import (
    CallRecord,
    DropClients,
    FailClient,
    FakeClock,
    FakeContext,
    LoseCluster,
    SimulatedCrash,
    SlowCall,
)

pytestmark = pytest.mark.anyio

MINUTE = datetime.timedelta(minutes=1)


def clients(count: int) -> list[ClientHandle]:
    """Clients ``c0``, ``c1``, ... whose data is their index."""
    return [ClientHandle(f"c{i}", functools.partial(int, i)) for i in range(count)]


def ids(count: int) -> list[str]:
    return [f"c{i}" for i in range(count)]


def plus(broadcast: int, client_id: str, data: int) -> int:
    return broadcast + data


def group_plus(broadcast: int, client_ids: Sequence[str], datas: Sequence[int]) -> list[int]:
    return [broadcast + data for data in datas]


async def test_a_failing_client_fails_its_call_with_client_error_naming_it() -> None:
    fake = FakeContext([FailClient("c2", call=2)])
    async with fake:
        assert await fake.map_clients(plus, 10, clients(4)) == [10, 11, 12, 13]
        with pytest.raises(ClientError, match=r"client 'c2'.*SimulatedCrash") as caught:
            await fake.map_clients(plus, 10, clients(4))
        assert await fake.map_clients(plus, 10, clients(4)) == [10, 11, 12, 13]
    assert caught.value.client_ids == ("c2",)
    assert isinstance(caught.value.error, SimulatedCrash)
    assert "call 2" in str(caught.value.error)
    assert caught.value.__cause__ is caught.value.error
    failed = fake.calls[1]
    assert (failed.call, failed.clients, failed.finished, failed.failed) == (
        2,
        ids(4),
        ["c0", "c1"],
        ["c2"],
    )
    assert (failed.outcome, failed.error) == ("raised", caught.value)
    assert [record.outcome for record in fake.calls] == ["returned", "raised", "returned"]


async def test_a_client_failing_in_every_call_fails_its_group_with_the_error_given() -> None:
    error = FileNotFoundError("client c3's data is gone")
    async with FakeContext([FailClient("c3", error=error)]) as fake:
        for _ in range(2):
            with pytest.raises(ClientError) as caught:
                await fake.aggregate_clients(
                    group_plus, 0, clients(6), lambda total, x: total + x, 0, group_size=2
                )
            assert (caught.value.client_ids, caught.value.error) == (("c2", "c3"), error)
        assert await fake.map_clients(plus, 0, clients(3)) == [0, 1, 2]
    assert [record.failed for record in fake.calls] == [["c2", "c3"], ["c2", "c3"], []]
    assert fake.calls[0].finished == ["c0", "c1"]


async def test_dropped_clients_are_left_out_and_reported_as_a_deadline_drops_them() -> None:
    fake = FakeContext([DropClients(["c1", "c4", "absent"], call=1)])
    async with fake:
        with count_dropped_clients() as dropped:
            total = await fake.aggregate_clients(
                group_plus, 100, clients(6), lambda total, x: [*total, x], [], group_size=2
            )
            again = await fake.map_clients(plus, 100, clients(6))
    assert total == [100, 102, 103, 105]
    assert again == [100 + i for i in range(6)]
    assert dropped.client_ids == ["c1", "c4"]
    first, second = fake.calls
    assert (first.finished, first.dropped, first.outcome) == (
        ["c0", "c2", "c3", "c5"],
        ["c1", "c4"],
        "returned",
    )
    assert (second.finished, second.dropped) == (ids(6), [])


async def test_fewer_clients_than_min_clients_raise_not_enough_clients_error() -> None:
    fake = FakeContext([DropClients(["c0", "c2"], call=1), DropClients(["c1"])], min_clients=2)
    async with fake:
        with count_dropped_clients() as dropped, pytest.raises(NotEnoughClientsError) as caught:
            await fake.map_clients(plus, 0, clients(3))
        # A call of fewer clients than min_clients needs them all.
        with pytest.raises(NotEnoughClientsError) as fewer:
            await fake.map_clients(plus, 0, clients(2))
        assert await fake.map_clients(plus, 0, [ClientHandle("c9", int)]) == [0]
    assert (caught.value.finished, caught.value.required, caught.value.dropped) == (0, 2, 3)
    assert "only 0 clients finished the round, at least 2 are needed" in str(caught.value)
    assert dropped.client_ids == ["c0", "c1", "c2"]
    assert (fewer.value.finished, fewer.value.required, fewer.value.dropped) == (1, 2, 1)
    assert fake.calls[1].finished == ["c0"]
    assert fake.calls[1].error is fewer.value


async def test_a_lost_cluster_fails_its_call_and_every_later_one_until_entered_again() -> None:
    fake = FakeContext([LoseCluster(call=2)])
    async with fake:
        await fake.map_clients(plus, 0, clients(2))
        for _ in range(2):
            with pytest.raises(ClusterConnectionError, match="lost its cluster in call 2"):
                await fake.map_clients(plus, 0, clients(2))
        assert await fake.run(pow, 2, 3) == 8  # server steps run on this machine
    async with fake:  # a new cluster; the counting goes on, so call 2's fault is not replayed
        assert await fake.map_clients(plus, 0, clients(2)) == [0, 1]
    assert [(r.call, r.outcome) for r in fake.calls] == [
        (1, "returned"),
        (2, "raised"),
        (3, "raised"),
        (4, "returned"),
    ]
    assert isinstance(fake.calls[1].error, ClusterConnectionError)
    assert fake.calls[1].finished == []


async def test_a_slow_call_moves_the_clock_once_its_work_is_done() -> None:
    clock = FakeClock()
    start = clock.now()
    faults = [SlowCall(5 * MINUTE, call=2), SlowCall(MINUTE), FailClient("c1", call=3)]
    seen: list[datetime.timedelta] = []

    def when(broadcast: Any, client_id: str, data: Any) -> datetime.timedelta:
        return clock.now() - start

    async with FakeContext(faults, clock=clock) as fake:
        for _ in range(2):
            seen.extend(await fake.map_clients(when, None, clients(1)))
        with pytest.raises(ClientError):  # a failed call takes no time
            await fake.map_clients(when, None, clients(2))
        seen.extend(await fake.map_clients(when, None, clients(1)))
    assert seen == [0 * MINUTE, MINUTE, 7 * MINUTE]
    assert clock.now() - start == 8 * MINUTE


async def test_the_record_holds_the_size_of_the_broadcast_pickled() -> None:
    broadcast = {"weights": list(range(100)), "round": 3}
    async with FakeContext() as fake:
        await fake.map_clients(plus, 1, clients(2))
        await fake.aggregate_clients(lambda b, c, d: d, broadcast, clients(1), lambda t, r: t, None)
        await fake.map_clients(plus, 0, [])
        await fake.map_clients(lambda b, c, d: d, lambda: "not picklable", clients(1))
    assert [record.broadcast_bytes for record in fake.calls] == [
        len(pickle.dumps(1, protocol=pickle.HIGHEST_PROTOCOL)),
        len(pickle.dumps(broadcast, protocol=pickle.HIGHEST_PROTOCOL)),
        len(pickle.dumps(0, protocol=pickle.HIGHEST_PROTOCOL)),
        None,
    ]
    assert fake.calls[2] == CallRecord(
        3, [], broadcast_bytes=fake.calls[2].broadcast_bytes, outcome="returned"
    )


async def test_a_cancelled_call_is_recorded_and_starts_no_further_client() -> None:
    started: list[str] = []
    first_started, go = threading.Event(), threading.Event()

    def work(broadcast: Any, client_id: str, data: Any) -> str:
        started.append(client_id)
        first_started.set()
        go.wait()
        return client_id

    async with FakeContext() as fake:
        async with anyio.create_task_group() as group:
            group.start_soon(fake.map_clients, work, None, clients(3))
            # The first client computes on the context's thread; wait for it there.
            await anyio.to_thread.run_sync(first_started.wait)
            group.cancel_scope.cancel()
            go.set()
        assert await fake.map_clients(plus, 0, clients(3)) == [0, 1, 2]
    assert started == ["c0"]
    assert (fake.calls[0].outcome, fake.calls[0].finished) == ("cancelled", [])


async def play_a_plan() -> tuple[list[Any], list[tuple]]:
    """The results and records of four calls of 8 clients, on two threads, under faults."""
    faults = [DropClients(["c3"], call=2), FailClient("c5", call=3), LoseCluster(call=4)]
    results: list[Any] = []
    fake = FakeContext(faults, max_workers=2)
    async with fake:
        for _ in range(4):
            try:
                results.append(await fake.map_clients(plus, 0, clients(8)))
            except (ClientError, ClusterConnectionError) as error:
                results.append(type(error).__name__)
    summary = [(r.call, r.finished, r.dropped, r.failed, r.outcome) for r in fake.calls]
    return results, summary


async def test_the_same_plan_gives_the_same_calls_and_records() -> None:
    first = await play_a_plan()
    assert await play_a_plan() == first
    results, summary = first
    assert summary[2] == (3, ids(5), [], ["c5"], "raised")  # every client before c5, always
    assert results == [
        list(range(8)),
        [0, 1, 2, 4, 5, 6, 7],
        "ClientError",
        "ClusterConnectionError",
    ]


async def test_asyncio_and_trio_play_a_plan_alike(anyio_backend: str) -> None:
    other = "trio" if anyio_backend == "asyncio" else "asyncio"
    there = await anyio.to_thread.run_sync(functools.partial(anyio.run, play_a_plan, backend=other))
    assert await play_a_plan() == there


# tests/test_argument_probes.py probes each argument; these are the checks it cannot reach.
@pytest.mark.parametrize(
    ("make", "error", "message"),
    [
        (lambda: FakeContext([LoseCluster(call=1), "c3"]), TypeError, r"faults\[1\] must be a"),
        (lambda: FakeContext([SlowCall(MINUTE)]), ValueError, "give FakeContext a clock"),
        (lambda: DropClients([1]), TypeError, "a client of clients must be a non-empty str"),
        (lambda: LoseCluster(call=None), TypeError, "call must be an int >= 1, got NoneType"),
    ],
)
async def test_bad_arguments_are_clear_errors(
    make: Any, error: type[Exception], message: str
) -> None:
    with pytest.raises(error, match=message):
        make()
