"""The contract of :class:`~programlogic.context.FederatedContext`, as tests a backend runs.

Subclass :class:`FederatedContextContract` in a test file, name the subclass ``Test...``
and override its ``make_context`` fixture to return a callable that builds a new,
not yet entered context of yours::

    import pytest

    from programlogic.testing.contracts import FederatedContextContract

    class TestMyContext(FederatedContextContract):
        @pytest.fixture
        def make_context(self):
            return lambda: MyContext(workers=2)

Some tests build two contexts at once (nesting, two programs in one event loop). The
client work and server steps of the suite are module-level functions of this module,
so a backend that runs work in other processes can import them there (Ray: register
this module with ``ray.cloudpickle.register_pickle_by_value`` if the workers cannot
import it). They coordinate through files in the test's ``tmp_path``, so the suite
works whether client work runs on threads of this process or on other processes of
this machine; a backend whose work runs on other machines needs a shared ``tmp_path``.
"""

from __future__ import annotations

import functools
import os
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import anyio
import pytest

from programlogic.context import FederatedContext, check_in_federated_context, get_context
from programlogic.data import ClientHandle
from programlogic.exceptions import ClientError, NoFederatedContextError
from programlogic.testing.contracts._base import Contract

__all__ = ["FederatedContextContract"]

WAIT_LIMIT_S = 60.0
"""How long a piece of the suite's work waits for a file another piece writes.

The wait ends as soon as the file appears; the limit only matters when the context
breaks a promise (the file never comes), and then the test fails instead of hanging.
"""

WORK_S = 1.0
"""How long the client work of the cancellation test computes (it is cancelled meanwhile)."""


class FederatedContextContract(Contract):
    """The promises every :class:`~programlogic.context.FederatedContext` keeps.

    Override the ``make_context`` fixture: a zero-argument callable returning a new,
    not yet entered context. Set ``streams_aggregation = False`` if the context keeps
    the base class's ``aggregate_clients``, which folds the results once every client
    has finished instead of as they arrive. To leave out a test that cannot apply to
    your backend, set its name to ``None`` in your subclass, and say why there.

    Beyond the base class's docstring, the suite holds a context to habits of the
    library's backends: ``run`` and ``map_clients`` on a context that is not entered
    raise ``RuntimeError`` saying it is "not entered"; an invalid ``group_size`` is a
    ``ValueError`` naming it; a ``ClientError`` keeps the client's error as its
    ``__cause__`` even when it comes from another process; and a cancelled call
    returns only once the client work it started has finished or been interrupted
    (work cut short runs its ``finally`` clauses, or its process is gone).
    """

    streams_aggregation: bool = True
    """Whether ``aggregate_clients`` folds each result as soon as every earlier one is in."""

    @pytest.fixture
    def make_context(self) -> Callable[[], FederatedContext]:
        """A callable building a new, not yet entered context (override this fixture)."""
        pytest.fail(
            f"{type(self).__name__} must override the make_context fixture: return a "
            "zero-argument callable that builds a new, not yet entered context"
        )

    # The current context.

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

    # Server-side steps.

    async def test_run_returns_the_result_computed_off_the_event_loop_thread(
        self, make_context: Callable[[], FederatedContext]
    ) -> None:
        async with make_context() as context:
            where = await context.run(_where)
            assert await context.run(pow, 2, 10) == 1024
        assert where != _where()

    async def test_run_lets_the_event_loop_run_while_it_computes(
        self, make_context: Callable[[], FederatedContext], tmp_path: Path
    ) -> None:
        async with make_context() as context, anyio.create_task_group() as group:
            saw_go: list[bool] = []

            async def step() -> None:
                saw_go.append(await context.run(_wait_for_go, str(tmp_path), "step"))

            group.start_soon(step)
            await _until_exists(tmp_path / "started-step")
            (tmp_path / "go").touch()
        assert saw_go == [True]

    async def test_an_error_of_run_propagates_unchanged(
        self, make_context: Callable[[], FederatedContext]
    ) -> None:
        async with make_context() as context:
            with pytest.raises(KeyError, match="server step 3"):
                await context.run(_raise_key_error, "server step 3")
            assert await context.run(pow, 3, 2) == 9

    # Client work.

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

    # Background work.

    async def test_leaving_the_context_cancels_its_unfinished_background_work(
        self, make_context: Callable[[], FederatedContext]
    ) -> None:
        started, outcome = anyio.Event(), []

        async def forever() -> None:
            started.set()
            try:
                await anyio.sleep_forever()
            finally:
                outcome.append("cancelled")

        async with make_context() as context:
            context.background.start_soon(forever)
            await started.wait()
        assert outcome == ["cancelled"]

    async def test_a_background_failure_nobody_collected_is_raised_on_leaving(
        self, make_context: Callable[[], FederatedContext]
    ) -> None:
        progress: list[str] = []

        async def fail() -> None:
            raise KeyError("evaluation of round 3")

        with pytest.raises(KeyError, match="evaluation of round 3"):
            async with make_context() as context:
                context.background.start_soon(fail)
                await anyio.wait_all_tasks_blocked()
                progress.append("the program went on")
        assert progress == ["the program went on"]


