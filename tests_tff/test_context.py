"""TFFContext: TFF computations on a thread of its own, and nothing left running after it."""

from __future__ import annotations

import os
import threading

import anyio
import anyio.to_thread
import numpy as np
import pytest
import tensorflow as tf
import tensorflow_federated as tff

from programlogic import ClientError, ClientHandle, LocalContext, get_context
from programlogic.contexts.tff import TFFContext, TFFLearningProcess

pytestmark = pytest.mark.anyio


@tff.tensorflow.computation(np.int32)
def add_one(x):
    return x + 1


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


async def test_computations_run_on_one_thread_of_the_context_off_the_event_loop() -> None:
    # Each call blocks its thread until a task of the event loop has answered it.
    calls = [(threading.Event(), threading.Event()) for _ in range(2)]

    def add_one_once_the_loop_answered(x: int, call: int) -> tuple[int, bool, str]:
        computing, answered = calls[call]
        computing.set()
        loop_ran = answered.wait(30)  # a hang guard: False only if the loop was blocked
        return add_one(x), loop_ran, threading.current_thread().name

    async def answer() -> None:
        for computing, answered in calls:
            assert await anyio.to_thread.run_sync(computing.wait, 30)
            answered.set()

    async with TFFContext() as context, anyio.create_task_group() as group:
        assert get_context() is context
        group.start_soon(answer)
        first, loop_ran_first, thread = await context.run(add_one_once_the_loop_answered, 1, 0)
        second, loop_ran_second, same_thread = await context.run(
            add_one_once_the_loop_answered, first, 1
        )
    assert (first, second) == (2, 3)
    assert loop_ran_first and loop_ran_second
    assert thread == same_thread != threading.current_thread().name


async def test_tff_computations_elsewhere_do_not_use_the_contexts_runtime() -> None:
    async with TFFContext() as context:
        assert await context.run(add_one, 41) == 42
        with pytest.raises(RuntimeError):
            # A thread of its own has no TFF runtime; only the context's thread has one.
            await anyio.to_thread.run_sync(add_one, 1)


async def test_leaving_the_context_stops_tffs_worker_process() -> None:
    context = TFFContext()
    async with context:
        assert context.worker_pid is None  # TFF starts it on the first computation
        assert await context.run(add_one, 1) == 2
        pid = context.worker_pid
        assert pid is not None and alive(pid)
    assert not alive(pid)
    assert context.worker_pid is None
    async with context:  # a fresh runtime
        assert await context.run(add_one, 2) == 3
        assert context.worker_pid not in (None, pid)


async def test_leaving_the_context_on_an_error_stops_its_worker_process() -> None:
    context = TFFContext()
    with pytest.raises(ZeroDivisionError):
        async with context:
            await context.run(add_one, 1)
            pid = context.worker_pid
            await context.run(lambda: 1 / 0)
    assert not alive(pid)


async def test_map_clients_loads_and_runs_every_client_in_order() -> None:
    clients = [ClientHandle(f"c{i}", lambda i=i: tf.constant(i)) for i in range(5)]
    async with TFFContext() as context:
        results = await context.map_clients(
            lambda broadcast, client_id, data: (client_id, int(data) + broadcast), 10, clients
        )
        total = await context.aggregate_clients(
            lambda broadcast, client_id, data: int(data), None, clients, lambda a, b: a + b, 0
        )
        failing = [*clients, ClientHandle("bad", lambda: 1 / 0)]
        with pytest.raises(ClientError) as raised:
            await context.map_clients(lambda b, c, d: d, None, failing)
    assert results == [(f"c{i}", i + 10) for i in range(5)]
    assert total == 10
    assert raised.value.client_ids == ("bad",)


async def test_bad_arguments_and_use_outside_the_context_are_clear_errors(fedavg) -> None:
    with pytest.raises(TypeError, match="default_num_clients must be an int"):
        TFFContext(default_num_clients="3")
    with pytest.raises(ValueError, match="default_num_clients must be an int >= 0, got -1"):
        TFFContext(default_num_clients=-1)
    with pytest.raises(TypeError, match="max_concurrent_computation_calls must be an int"):
        TFFContext(max_concurrent_computation_calls=1.5)
    context = TFFContext()
    with pytest.raises(RuntimeError, match="TFFContext is not entered"):
        await context.run(add_one, 1)
    async with context:
        with pytest.raises(RuntimeError, match="already entered"):
            async with context:
                pass
    process = TFFLearningProcess(fedavg)
    async with LocalContext():
        with pytest.raises(TypeError, match="runs in a TFFContext, but the current context is a"):
            await process.initialize()


@pytest.mark.parametrize("anyio_backend", ["trio"])
async def test_the_context_and_a_process_run_under_trio(fedavg, data_source) -> None:
    process = TFFLearningProcess(fedavg)
    context = TFFContext()
    async with context:
        assert await context.run(add_one, 1) == 2
        state = await process.initialize()
        output = await process.next(state, data_source.iterator(0).select(2, 1))
        pid = context.worker_pid
    assert output.metrics["client_work"]["train"]["num_examples"] > 0
    assert not alive(pid)
