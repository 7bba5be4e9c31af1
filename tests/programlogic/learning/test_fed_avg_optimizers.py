"""FedAvg with each functional optimizer, on the client and on the server.

FedAdam, FedYogi and FedAdagrad (Reddi et al. 2020) are FedAvg with ``adam``, ``yogi``
and ``adagrad`` as the server optimizer, FedAvgM with ``sgd`` with momentum. Their
state is part of the program state: a crashed run, resumed from its files, ends with
the model of the uninterrupted run, bit for bit.
"""

import functools
import itertools
import math

import numpy as np
import pytest
from learning_support import (
    CLASSES,
    FEATURES,
    assert_same_state,
    fed_avg,
    hand_adagrad,
    hand_rmsprop,
    hand_yogi,
    handles,
    known_weights,
    ragged_clients,
)

from managers import FileProgramStateManager, MemoryProgramStateManager, MemoryReleaseManager
from programlogic import InMemoryDataSource, LocalContext, train_model
from programlogic.datasets import Preprocessing, load_digits_writers
from programlogic.learning import (
    WeightedFedAvg,
    adagrad,
    adam,
    build_weighted_fed_avg,
    rmsprop,
    sgd,
    softmax_regression,
    yogi,
)
from programlogic.testing import CrashingStateManager, SimulatedCrash

pytestmark = pytest.mark.anyio

SMALL_MODEL = functools.partial(softmax_regression, (FEATURES,), CLASSES)
SERVER_OPTIMIZERS = {
    "fed_avg_m": sgd(1.0, momentum=0.9),
    "fed_adam": adam(0.05),
    "fed_yogi": yogi(0.05),
    "fed_adagrad": adagrad(0.1),
    "rmsprop": rmsprop(0.01),
}
CLIENT_OPTIMIZERS = {
    "sgd_momentum": sgd(0.02, momentum=0.5),
    "adam": adam(0.005),
    "yogi": yogi(0.02),
    "adagrad": adagrad(0.1),
    "rmsprop": rmsprop(0.002),
}


async def run(process: WeightedFedAvg, state_manager, data_source, *, rounds: int, clients: int):
    metrics = MemoryReleaseManager()
    async with LocalContext(max_workers=2):
        result = await train_model(
            train_process=process,
            train_data_source=data_source,
            train_per_round_clients=clients,
            train_total_rounds=rounds,
            program_state_manager=state_manager,
            model_output_manager=MemoryReleaseManager(),
            train_metrics_manager=metrics,
            seed=2,
        )
    released = metrics.values()
    losses = [released[r]["client_work"]["train"]["loss"] for r in sorted(released)]
    return result, losses


# Against FedAvg written in NumPy: the compiled client step and the server step.

EPOCHS, BATCH = 2, 4
BOTH_SIDES = {
    "adagrad": ((adagrad(0.3), hand_adagrad(0.3)), (adagrad(0.2), hand_adagrad(0.2))),
    "yogi": ((yogi(0.05), hand_yogi(0.05)), (yogi(0.1, beta_2=0.9), hand_yogi(0.1, beta_2=0.9))),
    "rmsprop": ((rmsprop(0.01), hand_rmsprop(0.01)), (rmsprop(0.05), hand_rmsprop(0.05))),
}


@functools.cache
def both_sides_process(name: str) -> WeightedFedAvg:
    (client, _), (server, _) = BOTH_SIDES[name]
    return build_weighted_fed_avg(
        SMALL_MODEL,
        client,
        server,
        preprocess=Preprocessing(epochs=EPOCHS, batch_size=BATCH, shuffle_buffer=0),
    )


