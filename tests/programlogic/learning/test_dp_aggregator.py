"""The differentially private mean: clipping, noise keyed by a secret that never leaves
the state, equality with unweighted FedAvg without noise, adaptive clipping, exact resume."""

import functools
import logging
import math

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
    adaptive_clipping,
    build_unweighted_fed_avg,
    clipping,
    dp_mean,
    sgd,
    softmax_regression,
    unweighted_mean,
)
from programlogic.privacy import GaussianMechanism
from programlogic.testing import CrashingStateManager, SimulatedCrash

pytestmark = pytest.mark.anyio

SMALL_MODEL = functools.partial(softmax_regression, (FEATURES,), CLASSES)
EPOCHS, BATCH = 2, 4
UNSHUFFLED = Preprocessing(epochs=EPOCHS, batch_size=BATCH, shuffle_buffer=0)
CLIENT_RATE, SERVER_RATE = 0.5, 1.0
SIZES = (3, 7, 12, 5, 9)
SECRET = 0x0123456789ABCDEF_FEDCBA9876543210
DELTA = 1e-5


@functools.cache
def five_clients() -> dict:
    return {f"c{index}": make_client(size, 60 + index) for index, size in enumerate(SIZES)}


@functools.cache
def hand_norms() -> np.ndarray:
    start = known_weights()["trainable"]
    deltas = [
        train_client(start, data, hand_sgd(CLIENT_RATE), epochs=EPOCHS, batch_size=BATCH)["delta"]
        for data in five_clients().values()
    ]
    return np.array([np.sqrt(sum(np.sum(d**2) for d in delta)) for delta in deltas])


def mechanism(noise_multiplier: float = 0.0, **settings) -> GaussianMechanism:
    settings = {"num_clients": len(SIZES), "clients_per_round": len(SIZES), **settings}
    settings.setdefault("sampling", "fixed")
    return GaussianMechanism(noise_multiplier, **settings)


def process(aggregator, **settings):
    return build_unweighted_fed_avg(
        SMALL_MODEL,
        sgd(CLIENT_RATE),
        sgd(SERVER_RATE),
        preprocess=UNSHUFFLED,
        model_aggregator=aggregator,
        **settings,
    )


async def rounds(built, count: int = 3, **group):
    state = built.set_model_weights(built.initialize(), known_weights())
    outputs = []
    async with LocalContext(max_workers=2):
        for _ in range(count):
            output = await built.next(state, handles(five_clients()))
            state = output.state
            outputs.append(output)
    return outputs


async def test_without_noise_and_a_clip_no_update_reaches_it_is_unweighted_fed_avg() -> None:
    loose = float(hand_norms().max()) * 10
    private = await rounds(process(dp_mean(mechanism(), loose, delta=DELTA, secret=SECRET)))
    plain = await rounds(process(None))
    for ours, theirs in zip(private, plain, strict=True):
        assert_same_state(ours.state["model"], theirs.state["model"])
        assert ours.metrics["client_work"] == theirs.metrics["client_work"]


async def test_without_noise_a_binding_clip_is_the_clipped_unweighted_mean() -> None:
    clip = float(np.median(hand_norms()))
    private = await rounds(process(dp_mean(mechanism(), clip, delta=DELTA, secret=SECRET)))
    clipped = await rounds(process(clipping(clip, unweighted_mean())))
    for ours, theirs in zip(private, clipped, strict=True):
        for mine, reference in zip(
            ours.state["model"]["trainable"], theirs.state["model"]["trainable"], strict=True
        ):
            np.testing.assert_allclose(mine, reference, rtol=1e-6, atol=1e-7)
    assert private[0].metrics["privacy"]["clip"] == clip


