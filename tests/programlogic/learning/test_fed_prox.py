"""FedProx, unweighted FedAvg and FedSGD, against the algorithms written in NumPy.

FedProx (TFF's ``build_weighted_fed_prox``) adds ``mu * (w - w_server)`` to every client
gradient; the unweighted builders average the client deltas with equal weights; FedSGD
applies, with the server optimizer, the example-weighted mean of each client's mean
gradient at the server model. A crashed run of each, resumed from its files, ends with
the uninterrupted run's state, bit for bit.
"""

import functools

import numpy as np
import pytest
from learning_support import (
    CLASSES,
    FEATURES,
    assert_same_state,
    gradient,
    handles,
    known_weights,
    make_client,
    per_example,
    ragged_clients,
)

from managers import FileProgramStateManager, MemoryProgramStateManager, MemoryReleaseManager
from programlogic import InMemoryDataSource, LocalContext, train_model
from programlogic.datasets import Preprocessing
from programlogic.learning import (
    FedSGD,
    WeightedFedAvg,
    adam,
    build_fed_sgd,
    build_unweighted_fed_avg,
    build_unweighted_fed_prox,
    build_weighted_fed_avg,
    build_weighted_fed_prox,
    sgd,
    softmax_regression,
)
from programlogic.testing import CrashingStateManager, SimulatedCrash

pytestmark = pytest.mark.anyio

SMALL_MODEL = functools.partial(softmax_regression, (FEATURES,), CLASSES)
EPOCHS, BATCH = 2, 4
UNSHUFFLED = Preprocessing(epochs=EPOCHS, batch_size=BATCH, shuffle_buffer=0)
CLIENT_RATE, SERVER_RATE = 0.5, 0.7


def hand_prox_client(weights, data, mu: float) -> tuple[list[np.ndarray], int, float]:
    """A client's delta, example count and loss sum under FedProx with SGD, by hand."""
    start = [np.asarray(w, np.float64) for w in weights]
    trained = [w.copy() for w in start]
    order = np.tile(np.arange(len(data.y)), EPOCHS)
    loss_sum = 0.0
    for begin in range(0, len(order), BATCH):
        batch = order[begin : begin + BATCH]
        losses, _ = per_example(trained, data.x[batch], data.y[batch])
        loss_sum += losses.sum()
        grads = gradient(trained, data.x[batch], data.y[batch])
        trained = [
            w - CLIENT_RATE * (g + mu * (w - w0))
            for w, g, w0 in zip(trained, grads, start, strict=True)
        ]
    return [a - b for a, b in zip(start, trained, strict=True)], len(order), loss_sum


def hand_rounds(mu: float, uniform: bool, rounds: int = 2) -> list[tuple[list, float]]:
    """The model and mean loss after each round of FedProx (server SGD), by hand."""
    weights = [np.asarray(w, np.float64) for w in known_weights()["trainable"]]
    history = []
    for _ in range(rounds):
        results = [hand_prox_client(weights, data, mu) for data in ragged_clients().values()]
        client_weights = [1.0 if uniform else count for _, count, _ in results]
        mean = [
            sum(cw * delta[i] for cw, (delta, _, _) in zip(client_weights, results, strict=True))
            / sum(client_weights)
            for i in range(len(weights))
        ]
        weights = [w - SERVER_RATE * d for w, d in zip(weights, mean, strict=True)]
        loss = sum(r[2] for r in results) / sum(r[1] for r in results)
        history.append((weights, loss))
    return history


def hand_fed_sgd(rounds: int = 2) -> list[tuple[list, float]]:
    """The model and mean loss after each round of FedSGD (server SGD), by hand."""
    weights = [np.asarray(w, np.float64) for w in known_weights()["trainable"]]
    history = []
    for _ in range(rounds):
        total = [np.zeros_like(w) for w in weights]
        examples = 0
        loss_sum = 0.0
        for data in ragged_clients().values():
            order = np.tile(np.arange(len(data.y)), EPOCHS)
            client_sum = [np.zeros_like(w) for w in weights]
            for begin in range(0, len(order), BATCH):
                batch = order[begin : begin + BATCH]
                loss_sum += per_example(weights, data.x[batch], data.y[batch])[0].sum()
                grads = gradient(weights, data.x[batch], data.y[batch])
                client_sum = [s + len(batch) * g for s, g in zip(client_sum, grads, strict=True)]
            # the client's mean gradient, weighted by its example count
            total = [t + s for t, s in zip(total, client_sum, strict=True)]
            examples += len(order)
        weights = [w - SERVER_RATE * t / examples for w, t in zip(weights, total, strict=True)]
        history.append((weights, loss_sum / examples))
    return history


