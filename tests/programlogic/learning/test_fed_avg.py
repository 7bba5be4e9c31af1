"""FedAvg against TensorFlow Federated's numbers and against FedAvg written in NumPy.

Every process is built once per test session (``functools.cache``) and shared by the
tests and by both backends, because each new process builds its model (processes built
alike share one compiled client function).
Tests that train pass the same clients in the same group shapes for the same reason.
"""

import functools
import math
import pickle
import threading
import tracemalloc

import anyio
import keras
import numpy as np
import pytest
from learning_support import (
    CLASSES,
    FEATURES,
    assert_same_state,
    fed_avg,
    hand_adam,
    hand_sgd,
    handles,
    known_weights,
    make_client,
    ragged_clients,
)

from managers import FileProgramStateManager, MemoryProgramStateManager, MemoryReleaseManager
from programlogic import (
    ClientHandle,
    ClusterConnectionError,
    InMemoryDataSource,
    LocalContext,
    NotEnoughClientsError,
    final_model_key,
    train_model,
)
from programlogic.datasets import ClientArrays, Preprocessing
from programlogic.learning import (
    WeightedFedAvg,
    adam,
    build_weighted_fed_avg,
    sgd,
    softmax_regression,
)
from programlogic.learning.client_update import traced
from programlogic.learning.fed_avg import MAX_CLIENTS_PER_GROUP, plan_group_size
from programlogic.testing import (
    CrashingStateManager,
    DropClients,
    FakeContext,
    LoseCluster,
    SimulatedCrash,
)

pytestmark = pytest.mark.anyio

SMALL_MODEL = functools.partial(softmax_regression, (FEATURES,), CLASSES)
EPOCHS, BATCH = 2, 4
UNSHUFFLED = Preprocessing(epochs=EPOCHS, batch_size=BATCH, shuffle_buffer=0)


async def train(process: WeightedFedAvg, state, rounds: list[list[ClientHandle]]):
    """The state and metrics after each of ``rounds``."""
    history = []
    async with LocalContext(max_workers=2):
        for clients in rounds:
            output = await process.next(state, clients)
            state = output.state
            history.append((state, output.metrics))
    return history


def assert_metrics_match(metrics, expected) -> None:
    train_metrics = metrics["client_work"]["train"]
    for name in ("loss", "sparse_categorical_accuracy"):
        assert train_metrics[name] == pytest.approx(expected[name], rel=1e-5), name
    assert train_metrics["num_examples"] == expected["num_examples"]
    assert train_metrics["num_batches"] == expected["num_batches"]
    assert train_metrics["num_non_finite_clients"] == 0
    assert metrics["finalizer"] == {"update_non_finite": 0}


# Parity with TensorFlow Federated 0.87 (../shared/anchors/tff_fedavg.py --no-shuffle).


@functools.cache
def anchor_clients() -> list[ClientHandle]:
    rng = np.random.default_rng(0)
    clients = {}
    for index in range(10):
        x = rng.random((100, 784), dtype=np.float32)
        y = rng.integers(0, 10, (100, 1)).astype(np.int32).reshape(100)
        clients[str(index)] = ClientArrays(x, y)
    return handles(clients)


@functools.cache
def anchor_process() -> WeightedFedAvg:
    return build_weighted_fed_avg(
        functools.partial(softmax_regression, (784,), 10),
        sgd(0.02),
        sgd(1.0),
        preprocess=Preprocessing(epochs=5, batch_size=5, shuffle_buffer=0),
    )


async def test_losses_equal_tensorflow_federated_on_the_anchor_clients() -> None:
    process = anchor_process()
    history = await train(process, process.initialize(), [anchor_clients()] * 3)

    losses = [metrics["client_work"]["train"]["loss"] for _, metrics in history]
    assert losses == pytest.approx([2.0536001, 1.9509841, 1.8549443], rel=1e-5)
    for _, metrics in history:
        assert metrics["client_work"]["train"]["num_examples"] == 5000
        assert metrics["client_work"]["train"]["num_batches"] == 1000
    assert [state["round"] for state, _ in history] == [1, 2, 3]


# FedAvg in NumPy on ragged clients: padded batches, masked examples, padded groups.