@pytest.mark.parametrize(("sampling", "sensitivity"), [("fixed", 1.0), ("uniform", 2.0)])
async def test_the_noise_has_the_mechanisms_scale_and_comes_from_the_secret(
    sampling: str, sensitivity: float
) -> None:
    """Uniform sampling is accounted under replace-one adjacency: twice the noise."""
    clip, multiplier = 0.05, 4.0
    noiseless = await rounds(process(dp_mean(mechanism(), clip, delta=DELTA)), count=1)

    def noisy_process(secret: int):
        noisy_mechanism = mechanism(multiplier, sampling=sampling)
        return process(dp_mean(noisy_mechanism, clip, delta=DELTA, secret=secret))

    noisy = await rounds(noisy_process(SECRET), count=1)
    again = await rounds(noisy_process(SECRET), count=1)
    other = await rounds(noisy_process(SECRET + 1), count=1)
    assert_same_state(noisy[0].state, again[0].state)
    # The server's SGD 1.0 moves the model by minus the update: the noise is the
    # difference from the noiseless round, times the expected clients a round.
    noise = np.concatenate(
        [
            (before - after).ravel() * len(SIZES)
            for before, after in zip(
                noiseless[0].state["model"]["trainable"],
                noisy[0].state["model"]["trainable"],
                strict=True,
            )
        ]
    )
    assert np.std(noise) == pytest.approx(multiplier * clip * sensitivity, rel=0.15)
    assert abs(np.mean(noise)) < 3 * multiplier * clip * sensitivity / math.sqrt(len(noise))
    assert not np.array_equal(
        noisy[0].state["model"]["trainable"][0], other[0].state["model"]["trainable"][0]
    )


async def test_each_run_draws_a_new_secret_from_the_operating_system() -> None:
    aggregator = dp_mean(mechanism(1.0), 0.1, delta=DELTA)
    first, second = aggregator.initialize(), aggregator.initialize()
    assert first["secret"].dtype == np.uint32 and first["secret"].shape == (4,)
    assert not np.array_equal(first["secret"], second["secret"])


async def test_an_adaptive_clip_moves_geometrically_toward_the_quantile() -> None:
    adaptive = adaptive_clipping(initial_clip=0.01, target_quantile=0.5, learning_rate=0.2)
    outputs = await rounds(process(dp_mean(mechanism(), adaptive, delta=DELTA)), count=1)
    # Without noise: all five norms exceed 0.01, so the unclipped fraction is 0 and
    # the clip grows by exp(0.2 * 0.5).
    assert (hand_norms() > 0.01).all()
    assert outputs[0].metrics["privacy"]["clip"] == pytest.approx(0.01)
    new_clip = float(outputs[0].state["aggregator"]["clip"])
    assert new_clip == pytest.approx(0.01 * math.exp(0.1), rel=1e-6)
    many = await rounds(process(dp_mean(mechanism(), adaptive, delta=DELTA)), count=40)
    final_clip = float(many[-1].state["aggregator"]["clip"])
    assert 0.5 * float(np.min(hand_norms())) < final_clip < 2 * float(np.max(hand_norms()))


async def test_the_count_noise_takes_its_share_of_the_privacy() -> None:
    adaptive = adaptive_clipping(count_stddev=1.0)
    aggregator = dp_mean(mechanism(1.0), adaptive, delta=DELTA)
    value_multiplier, count_stddev = aggregator._noise_multipliers()
    assert count_stddev == 1.0
    assert value_multiplier == pytest.approx((1.0 - 0.25) ** -0.5)
    with pytest.raises(ValueError, match=r"count_stddev 0\.25 is too small"):
        dp_mean(mechanism(1.0), adaptive_clipping(count_stddev=0.25), delta=DELTA)


ROUNDS = 4


async def run(state_manager, releases=None, metrics=None, ledger=None):
    """Train ROUNDS rounds; a memory state manager needs a privacy ``ledger`` path."""
    built = process(dp_mean(mechanism(0.5), 0.05, delta=DELTA, secret=SECRET))
    async with LocalContext(max_workers=2):
        return await train_model(
            train_process=built,
            train_data_source=InMemoryDataSource(five_clients()),
            train_per_round_clients=len(SIZES),
            train_total_rounds=ROUNDS,
            program_state_manager=state_manager,
            model_output_manager=releases or MemoryReleaseManager(),
            train_metrics_manager=metrics or MemoryReleaseManager(),
            seed=2,
            privacy_ledger=ledger,
        )


async def test_a_resumed_run_adds_the_same_noise_and_counts_each_round_once(tmp_path) -> None:
    reference_metrics = MemoryReleaseManager()
    reference = await run(
        MemoryProgramStateManager(), metrics=reference_metrics, ledger=tmp_path / "reference"
    )
    root = tmp_path / "state"
    async with FileProgramStateManager(root) as state:
        with pytest.raises(SimulatedCrash):
            await run(CrashingStateManager(state, 3))
    resumed_metrics = MemoryReleaseManager()
    async with FileProgramStateManager(root) as state:
        result = await run(state, metrics=resumed_metrics)
    assert result.resumed_from == 2
    assert_same_state(result.state, reference.state)
    assert int(result.state["aggregator"]["rounds"]) == ROUNDS
    expected = {key: value["privacy"] for key, value in reference_metrics.values().items()}
    resumed = {key: value["privacy"] for key, value in resumed_metrics.values().items()}
    # Round 2's releases are repeated on resume (idempotently), with the same epsilon.
    assert set(resumed) >= {3, 4}
    assert resumed == {key: expected[key] for key in resumed}
    assert [expected[key]["rounds"] for key in sorted(expected)] == [1, 2, 3, 4]


