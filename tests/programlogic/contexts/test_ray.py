"""RayContext on real Ray clusters of this machine (2 CPUs).

One cluster of two nodes (1 CPU each, ``ray.cluster_utils.Cluster``) serves the module;
each test connects a RayContext to it, as a main job connects to a multi-machine
cluster. The tests that train run under asyncio only (marked below): starting Ray and
compiling on its workers is what costs, and awaiting object references under trio is
covered by the tests that run under both backends.
"""

from __future__ import annotations

import datetime
import functools
import os
import signal
import sys
import time
from pathlib import Path

import anyio
import numpy as np
import pytest

ray = pytest.importorskip("ray")
from ray.cluster_utils import Cluster  # noqa: E402

from programlogic import (  # noqa: E402
    ClientError,
    ClientHandle,
    InMemoryDataSource,
    LocalContext,
    NotEnoughClientsError,
    count_dropped_clients,
)
from programlogic.contexts.ray import RayContext  # noqa: E402
from programlogic.learning import build_weighted_fed_avg, softmax_regression  # noqa: E402
from programlogic.tasks import task_group  # noqa: E402

pytestmark = pytest.mark.anyio
asyncio_only = pytest.mark.parametrize("anyio_backend", ["asyncio"])

# The workers import this module's functions by value: they cannot import the tests.
ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])

FEATURES, CLASSES = 8, 3


@pytest.fixture(scope="module")
def cluster():
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1})
    cluster.add_node(num_cpus=1)
    cluster.wait_for_nodes()
    yield cluster
    cluster.shutdown()


def make_clients() -> dict[str, tuple[np.ndarray, np.ndarray]]:
    from programlogic.datasets import ClientArrays

    clients = {}
    for index, count in enumerate([3, 7, 12, 5, 9, 4]):
        rng = np.random.default_rng(index)
        x = rng.random((count, FEATURES), dtype=np.float32)
        y = rng.integers(0, CLASSES, count).astype(np.int32)
        clients[f"c{index}"] = ClientArrays(x, y)
    return clients


def fed_avg():
    return build_weighted_fed_avg(
        functools.partial(softmax_regression, (FEATURES,), CLASSES), seed=3
    )


async def train(context, clients: list[ClientHandle], rounds: int) -> list[tuple]:
    """The state and metrics after each round of FedAvg on ``clients`` in ``context``."""
    process = fed_avg()
    history = []
    async with context:
        state = process.initialize()
        for _ in range(rounds):
            output = await process.next(state, clients)
            state = output.state
            history.append((state, output.metrics))
    return history


_local_history: list[tuple] = []


async def local_history() -> list[tuple]:
    """FedAvg's 5 rounds on LocalContext with 2 workers, computed once."""
    if not _local_history:
        clients = InMemoryDataSource(make_clients()).all_clients()
        _local_history.extend(await train(LocalContext(max_workers=2), clients, 5))
    return _local_history


def assert_same_bits(actual, expected) -> None:
    if isinstance(expected, dict):
        assert list(actual) == list(expected)
        for key in expected:
            assert_same_bits(actual[key], expected[key])
    elif isinstance(expected, list | tuple):
        assert len(actual) == len(expected)
        for a, e in zip(actual, expected, strict=True):
            assert_same_bits(a, e)
    elif isinstance(expected, np.ndarray):
        assert actual.dtype == expected.dtype and actual.tobytes() == expected.tobytes()
    else:
        assert actual == expected or (actual != actual and expected != expected)


@asyncio_only
async def test_fed_avg_on_ray_equals_local_context_bit_for_bit(cluster) -> None:
    clients = InMemoryDataSource(make_clients()).all_clients()
    expected = await local_history()
    actual = await train(RayContext(cluster.address, num_workers=2), clients, 5)
    for (state, metrics), (local_state, local_metrics) in zip(actual, expected, strict=True):
        assert_same_bits(state, local_state)
        assert_same_bits(metrics, local_metrics)
        assert metrics["client_work"]["train"]["num_dropped_clients"] == 0