@functools.cache
def reference_process(clients_per_group: int) -> WeightedFedAvg:
    return build_weighted_fed_avg(
        SMALL_MODEL,
        sgd(0.5, momentum=0.5),
        sgd(1.0),
        preprocess=UNSHUFFLED,
        clients_per_group=clients_per_group,
    )


@pytest.mark.parametrize("clients_per_group", [3, 2], ids=["one-group", "a-padded-group"])
async def test_two_rounds_equal_fed_avg_written_in_numpy(clients_per_group: int) -> None:
    # Clients of 3, 7 and 12 examples hold 2, 4 and 6 batches of 4, their last batch
    # partial for the first two; in groups of 2 the last group is padded with an
    # empty client. Client momentum makes any step taken on padding visible.
    process = reference_process(clients_per_group)
    start = process.set_model_weights(process.initialize(), known_weights())
    clients = handles(ragged_clients())

    history = await train(process, start, [clients, clients[::-1]])

    data = list(ragged_clients().values())
    expected = fed_avg(
        known_weights()["trainable"],
        [data, data[::-1]],
        hand_sgd(0.5, momentum=0.5),
        hand_sgd(1.0),
        epochs=EPOCHS,
        batch_size=BATCH,
    )
    assert expected[0][1]["num_examples"] == 44 and expected[0][1]["num_batches"] == 12
    for (state, metrics), (weights, expected_metrics) in zip(history, expected, strict=True):
        trainable = process.get_model_weights(state)["trainable"]
        for actual, wanted in zip(trainable, weights, strict=True):
            assert actual.dtype == np.float32
            np.testing.assert_allclose(actual, wanted, rtol=1e-5, atol=1e-6)
        assert_metrics_match(metrics, expected_metrics)
    # The model moved: the comparison is not between two untouched models.
    assert not np.allclose(trainable[0], known_weights()["trainable"][0], atol=1e-2)


async def test_batches_gathered_in_the_loop_train_as_batches_gathered_ahead(monkeypatch) -> None:
    # Groups whose batches would take more than GATHER_AHEAD_BYTES gather each batch in
    # the compiled loop; a client optimizer no other test uses gives a function of its
    # own, traced with that limit.
    monkeypatch.setattr(traced, "GATHER_AHEAD_BYTES", 0)
    process = build_weighted_fed_avg(
        SMALL_MODEL, sgd(0.5, momentum=0.25), sgd(1.0), preprocess=UNSHUFFLED, clients_per_group=2
    )
    start = process.set_model_weights(process.initialize(), known_weights())
    clients = handles(ragged_clients())

    history = await train(process, start, [clients])

    data = list(ragged_clients().values())
    expected = fed_avg(
        known_weights()["trainable"],
        [data],
        hand_sgd(0.5, momentum=0.25),
        hand_sgd(1.0),
        epochs=EPOCHS,
        batch_size=BATCH,
    )
    (state, metrics), (weights, expected_metrics) = history[0], expected[0]
    for actual, wanted in zip(process.get_model_weights(state)["trainable"], weights, strict=True):
        np.testing.assert_allclose(actual, wanted, rtol=1e-5, atol=1e-6)
    assert_metrics_match(metrics, expected_metrics)


@functools.cache
def server_optimizer_process(name: str) -> WeightedFedAvg:
    optimizers = {
        "adam": (adam(0.05), adam(0.1)),
        "momentum": (sgd(0.5), sgd(0.8, momentum=0.9)),
    }
    client, server = optimizers[name]
    return build_weighted_fed_avg(SMALL_MODEL, client, server, preprocess=UNSHUFFLED)


HAND_OPTIMIZERS = {
    "adam": (hand_adam(0.05), hand_adam(0.1)),
    "momentum": (hand_sgd(0.5), hand_sgd(0.8, momentum=0.9)),
}


