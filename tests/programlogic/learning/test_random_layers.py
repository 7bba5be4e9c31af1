"""Layers that draw random numbers in training (Dropout, GaussianNoise) in the processes.

Each client draws from seed-generator states derived from ``client_seed(seed, round,
client id)``: its update does not depend on the group it trains in, two clients with the
same data draw different masks, a client draws others in another round, a seed gives
the same model bit for bit (a resumed run too), and evaluation draws nothing.
"""

import functools

import keras
import numpy as np
import pytest
from learning_support import (
    CLASSES,
    FEATURES,
    assert_same_state,
    handles,
    make_client,
    ragged_clients,
)

from managers import FileProgramStateManager, MemoryProgramStateManager, MemoryReleaseManager
from programlogic import InMemoryDataSource, LocalContext, train_model
from programlogic.datasets import Preprocessing
from programlogic.learning import (
    build_fed_eval,
    build_fed_sgd,
    build_weighted_fed_avg,
    build_weighted_fed_prox,
    sgd,
)
from programlogic.learning.keras_model import FunctionalModel, stack_clients
from programlogic.testing import CrashingStateManager, SimulatedCrash

pytestmark = pytest.mark.anyio

HIDDEN = 16
UNSHUFFLED = Preprocessing(epochs=2, batch_size=4, shuffle_buffer=0)


def noisy_model(dropout: bool = True) -> keras.Model:
    """A small MLP with seeded initial weights and, with ``dropout``, Dropout and
    GaussianNoise after its hidden layer."""
    layers = [
        keras.Input((FEATURES,)),
        keras.layers.Dense(
            HIDDEN, activation="relu", kernel_initializer=keras.initializers.GlorotUniform(1)
        ),
    ]
    if dropout:
        layers += [keras.layers.Dropout(0.5), keras.layers.GaussianNoise(0.3)]
    layers.append(
        keras.layers.Dense(CLASSES, kernel_initializer=keras.initializers.GlorotUniform(2))
    )
    return keras.Sequential(layers)


NOISY = functools.partial(noisy_model, True)
PLAIN = functools.partial(noisy_model, False)

BUILDERS = {
    "fed_avg": lambda **kwargs: build_weighted_fed_avg(NOISY, sgd(0.5), sgd(1.0), **kwargs),
    "fed_prox": lambda **kwargs: build_weighted_fed_prox(NOISY, 0.1, sgd(0.5), **kwargs),
    "fed_sgd": lambda **kwargs: build_fed_sgd(NOISY, sgd(1.0), **kwargs),
}


@functools.cache
def process(name: str, clients_per_group: int | None = None, seed: int = 0):
    return BUILDERS[name](preprocess=UNSHUFFLED, clients_per_group=clients_per_group, seed=seed)


async def next_model(process, state, clients) -> list[np.ndarray]:
    async with LocalContext(max_workers=2):
        output = await process.next(state, clients)
    return output.state["model"]["trainable"]


def twins() -> dict:
    """Two clients holding the very same examples."""
    data = make_client(8, 5)
    return {"twin1": data, "twin2": data}


def differ(a: list[np.ndarray], b: list[np.ndarray]) -> bool:
    return any(not np.allclose(x, y, rtol=1e-4, atol=1e-5) for x, y in zip(a, b, strict=True))


async def test_each_seed_generator_gets_its_own_state_from_the_client_seed() -> None:
    model = FunctionalModel(NOISY, "sparse_categorical_crossentropy")
    assert len(model.random_slots) == 2  # Dropout's and GaussianNoise's
    states = model.random_states(7)
    assert states.shape == (2, 2) and states.dtype == np.int64
    assert not np.array_equal(states[0], states[1])
    assert not np.array_equal(states, model.random_states(8))
    np.testing.assert_array_equal(states, model.random_states(7))
    assert ((states >= 0) & (states < 2**30)).all()
    assert FunctionalModel(PLAIN, "sparse_categorical_crossentropy").random_slots == ()


async def test_a_group_stacks_each_client_states_and_zeros_for_padding_clients() -> None:
    model = FunctionalModel(NOISY, "sparse_categorical_crossentropy")
    datas = [make_client(3, 0), make_client(6, 1)]
    examples = [UNSHUFFLED.examples(data) for data in datas]
    orders = [UNSHUFFLED.order(len(data.y), 0) for data in datas]
    states = [model.random_states(11), model.random_states(12)]
    group = stack_clients(examples, orders, 3, states)
    assert group.random_states.shape == (3, 2, 2) and group.random_states.dtype == np.int64
    np.testing.assert_array_equal(group.random_states[:2], states)
    assert not group.random_states[2].any()
    assert stack_clients(examples, orders, 3).random_states.shape == (3, 0, 2)


async def test_the_configuration_names_the_dropout_rate_and_the_noise() -> None:
    # A resumed run with another rate is refused: the layers' settings are recorded.
    layers = process("fed_avg").describe_configuration()["model"]["layers"]
    assert layers[1]["class"] == "Dropout" and layers[1]["rate"] == 0.5
    assert layers[2]["class"] == "GaussianNoise" and layers[2]["stddev"] == 0.3


