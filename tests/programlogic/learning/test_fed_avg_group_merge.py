"""A FedAvg round merges its groups' partials in group order, however the groups finish."""

import functools

import numpy as np
import pytest
from learning_support import CLASSES, FEATURES, handles, known_weights, make_client

from programlogic import LocalContext
from programlogic.datasets import Preprocessing
from programlogic.learning import build_weighted_fed_avg, sgd, softmax_regression

pytestmark = pytest.mark.anyio


@functools.cache
def one_client_groups():
    return build_weighted_fed_avg(
        functools.partial(softmax_regression, (FEATURES,), CLASSES),
        sgd(0.5),
        sgd(1.0),
        preprocess=Preprocessing(epochs=2, batch_size=4, shuffle_buffer=0),
        clients_per_group=1,
    )


async def run_round(workers: int, clients) -> dict:
    process = one_client_groups()
    start = process.set_model_weights(process.initialize(), known_weights())
    async with LocalContext(max_workers=workers):
        return (await process.next(start, clients)).state


@pytest.mark.parametrize("count", [1, 2, 5])
async def test_a_round_of_groups_gives_the_same_bits_on_one_worker_and_on_two(count) -> None:
    clients = handles({str(seed): make_client(3 + 2 * seed, seed) for seed in range(count)})

    alone = await run_round(1, clients)
    side_by_side = await run_round(2, clients)

    pairs = zip(alone["model"]["trainable"], side_by_side["model"]["trainable"], strict=True)
    for one, two in pairs:
        np.testing.assert_array_equal(one, two)
    assert not np.array_equal(alone["model"]["trainable"][0], known_weights()["trainable"][0])


async def test_a_round_of_groups_is_the_example_weighted_mean_of_its_clients() -> None:
    clients = handles({str(seed): make_client(3 + 2 * seed, seed) for seed in range(3)})
    together = await run_round(2, clients)
    trained = [await run_round(1, [client]) for client in clients]

    weights = np.array([3.0, 5.0, 7.0]) / 15.0
    for index, actual in enumerate(together["model"]["trainable"]):
        expected = sum(
            w * state["model"]["trainable"][index]
            for w, state in zip(weights, trained, strict=True)
        )
        np.testing.assert_allclose(actual, expected, rtol=1e-6, atol=1e-7)