@pytest.mark.parametrize("name", ["adam", "momentum"])
async def test_stateful_server_optimizers_equal_numpy_and_round_trip_through_files(
    name: str, tmp_path
) -> None:
    process = server_optimizer_process(name)
    initial = process.initialize()
    start = process.set_model_weights(initial, known_weights())
    clients = handles(ragged_clients())

    history = await train(process, start, [clients, clients])

    data = list(ragged_clients().values())
    client_optimizer, server_optimizer = HAND_OPTIMIZERS[name]
    expected = fed_avg(
        known_weights()["trainable"],
        [data, data],
        client_optimizer,
        server_optimizer,
        epochs=EPOCHS,
        batch_size=BATCH,
    )
    for (state, metrics), (weights, expected_metrics) in zip(history, expected, strict=True):
        for actual, wanted in zip(state["model"]["trainable"], weights, strict=True):
            np.testing.assert_allclose(actual, wanted, rtol=1e-5, atol=1e-6)
        assert_metrics_match(metrics, expected_metrics)

    state = history[-1][0]
    async with FileProgramStateManager(tmp_path) as manager:
        await manager.save(state, 2)
        loaded, version = await manager.load_latest(initial)
    assert version == 2
    assert_same_state(loaded, state)
    # Training on from the loaded state is training on from the state itself.
    (from_loaded, _), (from_state, _) = [
        (await train(process, resumed, [clients]))[0] for resumed in (loaded, state)
    ]
    assert_same_state(from_loaded, from_state)


# Determinism and resuming.


@functools.cache
def shuffled_process(seed: int, instance: int = 0) -> WeightedFedAvg:
    """``instance`` tells apart processes built alike, as a restarted program builds it."""
    del instance
    return build_weighted_fed_avg(
        SMALL_MODEL,
        sgd(0.5),
        preprocess=Preprocessing(epochs=EPOCHS, batch_size=BATCH, shuffle_buffer=5),
        seed=seed,
    )


async def test_a_seed_gives_the_same_model_bit_for_bit_and_another_seed_another() -> None:
    clients = handles(ragged_clients())

    async def final_weights(process: WeightedFedAvg) -> list[np.ndarray]:
        start = process.set_model_weights(process.initialize(), known_weights())
        history = await train(process, start, [clients, clients])
        return history[-1][0]["model"]["trainable"]

    first = await final_weights(shuffled_process(1))
    again = await final_weights(shuffled_process(1, instance=1))
    other = await final_weights(shuffled_process(2))
    unshuffled = await final_weights(reference_process(3))

    for a, b in zip(first, again, strict=True):
        assert a.tobytes() == b.tobytes()
    assert not np.array_equal(first[0], other[0])
    assert not np.array_equal(first[0], unshuffled[0])


ROUNDS = 4


async def run_program(process: WeightedFedAvg, state_manager, context=None) -> tuple:
    models, metrics = MemoryReleaseManager(), MemoryReleaseManager()
    async with context or LocalContext(max_workers=2):
        result = await train_model(
            train_process=process,
            train_data_source=InMemoryDataSource(ragged_clients()),
            train_per_round_clients=3,
            train_total_rounds=ROUNDS,
            program_state_manager=state_manager,
            model_output_manager=models,
            train_metrics_manager=metrics,
            seed=5,
        )
    return result, models.values(), metrics.values()


async def test_a_run_resumed_after_a_crash_ends_with_the_uninterrupted_model() -> None:
    reference, reference_models, reference_metrics = await run_program(
        shuffled_process(1), MemoryProgramStateManager()
    )

    state = MemoryProgramStateManager()
    with pytest.raises(SimulatedCrash):
        await run_program(shuffled_process(1), CrashingStateManager(state, 2, after_save=True))
    # The rerun builds its process anew, as a restarted program does.
    result, models, metrics = await run_program(shuffled_process(1, instance=1), state)

    assert result.resumed_from == 2 and result.round_num == ROUNDS
    assert_same_state(result.state, reference.state)
    final = final_model_key(ROUNDS)
    assert list(models) == [final]
    assert_same_state(models[final], reference_models[final])
    # The rerun releases again the metrics of the round it resumed from, then the rest.
    assert metrics == {r: reference_metrics[r] for r in range(2, ROUNDS + 1)}
    assert list(reference_metrics) == list(range(1, ROUNDS + 1))
    assert reference.state["round"] == ROUNDS


async def test_train_model_releases_the_clients_dropped_in_each_round() -> None:
    fake = FakeContext([DropClients(["b"], call=2)], max_workers=2)
    result, _, metrics = await run_program(shuffled_process(1), MemoryProgramStateManager(), fake)
    assert result.round_num == ROUNDS
    dropped = [metrics[r]["client_work"]["train"]["num_dropped_clients"] for r in metrics]
    assert dropped == [0, 1, 0, 0]
    assert [record.dropped for record in fake.calls] == [[], ["b"], [], []]


