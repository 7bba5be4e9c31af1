"""The model aggregators of FedAvg, against the statistics computed in NumPy on each
client's delta trained by hand; robust ones against poisoned updates; an aggregator with
state resumed exactly."""

import dataclasses
import functools
from typing import Any

import numpy as np
import pytest
from learning_support import (
    CLASSES,
    FEATURES,
    assert_same_state,
    hand_sgd,
    handles,
    known_weights,
    make_client,
    train_client,
)

from managers import FileProgramStateManager, MemoryProgramStateManager, MemoryReleaseManager
from programlogic import InMemoryDataSource, LocalContext, train_model
from programlogic.datasets import Preprocessing
from programlogic.learning import (
    Aggregate,
    ClientTransform,
    ModelAggregator,
    build_fed_sgd,
    build_weighted_fed_avg,
    clipping,
    mean,
    median,
    sgd,
    softmax_regression,
    trimmed_mean,
    unweighted_mean,
)
from programlogic.learning._tensorflow import tf
from programlogic.testing import CrashingStateManager, SimulatedCrash

pytestmark = pytest.mark.anyio

SMALL_MODEL = functools.partial(softmax_regression, (FEATURES,), CLASSES)
EPOCHS, BATCH = 2, 4
UNSHUFFLED = Preprocessing(epochs=EPOCHS, batch_size=BATCH, shuffle_buffer=0)
CLIENT_RATE, SERVER_RATE = 0.5, 0.7
SIZES = (3, 7, 12, 5, 9)


@functools.cache
def five_clients() -> dict[str, Any]:
    return {f"c{index}": make_client(size, 40 + index) for index, size in enumerate(SIZES)}


@functools.cache
def hand_deltas() -> tuple[list[list[np.ndarray]], np.ndarray]:
    """Each client's delta from the known weights, and its example count."""
    start = known_weights()["trainable"]
    results = [
        train_client(start, data, hand_sgd(CLIENT_RATE), epochs=EPOCHS, batch_size=BATCH)
        for data in five_clients().values()
    ]
    return [r["delta"] for r in results], np.array([r["num_examples"] for r in results], float)


def norms() -> np.ndarray:
    deltas, _ = hand_deltas()
    return np.array([np.sqrt(sum(np.sum(d**2) for d in delta)) for delta in deltas])


def clip_between() -> float:
    """A norm that some clients' deltas exceed and others do not."""
    return float(np.median(norms()))


def clipped(deltas: list[list[np.ndarray]], clip: float) -> list[list[np.ndarray]]:
    return [
        [d * min(1.0, clip / norm) for d in delta]
        for delta, norm in zip(deltas, norms(), strict=True)
    ]


def weighted(deltas: list[list[np.ndarray]], weights: np.ndarray) -> list[np.ndarray]:
    return [
        sum(w * delta[i] for w, delta in zip(weights, deltas, strict=True)) / weights.sum()
        for i in range(len(deltas[0]))
    ]


def by_coordinate(deltas: list[list[np.ndarray]], statistic) -> list[np.ndarray]:
    return [statistic(np.stack([delta[i] for delta in deltas])) for i in range(len(deltas[0]))]


def trim(updates: np.ndarray, beta: float = 0.2) -> np.ndarray:
    cut = int(beta * len(updates))
    return np.sort(updates, axis=0)[cut : len(updates) - cut].mean(axis=0)


def expected_update(name: str) -> list[np.ndarray]:
    deltas, examples = hand_deltas()
    ones = np.ones_like(examples)
    return {
        "mean": lambda: weighted(deltas, examples),
        "unweighted_mean": lambda: weighted(deltas, ones),
        "clipping": lambda: weighted(clipped(deltas, clip_between()), examples),
        "clipped_unweighted": lambda: weighted(clipped(deltas, clip_between()), ones),
        "median": lambda: by_coordinate(deltas, lambda u: np.median(u, axis=0)),
        "trimmed_mean": lambda: by_coordinate(deltas, trim),
        "clipped_median": lambda: by_coordinate(
            clipped(deltas, clip_between()), lambda u: np.median(u, axis=0)
        ),
    }[name]()