@pytest.mark.parametrize("name", list(BOTH_SIDES))
async def test_two_rounds_equal_fed_avg_written_in_numpy(name: str) -> None:
    (_, hand_client), (_, hand_server) = BOTH_SIDES[name]
    process = both_sides_process(name)
    state = process.set_model_weights(process.initialize(), known_weights())
    history = []
    async with LocalContext(max_workers=2):
        for _ in range(2):
            state = (await process.next(state, handles(ragged_clients()))).state
            history.append(state["model"]["trainable"])

    data = list(ragged_clients().values())
    expected = fed_avg(
        known_weights()["trainable"],
        [data, data],
        hand_client,
        hand_server,
        epochs=EPOCHS,
        batch_size=BATCH,
    )
    for trainable, (weights, _) in zip(history, expected, strict=True):
        for actual, wanted in zip(trainable, weights, strict=True):
            np.testing.assert_allclose(actual, wanted, rtol=1e-5, atol=1e-6)
    assert not np.allclose(history[-1][0], known_weights()["trainable"][0], atol=1e-2)


# Resuming.

ROUNDS = 4


@functools.cache
def small_process(name: str, instance: int) -> WeightedFedAvg:
    """``instance`` tells apart processes built alike, as a restarted program builds it."""
    del instance
    return build_weighted_fed_avg(
        SMALL_MODEL,
        sgd(0.5),
        SERVER_OPTIMIZERS[name],
        preprocess=Preprocessing(epochs=2, batch_size=4, shuffle_buffer=5),
        seed=1,
    )


@pytest.mark.parametrize("name", list(SERVER_OPTIMIZERS))
async def test_a_resumed_run_ends_with_the_uninterrupted_model_and_optimizer_state(
    name: str, tmp_path
) -> None:
    clients = InMemoryDataSource(ragged_clients())
    reference, _ = await run(
        small_process(name, 0), MemoryProgramStateManager(), clients, rounds=ROUNDS, clients=3
    )

    root = tmp_path / "state"
    async with FileProgramStateManager(root) as state:
        with pytest.raises(SimulatedCrash):
            await run(
                small_process(name, 0),
                CrashingStateManager(state, 3),
                clients,
                rounds=ROUNDS,
                clients=3,
            )
    async with FileProgramStateManager(root) as state:
        result, _ = await run(small_process(name, 1), state, clients, rounds=ROUNDS, clients=3)

    assert result.resumed_from == 2 and result.round_num == ROUNDS
    assert_same_state(result.state, reference.state)
    optimizer_state = reference.state["server_optimizer"]
    assert optimizer_state, "the server optimizer has a state to carry over"


# Training on the digits.


@functools.cache
def digits_process(client: str, server: str) -> WeightedFedAvg:
    data = load_digits_writers()
    return build_weighted_fed_avg(
        functools.partial(softmax_regression, data.feature_shape, data.num_classes),
        CLIENT_OPTIMIZERS.get(client, sgd(0.02)),
        SERVER_OPTIMIZERS.get(server, sgd(1.0)),
        preprocess=Preprocessing(epochs=1, batch_size=10, shuffle_buffer=50),
        seed=0,
    )


async def assert_learns(process: WeightedFedAvg) -> list[float]:
    _, losses = await run(
        process, MemoryProgramStateManager(), load_digits_writers().train, rounds=5, clients=10
    )
    assert all(math.isfinite(loss) for loss in losses), losses
    # Each round's model is better on the round's training batches than the one before.
    assert all(later < earlier for earlier, later in itertools.pairwise(losses)), losses
    return losses


@pytest.mark.parametrize("name", list(CLIENT_OPTIMIZERS))
async def test_each_client_optimizer_trains_the_digits(name: str) -> None:
    await assert_learns(digits_process(name, "default"))


@pytest.mark.parametrize("name", list(SERVER_OPTIMIZERS))
async def test_each_server_optimizer_trains_the_digits(name: str) -> None:
    losses = await assert_learns(digits_process("default", name))
    plain = await assert_learns(digits_process("default", "default"))
    # Round 1 trains the same initial model; by the last round the server optimizer
    # has moved the model elsewhere than plain FedAvg's sgd(1.0) (FedAvgM's first step
    # is plain FedAvg's: its velocity starts as the first averaged delta).
    assert losses[0] == plain[0]
    assert losses[-1] != plain[-1], (losses, plain)