async def test_too_few_clients_fail_the_run_and_a_rerun_ends_with_the_uninterrupted_model(
    tmp_path,
) -> None:
    reference, reference_models, _ = await run_program(
        shuffled_process(1), MemoryProgramStateManager()
    )
    # A deadline drops 2 of the 3 clients of round 2; the rerun loses the cluster in
    # its first round (call 3); the next rerun finishes. LocalContext(max_workers=2)
    # groups the clients alike, so the models are the same bits.
    faults = [DropClients(["a", "c"], call=2), LoseCluster(call=3)]
    fake = FakeContext(faults, min_clients=2, max_workers=2)
    for error in (NotEnoughClientsError, ClusterConnectionError):
        with pytest.raises(error) as caught:
            async with FileProgramStateManager(tmp_path) as state:
                await run_program(shuffled_process(1), state, fake)
        assert caught.value is fake.calls[-1].error
    async with FileProgramStateManager(tmp_path) as state:
        result, models, _ = await run_program(shuffled_process(1, instance=1), state, fake)

    assert result.resumed_from is not None and result.round_num == ROUNDS
    final = final_model_key(ROUNDS)
    assert_same_state(models[final], reference_models[final])
    assert_same_state(result.state, reference.state)


# Non-finite client updates.


@functools.cache
def nan_clients() -> dict[str, ClientArrays]:
    """Clients of 12 examples (the group shape of the ragged clients) with a NaN input."""
    return {f"nan{i}": make_client(12, 50 + i, nan_at=i + 4) for i in range(3)}


async def test_a_client_with_nan_data_is_left_out_of_the_average() -> None:
    process = reference_process(3)
    start = process.set_model_weights(process.initialize(), known_weights())
    finite = handles(ragged_clients())
    with_nan = [*finite, handles(nan_clients())[0]]

    ((without_state, without_metrics),) = await train(process, start, [finite])
    ((state, metrics),) = await train(process, start, [with_nan])

    assert_same_state(state["model"], without_state["model"])
    train_metrics = metrics["client_work"]["train"]
    assert train_metrics["num_non_finite_clients"] == 1
    assert metrics["finalizer"] == {"update_non_finite": 0}
    # As in TFF, the metrics still sum over every client that trained, the NaN one too.
    assert (
        train_metrics["num_examples"]
        == without_metrics["client_work"]["train"]["num_examples"] + 2 * 12
    )
    assert math.isnan(train_metrics["loss"])


async def test_a_round_whose_every_update_is_non_finite_leaves_the_model_unchanged() -> None:
    process = reference_process(3)
    start = process.set_model_weights(process.initialize(), known_weights())

    ((state, metrics),) = await train(process, start, [handles(nan_clients())])

    assert_same_state(state["model"], start["model"])
    assert_same_state(state["server_optimizer"], start["server_optimizer"])
    assert state["round"] == 1
    assert metrics["client_work"]["train"]["num_non_finite_clients"] == 3


# Model weights in and out of the state.


async def test_model_weights_round_trip_and_keep_the_rest_of_the_state() -> None:
    process = server_optimizer_process("adam")
    state = {**process.initialize(), "round": 7}
    weights = known_weights()

    updated = process.set_model_weights(state, weights)

    assert_same_state(process.get_model_weights(updated), weights)
    assert updated["round"] == 7
    assert_same_state(updated["server_optimizer"], state["server_optimizer"])
    assert_same_state(process.get_model_weights(state), process.initialize()["model"])


async def test_set_model_weights_refuses_a_wrong_shape() -> None:
    process = reference_process(3)
    weights = known_weights()
    weights["trainable"][0] = weights["trainable"][0].T
    with pytest.raises(ValueError, match=r"trainable\[0\] .* has shape \(3, 8\), .* \(8, 3\)"):
        process.set_model_weights(process.initialize(), weights)


# Arguments.