AGGREGATORS = {
    "mean": mean,
    "unweighted_mean": unweighted_mean,
    "clipping": lambda: clipping(clip_between()),
    "clipped_unweighted": lambda: clipping(clip_between(), unweighted_mean()),
    "median": median,
    "trimmed_mean": lambda: trimmed_mean(0.2),
    "clipped_median": lambda: clipping(clip_between(), median()),
}


async def one_round(aggregator: ModelAggregator | None, *, clients_per_group: int = 2):
    process = build_weighted_fed_avg(
        SMALL_MODEL,
        sgd(CLIENT_RATE),
        sgd(SERVER_RATE),
        preprocess=UNSHUFFLED,
        clients_per_group=clients_per_group,
        model_aggregator=aggregator,
    )
    state = process.set_model_weights(process.initialize(), known_weights())
    async with LocalContext(max_workers=2):
        return await process.next(state, handles(five_clients()))


@pytest.mark.parametrize("name", list(AGGREGATORS))
async def test_a_round_applies_the_statistic_of_the_client_deltas(name: str) -> None:
    output = await one_round(AGGREGATORS[name]())
    start = known_weights()["trainable"]
    for actual, before, update in zip(
        output.state["model"]["trainable"], start, expected_update(name), strict=True
    ):
        np.testing.assert_allclose(actual, before - SERVER_RATE * update, rtol=1e-5, atol=1e-6)
    if name.startswith("clip"):
        assert output.metrics["aggregator"] == {
            "clip_norm": pytest.approx(clip_between()),
            "clipped_count": int((norms() > clip_between()).sum()),
        }
        assert 0 < output.metrics["aggregator"]["clipped_count"] < len(SIZES)
    else:
        assert "aggregator" not in output.metrics


async def test_groups_of_any_size_give_the_same_median() -> None:
    alone = await one_round(median(), clients_per_group=1)
    together = await one_round(median(), clients_per_group=5)
    assert_same_state(alone.state, together.state)


async def test_a_clip_no_update_reaches_is_the_mean_bit_for_bit() -> None:
    plain = await one_round(None)
    loose = await one_round(clipping(float(norms().max()) * 2))
    assert_same_state(loose.state, plain.state)
    assert loose.metrics["aggregator"]["clipped_count"] == 0


async def test_fed_sgd_clips_the_client_gradients() -> None:
    process = build_fed_sgd(SMALL_MODEL, sgd(0.5), model_aggregator=clipping(1e-3))
    state = process.set_model_weights(process.initialize(), known_weights())
    async with LocalContext(max_workers=2):
        output = await process.next(state, handles(five_clients()))
    assert output.metrics["aggregator"]["clipped_count"] == len(SIZES)
    moved = [
        after - before
        for after, before in zip(
            output.state["model"]["trainable"], known_weights()["trainable"], strict=True
        )
    ]
    assert np.sqrt(sum(np.sum(m.astype(np.float64) ** 2) for m in moved)) <= 0.5 * 1e-3 * 1.0001


async def test_a_round_larger_than_a_median_holds_is_refused_before_it_starts() -> None:
    with pytest.raises(ValueError, match=r"median keeps every client's update.*5 clients.*=4"):
        await one_round(median(max_clients=4))


async def test_the_configuration_names_an_aggregator_other_than_the_mean() -> None:
    def describe(aggregator):
        return build_weighted_fed_avg(
            SMALL_MODEL, model_aggregator=aggregator
        ).describe_configuration()

    assert "model_aggregator" not in describe(None)
    assert describe(None) == describe(mean())
    assert describe(clipping(2.0, trimmed_mean(0.1)))["model_aggregator"] == {
        "aggregator": "clipping",
        "clip_norm": 2.0,
        "inner": {"aggregator": "trimmed_mean", "beta": 0.1},
    }


# Poisoning: a fifth of the clients send their update scaled by -10.

ATTACKER_EXAMPLES = 99
"""Attackers are the clients that hold this many examples (honest ones hold 100)."""


@dataclasses.dataclass(frozen=True)
class Poisoned(ClientTransform):
    """The attackers' deltas multiplied by ``factor`` before ``inner`` sees them."""

    inner: ModelAggregator
    factor: float = -10.0

    def transform(self, params, deltas, weights):
        attacker = tf.cast(tf.equal(weights, ATTACKER_EXAMPLES), tf.float32)
        scale = 1.0 + (self.factor - 1.0) * attacker
        scaled = [d * tf.reshape(scale, [-1] + [1] * (len(d.shape) - 1)) for d in deltas]
        return scaled, weights, {}

    def describe(self) -> dict:
        return {"aggregator": "poisoned", "inner": self.inner.describe()}