class KillingLoader:
    """Loads a client's data; the first time (per marker file), kills its worker instead."""

    def __init__(self, data, marker: Path) -> None:
        self.data, self.marker = data, marker

    def __call__(self):
        if not self.marker.exists():
            self.marker.write_text(str(os.getpid()))
            os.kill(os.getpid(), signal.SIGKILL)
        return self.data


@asyncio_only
async def test_a_worker_killed_mid_round_is_retried_and_the_model_equals_the_fault_free_run(
    cluster, tmp_path: Path
) -> None:
    data = make_clients()
    clients = [
        ClientHandle(
            cid,
            KillingLoader(arrays, tmp_path / "killed")
            if cid == "c4"
            else functools.partial(_same, arrays),
        )
        for cid, arrays in sorted(data.items())
    ]
    actual = await train(RayContext(cluster.address, num_workers=2), clients, 2)
    assert (tmp_path / "killed").exists()  # a worker died in round 1
    expected = await local_history()
    for (state, metrics), (local_state, local_metrics) in zip(actual, expected, strict=False):
        assert_same_bits(state, local_state)
        assert_same_bits(metrics, local_metrics)


def _same(data):
    return data


def slow_when_asked(broadcast, client_id: str, data):
    if client_id.startswith("slow"):
        time.sleep(120)
    return broadcast + data


@asyncio_only
async def test_a_deadline_drops_the_slow_client_and_counts_it(cluster) -> None:
    source = InMemoryDataSource({"a": 1, "b": 2, "slow": 3, "d": 4})
    async with RayContext(cluster.address, num_workers=2, round_deadline=3) as context:
        started = time.monotonic()
        with count_dropped_clients() as dropped:
            results = await context.map_clients(slow_when_asked, 10, source.all_clients())
        assert time.monotonic() - started < 20
        assert results == [11, 12, 14]
        assert dropped.client_ids == ["slow"]
        # The straggler's worker was replaced: the next call has the whole pool.
        with count_dropped_clients() as dropped:
            total = await context.aggregate_clients(
                slow_when_asked, 0, source.all_clients()[:2], lambda t, r: t + r, 0
            )
        assert (total, dropped.count) == (3, 0)


@asyncio_only
async def test_fewer_clients_than_min_clients_fails_the_round_clearly(cluster) -> None:
    source = InMemoryDataSource({"a": 1, "b": 2, "slow": 3})
    async with RayContext(
        cluster.address, num_workers=2, round_deadline=datetime.timedelta(seconds=2), min_clients=3
    ) as context:
        with pytest.raises(NotEnoughClientsError) as caught:
            await context.map_clients(slow_when_asked, 0, source.all_clients())
    assert (caught.value.finished, caught.value.required, caught.value.dropped) == (2, 3, 1)
    assert "only 2 clients finished the round, at least 3 are needed" in str(caught.value)


def failing(broadcast, client_id: str, data):
    raise ValueError(f"no data for {client_id}")


async def test_client_work_that_raises_names_the_client(cluster) -> None:
    async with RayContext(cluster.address, num_workers=2) as context:
        with pytest.raises(ClientError, match=r"client 'a'.*ValueError: no data for a") as caught:
            await context.map_clients(failing, 0, InMemoryDataSource({"a": 1}).all_clients())
    assert isinstance(caught.value.error, ValueError)