@pytest.mark.parametrize(
    ("arguments", "error", "message"),
    [
        (
            {"client_optimizer": keras.optimizers.Nadam()},
            TypeError,
            "client_optimizer must be a programlogic.learning optimizer .*, got Nadam",
        ),
        (
            {"server_optimizer": "adam"},
            TypeError,
            "server_optimizer must be a programlogic.learning optimizer .*, got str",
        ),
        ({"preprocess": {"epochs": 1}}, TypeError, "preprocess must be a Preprocessing, got dict"),
        ({"seed": -1}, ValueError, "seed must be an int >= 0, got -1"),
        ({"seed": 1.0}, TypeError, r"seed must be an int >= 0, got float 1\.0"),
        (
            {"clients_per_group": 0},
            ValueError,
            "clients_per_group must be an int >= 1 or None, got 0",
        ),
        ({"clients_per_group": True}, TypeError, "clients_per_group must be an int >= 1"),
        ({"metrics": ["no_such_metric"]}, ValueError, "no metric named 'no_such_metric'"),
    ],
    ids=[
        "client-optimizer",
        "server-optimizer",
        "preprocess",
        "seed",
        "float-seed",
        "group-0",
        "group-bool",
        "metric",
    ],
)
async def test_build_refuses_bad_arguments(arguments, error, message) -> None:
    with pytest.raises(error, match=message):
        build_weighted_fed_avg(SMALL_MODEL, **arguments)


async def test_a_round_needs_clients() -> None:
    process = reference_process(3)
    async with LocalContext(max_workers=2):
        with pytest.raises(ValueError, match="a FedAvg round needs at least one client, got none"):
            await process.next(process.initialize(), [])


@pytest.mark.parametrize(
    ("num_clients", "parallelism", "clients_per_group", "expected"),
    [
        (10, 2, None, 5),  # the round split evenly over the workers
        (100, 2, None, 50),
        (11, 2, None, 6),
        (1, 2, None, 1),
        (10, 1, None, 10),
        (1000, 2, None, 63),  # 16 groups: none above MAX_CLIENTS_PER_GROUP
        (10_000, 2, None, 62),  # 162 groups; 158 asked of 64 would make 157, one alone
        (200, 3, None, 34),  # 6 groups, a multiple of the parallelism
        (10, 2, 4, 4),  # given explicitly
        (3, 2, 8, 3),  # never more than the round
    ],
)
async def test_the_default_group_size_splits_a_round_over_the_workers(
    num_clients: int, parallelism: int, clients_per_group: int | None, expected: int
) -> None:
    size = plan_group_size(num_clients, parallelism, clients_per_group)
    assert size == expected
    if clients_per_group is None:
        assert size <= MAX_CLIENTS_PER_GROUP
        assert math.ceil(num_clients / size) % parallelism == 0 or num_clients < parallelism


async def test_the_default_grouping_gives_the_model_of_explicit_groups_of_that_size() -> None:
    # Six ragged clients on two workers: by default two groups of three.
    clients = {
        f"{name}{copy}": data for copy in range(2) for name, data in ragged_clients().items()
    }
    models = []
    for clients_per_group in (None, 3):
        process = build_weighted_fed_avg(
            functools.partial(softmax_regression, (FEATURES,), CLASSES),
            sgd(0.1),
            preprocess=Preprocessing(epochs=2, batch_size=4, shuffle_buffer=0),
            clients_per_group=clients_per_group,
        )
        async with LocalContext(max_workers=2):
            output = await process.next(process.initialize(), handles(clients))
        models.append(output.state["model"]["trainable"])
    for default, explicit in zip(*models, strict=True):
        assert np.array_equal(default, explicit)


async def test_dropped_clients_are_counted_and_left_out_of_the_average() -> None:
    process = reference_process(3)
    start = process.set_model_weights(process.initialize(), known_weights())
    clients = handles(ragged_clients())
    ((kept_state, kept_metrics),) = await train(process, start, [clients[:-1]])
    dropping = FakeContext([DropClients([clients[-1].client_id])], max_workers=2)
    async with dropping:
        output = await process.next(start, clients)

    assert dropping.calls[0].dropped == [clients[-1].client_id]
    for a, b in zip(
        output.state["model"]["trainable"], kept_state["model"]["trainable"], strict=True
    ):
        np.testing.assert_allclose(a, b, rtol=1e-6)
    assert output.metrics["client_work"]["train"]["num_dropped_clients"] == 1
    assert kept_metrics["client_work"]["train"]["num_dropped_clients"] == 0
    assert (
        output.metrics["client_work"]["train"]["num_examples"]
        == kept_metrics["client_work"]["train"]["num_examples"]
    )