BUILDERS = {
    "weighted_fed_prox": lambda: build_weighted_fed_prox(
        SMALL_MODEL, 0.3, sgd(CLIENT_RATE), sgd(SERVER_RATE), preprocess=UNSHUFFLED
    ),
    "weighted_fed_prox_uniform": lambda: build_weighted_fed_prox(
        SMALL_MODEL,
        0.3,
        sgd(CLIENT_RATE),
        sgd(SERVER_RATE),
        client_weighting="uniform",
        preprocess=UNSHUFFLED,
    ),
    "unweighted_fed_prox": lambda: build_unweighted_fed_prox(
        SMALL_MODEL, 0.3, sgd(CLIENT_RATE), sgd(SERVER_RATE), preprocess=UNSHUFFLED
    ),
    "unweighted_fed_avg": lambda: build_unweighted_fed_avg(
        SMALL_MODEL, sgd(CLIENT_RATE), sgd(SERVER_RATE), preprocess=UNSHUFFLED
    ),
    "fed_sgd": lambda: build_fed_sgd(SMALL_MODEL, sgd(SERVER_RATE), preprocess=UNSHUFFLED),
}
EXPECTED = {
    "weighted_fed_prox": lambda: hand_rounds(0.3, uniform=False),
    "weighted_fed_prox_uniform": lambda: hand_rounds(0.3, uniform=True),
    "unweighted_fed_prox": lambda: hand_rounds(0.3, uniform=True),
    "unweighted_fed_avg": lambda: hand_rounds(0.0, uniform=True),
    "fed_sgd": hand_fed_sgd,
}


@functools.cache
def built(name: str):
    return BUILDERS[name]()


async def two_rounds(process, clients=None) -> list[tuple[list, float]]:
    state = process.set_model_weights(process.initialize(), known_weights())
    history = []
    async with LocalContext(max_workers=2):
        for _ in range(2):
            output = await process.next(state, handles(clients or ragged_clients()))
            state = output.state
            history.append((state["model"]["trainable"], output.metrics))
    return history


@pytest.mark.parametrize("name", list(BUILDERS))
async def test_two_rounds_equal_the_algorithm_written_in_numpy(name: str) -> None:
    history = await two_rounds(built(name))
    for (trainable, metrics), (weights, loss) in zip(history, EXPECTED[name](), strict=True):
        for actual, wanted in zip(trainable, weights, strict=True):
            np.testing.assert_allclose(actual, wanted, rtol=1e-5, atol=1e-6)
        assert metrics["client_work"]["train"]["loss"] == pytest.approx(loss, rel=1e-5)
    assert not np.allclose(history[-1][0][0], known_weights()["trainable"][0], atol=1e-2)


async def test_the_proximal_term_keeps_clients_nearer_the_server_model() -> None:
    # One client, server sgd(1.0): the round's change is the client's own delta.
    one = {"a": ragged_clients()["c"]}
    moves = []
    for mu in (0.0, 1.0):
        process = build_weighted_fed_prox(SMALL_MODEL, mu, sgd(CLIENT_RATE), preprocess=UNSHUFFLED)
        (trainable, _), _ = await two_rounds(process, one)
        moves.append(np.linalg.norm(trainable[0] - known_weights()["trainable"][0]))
    assert moves[1] < 0.9 * moves[0], moves


async def test_with_no_proximal_term_weighted_fed_prox_is_weighted_fed_avg() -> None:
    prox = build_weighted_fed_prox(SMALL_MODEL, 0.0, sgd(CLIENT_RATE), preprocess=UNSHUFFLED)
    avg = build_weighted_fed_avg(SMALL_MODEL, sgd(CLIENT_RATE), preprocess=UNSHUFFLED)
    for (a, metrics_a), (b, metrics_b) in zip(
        await two_rounds(prox), await two_rounds(avg), strict=True
    ):
        assert_same_state(a, b)
        assert metrics_a == metrics_b


async def test_uniform_weighting_differs_from_example_weighting() -> None:
    weighted = await two_rounds(built("weighted_fed_prox"))
    uniform = await two_rounds(built("weighted_fed_prox_uniform"))
    assert not np.allclose(weighted[0][0][0], uniform[0][0][0])


async def test_a_fed_sgd_client_with_nan_data_is_left_out_and_counted() -> None:
    clients = {**ragged_clients(), "nan": make_client(5, 9, nan_at=2)}
    history = await two_rounds(built("fed_sgd"), clients)
    clean = await two_rounds(built("fed_sgd"))
    assert history[0][1]["client_work"]["train"]["num_non_finite_clients"] == 1
    np.testing.assert_allclose(history[0][0][0], clean[0][0][0], rtol=1e-6)