async def test_entered_from_a_running_event_loop_which_keeps_running(cluster) -> None:
    gaps: list[float] = []

    async def tick() -> None:
        last = anyio.current_time()
        while True:
            await anyio.sleep(0.05)
            now = anyio.current_time()
            gaps.append(now - last)
            last = now

    source = InMemoryDataSource({f"c{i}": i for i in range(20)})
    async with anyio.create_task_group() as group:
        group.start_soon(tick)
        async with RayContext(cluster.address, num_workers=2) as context:
            results = await context.map_clients(slow_when_asked, 1, source.all_clients())
            grouped = await context.map_clients(
                lambda b, ids, datas: [b * d for d in datas], 2, source.all_clients(), group_size=7
            )
        group.cancel_scope.cancel()
    assert results == [1 + int(c.client_id[1:]) for c in source.all_clients()]
    assert grouped == [2 * int(c.client_id[1:]) for c in source.all_clients()]
    # Connecting, starting the pool and shutting down take seconds, all off the event
    # loop; what remains is the GIL that ray.init holds for up to about a second.
    assert max(gaps) < 2.0


async def test_concurrent_calls_share_the_pool(cluster) -> None:
    source = InMemoryDataSource({f"c{i}": i for i in range(6)})
    results: dict[str, list] = {}

    async def call(name: str, broadcast: int) -> None:
        results[name] = await context.map_clients(slow_when_asked, broadcast, source.all_clients())

    async with RayContext(cluster.address, num_workers=1) as context:
        async with anyio.create_task_group() as group:
            group.start_soon(call, "training", 100)
            group.start_soon(call, "evaluation", 200)
    assert results["training"] == [100 + i for i in range(6)]
    assert results["evaluation"] == [200 + i for i in range(6)]


LOST_DRIVER = """
import sys
from pathlib import Path

import anyio

from managers import FileProgramStateManager, MemoryReleaseManager
from programlogic import ClusterConnectionError, train_model
from programlogic.contexts.ray import RayContext
from programlogic.testing import FakeDataSource, FakeLearningProcess


async def main(address, state_dir, more_rounds):
    async with (
        RayContext(address, num_workers=1, health_check_interval=0.2),
        FileProgramStateManager(Path(state_dir), keep_total=2) as state,
    ):
        saved = max(await state.get_versions(), default=0)
        result = await train_model(
            train_process=FakeLearningProcess(),
            train_data_source=FakeDataSource(8),
            train_per_round_clients=4,
            train_total_rounds=saved + more_rounds,
            program_state_manager=state,
            model_output_manager=MemoryReleaseManager(),
        )
    print("saved", saved, "resumed_from", result.resumed_from, "round", result.round_num)


try:
    anyio.run(main, sys.argv[1], sys.argv[2], int(sys.argv[3]))
except ClusterConnectionError as error:
    sys.exit(f"ClusterConnectionError: {error}")
"""


@asyncio_only
async def test_a_lost_cluster_fails_training_clearly_and_a_rerun_resumes(
    cluster, tmp_path: Path
) -> None:
    # The driver runs in a process of its own: when its cluster dies under it, Ray may
    # end the driver process too (its own behaviour), which must not end the tests.
    doomed = Cluster(initialize_head=True, head_node_args={"num_cpus": 1})
    state_dir = tmp_path / "state"
    environment = {**os.environ, "PYTHONPATH": os.getcwd()}

    async def kill_the_cluster_after_round_3() -> None:
        while not any(path.name.endswith("3") for path in _listing(state_dir)):
            await anyio.sleep(0.05)
        await anyio.to_thread.run_sync(
            functools.partial(doomed.head_node.kill_all_processes, check_alive=False)
        )

    try:
        async with task_group() as group:
            group.start_soon(kill_the_cluster_after_round_3)
            lost = await anyio.run_process(
                [sys.executable, "-c", LOST_DRIVER, doomed.address, str(state_dir), "100000"],
                check=False,
                env=environment,
            )
    finally:
        doomed.shutdown()
    assert lost.returncode == 1
    assert (
        "ClusterConnectionError: lost the connection to the Ray cluster"
        in (lost.stderr.decode().strip().splitlines()[-1])
    )
    rerun = await anyio.run_process(
        [sys.executable, "-c", LOST_DRIVER, cluster.address, str(state_dir), "2"],
        check=False,
        env=environment,
    )
    assert rerun.returncode == 0, rerun.stderr.decode()[-2000:]
    _, saved, _, resumed_from, _, round_num = rerun.stdout.decode().split()
    assert int(saved) >= 3
    assert (int(resumed_from), int(round_num)) == (int(saved), int(saved) + 2)