@pytest.mark.parametrize("name", list(BUILDERS))
async def test_two_clients_with_the_same_data_in_one_group_draw_different_masks(
    name: str,
) -> None:
    train = process(name, clients_per_group=2)
    state = train.initialize()
    clients = handles(twins())
    both = await next_model(train, state, clients)
    first = await next_model(train, state, clients[:1])
    second = await next_model(train, state, clients[1:])
    # Drawing alike, the twins would average to either one's model.
    assert differ(first, second)
    assert differ(both, first)
    for together, alone1, alone2 in zip(both, first, second, strict=True):
        np.testing.assert_allclose(together, (alone1 + alone2) / 2, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("name", list(BUILDERS))
async def test_a_client_draws_other_masks_in_another_round(name: str) -> None:
    train = process(name)
    state = train.initialize()
    client = handles(twins())[:1]
    round_one = await next_model(train, state, client)
    round_six = await next_model(train, {**state, "round": 5}, client)
    again = await next_model(train, {**state, "round": 5}, client)
    assert differ(round_one, round_six)
    assert_same_state(again, round_six)


def four_clients() -> dict:
    return {**ragged_clients(), "d": make_client(5, 9)}


@pytest.mark.parametrize("name", ["fed_avg", "fed_sgd"])
async def test_a_client_update_does_not_depend_on_its_group(name: str) -> None:
    # With a server step of 1 (FedAvg) the round's model is the example-weighted mean
    # of the clients' models; each client's alone gives its own.
    clients = handles(four_clients())
    state = process(name).initialize()
    alone = [await next_model(process(name, 1), state, [client]) for client in clients]
    sizes = [len(data.y) for data in four_clients().values()]
    start = state["model"]["trainable"]
    expected = [
        w0 + sum(n * (w[i] - w0) for n, w in zip(sizes, alone, strict=True)) / sum(sizes)
        for i, w0 in enumerate(start)
    ]
    for clients_per_group, order in [(4, clients), (3, clients), (2, clients[::-1]), (1, clients)]:
        model = await next_model(process(name, clients_per_group), state, order)
        for actual, wanted in zip(model, expected, strict=True):
            np.testing.assert_allclose(actual, wanted, rtol=1e-5, atol=1e-6)
    # The clients' draws matter far beyond that tolerance.
    assert differ(alone[0], await next_model(process(name, 1), {**state, "round": 3}, clients[:1]))


async def test_a_seed_gives_the_same_model_bit_for_bit_and_the_state_no_seed_values() -> None:
    clients = handles(four_clients())
    models = []
    for seed in (3, 3, 4):
        train = build_weighted_fed_avg(
            NOISY, sgd(0.5), preprocess=UNSHUFFLED, clients_per_group=2, seed=seed
        )
        state = train.initialize()
        async with LocalContext(max_workers=2):
            for _ in range(2):
                state = (await train.next(state, clients)).state
        models.append(state["model"])
    assert_same_state(models[1], models[0])
    assert differ(models[0]["trainable"], models[2]["trainable"])
    # The seed-generator states the state carries are zeros, never a client's.
    for model in models:
        assert [w.tolist() for w in model["non_trainable"]] == [[0, 0], [0, 0]]


ROUNDS = 4


async def run(train, state_manager):
    async with LocalContext(max_workers=2):
        return await train_model(
            train_process=train,
            train_data_source=InMemoryDataSource(four_clients()),
            train_per_round_clients=3,
            train_total_rounds=ROUNDS,
            program_state_manager=state_manager,
            model_output_manager=MemoryReleaseManager(),
            seed=2,
        )


@pytest.mark.parametrize("name", ["fed_avg", "fed_sgd"])
async def test_a_resumed_run_ends_with_the_uninterrupted_state(name: str, tmp_path) -> None:
    def build():
        shuffled = Preprocessing(epochs=1, batch_size=4, shuffle_buffer=5)
        return BUILDERS[name](preprocess=shuffled, seed=1)

    reference = await run(build(), MemoryProgramStateManager())
    root = tmp_path / "state"
    async with FileProgramStateManager(root) as state:
        with pytest.raises(SimulatedCrash):
            await run(build(), CrashingStateManager(state, 3))
    async with FileProgramStateManager(root) as state:
        result = await run(build(), state)
    assert result.resumed_from == 2 and result.round_num == ROUNDS
    assert_same_state(result.state, reference.state)


async def test_evaluation_draws_nothing() -> None:
    evaluation = functools.partial(
        build_fed_eval, preprocess=Preprocessing(epochs=1, batch_size=4, shuffle_buffer=0)
    )
    noisy, plain = evaluation(NOISY), evaluation(PLAIN)
    weights = process("fed_avg").initialize()["model"]
    clients = handles(four_clients())
    results = []
    async with LocalContext(max_workers=2):
        for each, model in (
            (noisy, weights),
            (noisy, weights),
            (plain, {**weights, "non_trainable": []}),
        ):
            state = each.set_model_weights(each.initialize(), model)
            results.append((await each.next(state, clients)).metrics)
    # The same as the model without its random layers.
    assert results[0] == results[1] == results[2]