async def test_the_secret_is_never_released_logged_or_described(caplog, tmp_path) -> None:
    caplog.set_level(logging.DEBUG)
    models, metrics = MemoryReleaseManager(), MemoryReleaseManager()
    ledger = tmp_path / "privacy_ledger.jsonl"
    result = await run(MemoryProgramStateManager(), models, metrics, ledger=ledger)
    words = [str(int(word)) for word in result.state["aggregator"]["secret"]]
    released = repr(models.values()) + repr(metrics.values())
    built = process(dp_mean(mechanism(0.5), 0.05, delta=DELTA, secret=SECRET))
    described = repr(built.describe_configuration()) + repr(built.model_aggregator)
    recorded = ledger.read_text()  # the privacy ledger names the secret by a fingerprint
    assert recorded.count("\n") == ROUNDS + 1
    for text in (released, caplog.text, described, recorded):
        assert str(SECRET) not in text and hex(SECRET)[2:] not in text.lower()
        assert not any(word in text for word in words)


async def test_a_round_that_sampled_nobody_adds_noise_and_counts() -> None:
    built = process(dp_mean(mechanism(1.0), 0.05, delta=DELTA, secret=SECRET))
    state = built.set_model_weights(built.initialize(), known_weights())
    async with LocalContext(max_workers=2):
        output = await built.next(state, [])
    assert int(output.state["aggregator"]["rounds"]) == 1 and output.state["round"] == 1
    assert output.metrics["privacy"]["rounds"] == 1
    assert output.metrics["client_work"]["train"]["num_examples"] == 0
    moved = output.state["model"]["trainable"][0] - known_weights()["trainable"][0]
    assert np.std(moved * len(SIZES)) == pytest.approx(0.05, rel=0.5)
    plain = process(None)
    async with LocalContext(max_workers=2):
        with pytest.raises(ValueError, match="needs at least one client"):
            await plain.next(plain.initialize(), [])


async def test_a_round_sampled_otherwise_than_the_mechanism_accounts_is_refused() -> None:
    built = process(dp_mean(mechanism(1.0), 0.05, delta=DELTA, secret=SECRET))
    state = built.initialize()
    twice = [*handles(five_clients())[:4], handles(five_clients())[0]]
    async with LocalContext(max_workers=2):
        with pytest.raises(ValueError, match=r"holds client 'c0' 2 times: sampling with replace"):
            await built.next(state, twice)
        with pytest.raises(
            ValueError, match="holds 4 clients, but the mechanism accounts for fixed"
        ):
            await built.next(state, handles(five_clients())[:4])
    poisson = process(dp_mean(mechanism(1.0, sampling="poisson"), 0.05, delta=DELTA, secret=SECRET))
    async with LocalContext(max_workers=2):
        output = await poisson.next(poisson.initialize(), handles(five_clients())[:4])
    assert output.metrics["privacy"]["rounds"] == 1


async def test_rounds_run_under_another_mechanism_are_not_accounted_as_this_ones() -> None:
    first = process(dp_mean(mechanism(1.0), 0.05, delta=DELTA, secret=SECRET))
    async with LocalContext(max_workers=2):
        output = await first.next(first.initialize(), handles(five_clients()))
        assert output.state["aggregator"]["mechanism"].tolist() == [1.0, 5, 5, 2, 1.0]
        noisier = process(dp_mean(mechanism(2.0), 0.05, delta=DELTA, secret=SECRET))
        with pytest.raises(ValueError, match=r"the 1 rounds of this state ran under another"):
            await noisier.next(output.state, handles(five_clients()))
        with pytest.raises(ValueError, match=r"the 1 rounds of this state ran under another"):
            await noisier.next(output.state, [])  # a round that sampled nobody too
        # A fresh state takes the new mechanism.
        await noisier.next(noisier.initialize(), handles(five_clients()))