def _listing(directory: Path) -> list[Path]:
    return list(directory.iterdir()) if directory.exists() else []


async def test_leaves_a_cluster_it_connected_to_running(cluster) -> None:
    async with RayContext(cluster.address, num_workers=1) as context:
        assert context.owns_connection
        assert ray.is_initialized()
    assert not ray.is_initialized()
    async with RayContext(cluster.address, num_workers=1) as context:  # still there
        assert await context.map_clients(slow_when_asked, 1, [ClientHandle("a", _one)]) == [2]


def _one() -> int:
    return 1


@asyncio_only
async def test_leaves_a_ray_connection_it_did_not_open_open(cluster) -> None:
    await anyio.to_thread.run_sync(functools.partial(ray.init, address=cluster.address))
    try:
        async with RayContext(num_workers=1) as context:
            assert not context.owns_connection
            assert await context.map_clients(slow_when_asked, 1, [ClientHandle("a", _one)]) == [2]
        assert ray.is_initialized()
    finally:
        await anyio.to_thread.run_sync(ray.shutdown)


@pytest.mark.parametrize(
    ("arguments", "error", "message"),
    [
        ({"address": ""}, ValueError, "address must be a non-empty str or None, got ''"),
        ({"num_workers": 0}, ValueError, "num_workers must be an int >= 1 or None, got 0"),
        ({"num_workers": 1.5}, TypeError, "num_workers must be an int >= 1 or None, got float 1.5"),
        (
            {"resources_per_worker": 2},
            TypeError,
            "resources_per_worker must be a Mapping, got int",
        ),
        ({"resources_per_worker": {"CPU": -1}}, ValueError, "must be a number >= 0, got -1"),
        ({"round_deadline": 0}, ValueError, "round_deadline must be a number > 0 or None, got 0"),
        ({"round_deadline": "soon"}, TypeError, "round_deadline must be a number > 0"),
        ({"min_clients": 0}, ValueError, "min_clients must be an int >= 1, got 0"),
        ({"max_retries": -1}, ValueError, "max_retries must be an int >= 0, got -1"),
        ({"health_check_interval": 0}, ValueError, "health_check_interval must be a number > 0"),
        ({"init_options": [1]}, TypeError, "init_options must be a Mapping or None, got list"),
    ],
)
async def test_bad_arguments_are_clear_errors(arguments, error, message) -> None:
    with pytest.raises(error, match=message.replace("(", r"\(").replace(")", r"\)")):
        RayContext(**arguments)


@asyncio_only
async def test_resources_the_cluster_cannot_meet_are_a_clear_error_on_entering(cluster) -> None:
    context = RayContext(cluster.address, resources_per_worker={"GPU": 1})
    with pytest.raises(ValueError, match="resources_per_worker asks 1 GPU per worker"):
        async with context:
            pass
    assert not ray.is_initialized()


async def test_work_outside_the_context_is_a_clear_error() -> None:
    with pytest.raises(RuntimeError, match="RayContext is not entered"):
        await RayContext().map_clients(_same, 0, [ClientHandle("a", _one)])


@asyncio_only
async def test_shuts_down_the_local_cluster_it_started() -> None:
    # Last in the module: Ray cannot connect to another cluster from a process that
    # shut down a local cluster it had started (actors created then never start).
    async with RayContext(num_workers=1, init_options={"num_cpus": 1}) as context:
        assert context.owns_connection
        host, _, port = ray.get_runtime_context().gcs_address.rpartition(":")
        assert await context.map_clients(slow_when_asked, 1, [ClientHandle("a", _one)]) == [2]
    assert not ray.is_initialized()
    with pytest.raises(OSError):
        await anyio.connect_tcp(host, int(port))