async def test_configurations_name_the_new_hyperparameters() -> None:
    prox = built("weighted_fed_prox").describe_configuration()
    assert prox["proximal_strength"] == 0.3 and prox["client_weighting"] == "num_examples"
    unweighted = built("unweighted_fed_avg").describe_configuration()
    assert unweighted["client_weighting"] == "uniform" and "proximal_strength" not in unweighted
    sgd_config = built("fed_sgd").describe_configuration()
    assert sgd_config["algorithm"] == "fed_sgd" and "client_optimizer" not in sgd_config
    assert sgd_config["server_optimizer"] == sgd(SERVER_RATE).describe()
    assert (
        isinstance(built("fed_sgd"), FedSGD) and type(built("unweighted_fed_avg")) is WeightedFedAvg
    )


async def test_defaults_are_tffs() -> None:
    assert build_fed_sgd(SMALL_MODEL).server_optimizer == sgd(0.1)
    prox = build_weighted_fed_prox(SMALL_MODEL, 0.1)
    assert (prox.client_optimizer, prox.server_optimizer) == (sgd(0.02), sgd(1.0))


@pytest.mark.parametrize(
    ("build", "arguments", "error", "message"),
    [
        (build_weighted_fed_prox, {"proximal_strength": -0.1}, ValueError, "proximal_strength"),
        (build_weighted_fed_prox, {"proximal_strength": "1"}, TypeError, "proximal_strength"),
        (
            build_weighted_fed_prox,
            {"proximal_strength": 0.1, "client_weighting": "examples"},
            ValueError,
            "client_weighting",
        ),
        (build_unweighted_fed_prox, {"proximal_strength": float("inf")}, ValueError, "inf"),
        (build_unweighted_fed_avg, {"seed": -1}, ValueError, "seed"),
        (build_fed_sgd, {"server_optimizer": "sgd"}, TypeError, "server_optimizer"),
        (build_fed_sgd, {"clients_per_group": 0}, ValueError, "clients_per_group"),
    ],
)
async def test_builders_refuse_bad_arguments(build, arguments, error, message) -> None:
    with pytest.raises(error, match=message):
        build(SMALL_MODEL, **arguments)


# Resuming.

ROUNDS = 4
RESUMED = {
    "fed_prox": lambda: build_weighted_fed_prox(
        SMALL_MODEL,
        0.5,
        sgd(0.5),
        preprocess=Preprocessing(epochs=2, batch_size=4, shuffle_buffer=5),
        seed=1,
    ),
    "unweighted_fed_prox": lambda: build_unweighted_fed_prox(
        SMALL_MODEL,
        0.1,
        sgd(0.5),
        adam(0.05),
        preprocess=Preprocessing(epochs=2, batch_size=4, shuffle_buffer=5),
        seed=1,
    ),
    "unweighted_fed_avg": lambda: build_unweighted_fed_avg(
        SMALL_MODEL,
        sgd(0.5),
        sgd(1.0, momentum=0.9),
        preprocess=Preprocessing(epochs=2, batch_size=4, shuffle_buffer=5),
        seed=1,
    ),
    "fed_sgd": lambda: build_fed_sgd(
        SMALL_MODEL, adam(0.05), preprocess=Preprocessing(epochs=1, batch_size=4, shuffle_buffer=5)
    ),
}


async def run(process, state_manager):
    async with LocalContext(max_workers=2):
        return await train_model(
            train_process=process,
            train_data_source=InMemoryDataSource(ragged_clients()),
            train_per_round_clients=2,
            train_total_rounds=ROUNDS,
            program_state_manager=state_manager,
            model_output_manager=MemoryReleaseManager(),
            seed=2,
        )


@pytest.mark.parametrize("name", list(RESUMED))
async def test_a_resumed_run_ends_with_the_uninterrupted_state(name: str, tmp_path) -> None:
    reference = await run(RESUMED[name](), MemoryProgramStateManager())
    root = tmp_path / "state"
    async with FileProgramStateManager(root) as state:
        with pytest.raises(SimulatedCrash):
            await run(RESUMED[name](), CrashingStateManager(state, 3))
    async with FileProgramStateManager(root) as state:
        result = await run(RESUMED[name](), state)
    assert result.resumed_from == 2 and result.round_num == ROUNDS
    assert_same_state(result.state, reference.state)