@functools.cache
def digits() -> tuple[dict[str, Any], np.ndarray, np.ndarray]:
    """10 clients of real handwritten digits (2 of them attackers) and 297 held out."""
    from sklearn.datasets import load_digits

    from programlogic.datasets import ClientArrays

    x, y = load_digits(return_X_y=True)
    x, y = (x / 16.0).astype(np.float32), y.astype(np.int32)
    order = np.random.default_rng(0).permutation(len(y))
    x, y = x[order], y[order]
    clients, start = {}, 0
    for index in range(10):
        count = ATTACKER_EXAMPLES if index in (3, 7) else 100
        clients[f"writer{index}"] = ClientArrays(x[start : start + count], y[start : start + count])
        start += count
    return clients, x[1500:], y[1500:]


async def poisoned_accuracy(inner: ModelAggregator, rounds: int = 12) -> float:
    clients, test_x, test_y = digits()
    process = build_weighted_fed_avg(
        functools.partial(softmax_regression, (64,), 10),
        sgd(0.1),
        sgd(1.0),
        preprocess=Preprocessing(epochs=1, batch_size=10, shuffle_buffer=0),
        model_aggregator=Poisoned(inner),
    )
    state = process.initialize()
    async with LocalContext(max_workers=2):
        for _ in range(rounds):
            state = (await process.next(state, handles(clients))).state
    kernel, bias = process.get_model_weights(state)["trainable"]
    return float(np.mean((test_x @ kernel + bias).argmax(axis=1) == test_y))


async def test_the_median_and_the_trimmed_mean_hold_where_the_mean_breaks() -> None:
    assert await poisoned_accuracy(mean()) < 0.5
    assert await poisoned_accuracy(median()) > 0.8
    assert await poisoned_accuracy(trimmed_mean(0.2)) > 0.8


# An aggregator with state: the hook a differentially private aggregator plugs into.


@dataclasses.dataclass(frozen=True)
class NoisyMean(ModelAggregator):
    """The mean plus noise drawn from (a secret kept in the state, the round)."""

    stddev: float = 0.01

    def initialize(self) -> dict:
        return {"secret": np.int64(20261204), "rounds": np.int64(0)}

    def fold_group(self, params, deltas, weights):
        return mean().fold_group(params, deltas, weights)

    def merge(self, total, partial):
        return mean().merge(total, partial)

    def finalize(self, state, total, round_num) -> Aggregate:
        update = mean().finalize({}, total, round_num).update
        rng = np.random.default_rng([int(state["secret"]), round_num])
        noisy = [u + rng.normal(0.0, self.stddev, u.shape) for u in update]
        new_state = {"secret": state["secret"], "rounds": state["rounds"] + 1}
        return Aggregate(noisy, new_state, {"rounds": int(new_state["rounds"])})

    def describe(self) -> dict:
        return {"aggregator": "noisy_mean", "stddev": self.stddev}


ROUNDS = 4


async def run(state_manager):
    process = build_weighted_fed_avg(
        SMALL_MODEL, preprocess=UNSHUFFLED, model_aggregator=NoisyMean()
    )
    async with LocalContext(max_workers=2):
        return await train_model(
            train_process=process,
            train_data_source=InMemoryDataSource(five_clients()),
            train_per_round_clients=3,
            train_total_rounds=ROUNDS,
            program_state_manager=state_manager,
            model_output_manager=MemoryReleaseManager(),
            seed=2,
        )


async def test_an_aggregator_state_is_program_state_and_resumes_exactly(tmp_path) -> None:
    reference = await run(MemoryProgramStateManager())
    assert reference.state["aggregator"]["rounds"] == ROUNDS
    root = tmp_path / "state"
    async with FileProgramStateManager(root) as state:
        with pytest.raises(SimulatedCrash):
            await run(CrashingStateManager(state, 3))
    async with FileProgramStateManager(root) as state:
        result = await run(state)
    assert result.resumed_from == 2
    assert_same_state(result.state, reference.state)