async def test_the_process_pickles_and_the_copy_trains_the_same_bits() -> None:
    process = reference_process(3)
    copy = pickle.loads(pickle.dumps(process))
    start = process.set_model_weights(process.initialize(), known_weights())
    clients = handles(ragged_clients())
    ((state, metrics),) = await train(process, start, [clients])
    ((copy_state, copy_metrics),) = await train(copy, start, [clients])
    assert_same_state(copy_state, state)
    assert copy_metrics == metrics


# Folding client updates stays off the event loop.

WIDE_FEATURES, WIDE_CLASSES = 512, 7
"""A kernel of 3,584 weights: 28,672 bytes in float64, a size no other array here has."""


@functools.cache
def wide_process() -> WeightedFedAvg:
    return build_weighted_fed_avg(
        functools.partial(softmax_regression, (WIDE_FEATURES,), WIDE_CLASSES),
        sgd(0.1),
        preprocess=UNSHUFFLED,
        clients_per_group=1,
    )


def wide_client(count: int, seed: int) -> ClientArrays:
    rng = np.random.default_rng(seed)
    x = rng.random((count, WIDE_FEATURES), dtype=np.float32)
    return ClientArrays(x, rng.integers(0, WIDE_CLASSES, count).astype(np.int32))


def made_on_a_worker_thread(trace: tracemalloc.Trace) -> bool:
    """Whether the block was allocated by a thread that ``threading`` started."""
    return any(frame.filename == threading.__file__ for frame in trace.traceback)


async def test_the_round_sum_of_client_deltas_is_made_off_the_event_loop_thread() -> None:
    # One worker and groups of one: the worker trains the fourth client after it added
    # the first client's delta to the round's sum (the first group is added once the
    # second is in, and a worker takes at most the next group's training before it), so
    # the sum (a kernel-sized float64 array) is alive when the fourth client's data
    # loads; that loader looks which thread allocated it.
    process = wide_process()
    start = process.initialize()
    kernel_bytes = WIDE_FEATURES * WIDE_CLASSES * np.dtype(np.float64).itemsize
    datas = [wide_client(count, seed) for seed, count in enumerate((5, 9, 12, 7))]
    round_sums: list[tracemalloc.Trace] = []

    def load_and_look(data: ClientArrays) -> ClientArrays:
        if tracemalloc.is_tracing():
            snapshot = tracemalloc.take_snapshot()
            round_sums.extend(t for t in snapshot.traces if t.size == kernel_bytes)
        return data

    clients = [
        *handles({"0": datas[0], "1": datas[1], "2": datas[2]}),
        ClientHandle("3", functools.partial(load_and_look, datas[3])),
    ]
    async with LocalContext(max_workers=1):
        warm = await process.next(start, clients)  # traced and compiled before tracemalloc runs
        tracemalloc.start(25)
        try:
            output = await process.next(start, clients)
        finally:
            tracemalloc.stop()

    assert round_sums, "the round's running sum was not found"
    on_the_loop = [trace for trace in round_sums if not made_on_a_worker_thread(trace)]
    assert not on_the_loop, [trace.traceback.format()[-2:] for trace in on_the_loop]
    assert_same_state(output.state, warm.state)


async def test_two_new_processes_compiling_side_by_side_train_as_each_does_alone() -> None:
    # Two runs starting in one service: their threads build, trace and compile at once
    # (one at a time under the learning package's graph lock), then train in parallel.
    clients = handles(ragged_clients())
    start = shuffled_process(1).set_model_weights(shuffled_process(1).initialize(), known_weights())
    side_by_side = {}

    async def first_round(seed: int) -> None:
        process = build_weighted_fed_avg(
            SMALL_MODEL,
            sgd(0.5),
            preprocess=Preprocessing(epochs=EPOCHS, batch_size=BATCH, shuffle_buffer=5),
            seed=seed,
        )
        ((side_by_side[seed], _),) = await train(process, start, [clients])

    async with anyio.create_task_group() as group:
        for seed in (1, 2):
            group.start_soon(first_round, seed)

    for seed in (1, 2):
        ((alone, _),) = await train(shuffled_process(seed), start, [clients])
        assert_same_state(side_by_side[seed], alone)