# The work of the suite: module-level functions, so that workers can import them.


def _constant(value: Any) -> Any:
    return value


def _handles(count: int) -> list[ClientHandle]:
    """Clients ``c0``, ``c1``, ... whose data is their index."""
    return [ClientHandle(f"c{i}", functools.partial(_constant, i)) for i in range(count)]


def _where(*_: Any) -> tuple[int, int]:
    """The process and thread this runs on."""
    return os.getpid(), threading.get_ident()


def _echo(broadcast: Any, client_id: str, data: Any) -> tuple[Any, str, Any]:
    return broadcast, client_id, data


def _data_of(broadcast: Any, client_id: str, data: Any) -> Any:
    return data


def _group_echo(broadcast: int, client_ids: Sequence[str], datas: Sequence[int]) -> list[tuple]:
    return [
        (cid, broadcast + data, len(client_ids))
        for cid, data in zip(client_ids, datas, strict=True)
    ]


def _append(total: list[Any], result: Any) -> list[Any]:
    return [*total, result]


def _add_value(total: int, result: tuple[str, int, int]) -> int:
    return total + result[1]


def _raise_key_error(message: str) -> None:
    raise KeyError(message)


def _broken_loader() -> Any:
    raise FileNotFoundError("the client's file is gone")


def _fail_on_c3(broadcast: Any, client_id: str, data: Any) -> Any:
    if client_id == "c3":
        raise ZeroDivisionError("no examples on c3")
    return data


def _group_fail_on_c3(broadcast: Any, client_ids: Sequence[str], datas: Sequence[Any]) -> list:
    if "c3" in client_ids:
        raise ZeroDivisionError("no examples on c3")
    return list(datas)


def _wait_until_exists(path: Path) -> bool:
    """Whether ``path`` appeared within :data:`WAIT_LIMIT_S` (checked every few ms)."""
    deadline = time.monotonic() + WAIT_LIMIT_S
    while not path.exists():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.002)
    return True


def _wait_for_go(directory: str, client_id: str, data: Any = None) -> bool:
    """Mark this work started, wait for the file ``go``, mark it ended; whether go came."""
    folder = Path(directory)
    (folder / f"started-{client_id}").touch()
    try:
        return _wait_until_exists(folder / "go")
    finally:
        (folder / f"ended-{client_id}").touch()


def _finish_pairs_in_reverse(
    broadcast: tuple[str, int, int], client_id: str, data: int
) -> tuple[str, int]:
    """With parallelism, client 2i waits until client 2i + 1 has finished: results arrive
    out of order."""
    directory, count, parallelism = broadcast
    folder = Path(directory)
    if parallelism >= 2 and data % 2 == 0 and data + 1 < count:
        _wait_until_exists(folder / f"done-c{data + 1}")
    with open(folder / "finished", "a") as log:  # one short append: atomic
        log.write(f"{client_id}\n")
    (folder / f"done-{client_id}").touch()
    return client_id, data * 10


def _last_waits_for_the_first_to_be_folded(
    broadcast: tuple[str, int], client_id: str, data: int
) -> bool | None:
    """The last client returns whether the first client's result was folded before it ended."""
    consumed, count = broadcast
    if data != count - 1:
        return None
    return _wait_until_exists(Path(consumed))


def _work_a_while(directory: str, client_id: str, data: Any) -> None:
    """Client work of :data:`WORK_S` that marks its start (with its process id) and end."""
    folder = Path(directory)
    partial = folder / f"partial-{client_id}"
    partial.write_text(str(os.getpid()))
    partial.replace(folder / f"started-{client_id}")  # whole, or not there at all
    try:
        time.sleep(WORK_S)
    finally:
        (folder / f"ended-{client_id}").touch()


def _markers(folder: Path, prefix: str) -> dict[str, str]:
    """What the marker files ``<prefix><client id>`` in ``folder`` hold, by client id."""
    return {path.name.removeprefix(prefix): path.read_text() for path in folder.glob(f"{prefix}*")}


def _alive(pid: int) -> bool:
    """Whether the process ``pid`` still runs (this process always does)."""
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


async def _until_exists(path: Path) -> None:
    """Wait on the event loop until ``path`` exists; fail after :data:`WAIT_LIMIT_S`."""
    with anyio.fail_after(WAIT_LIMIT_S):
        while not path.exists():
            await anyio.sleep(0.002)
