import functools
import pickle

import keras
import numpy as np
import pytest
from learning_support import (
    CLASSES,
    FEATURES,
    handles,
    known_weights,
    make_client,
    per_example,
    ragged_clients,
)

from programlogic import InMemoryDataSource, LocalContext, evaluate_once
from programlogic.datasets import ClientArrays, Preprocessing
from programlogic.learning import (
    FederatedEvaluation,
    build_fed_eval,
    build_weighted_fed_avg,
    softmax_regression,
)

pytestmark = pytest.mark.anyio

SMALL_MODEL = functools.partial(softmax_regression, (FEATURES,), CLASSES)


@functools.cache
def evaluation() -> FederatedEvaluation:
    # Clients of 3, 7 and 12 examples in batches of 4: 1, 2 and 3 batches, two of them
    # partial, stacked in one group of 3.
    return build_fed_eval(
        SMALL_MODEL,
        preprocess=Preprocessing(epochs=1, batch_size=4, shuffle_buffer=0),
        clients_per_group=3,
    )


@functools.cache
def more_clients() -> dict[str, ClientArrays]:
    """Other clients with the same group shape as the ragged ones (at most 3 batches)."""
    return {"d": make_client(9, 20), "e": make_client(5, 21), "f": make_client(11, 22)}


def expected_metrics(weights, clients) -> dict:
    """Example-weighted loss and accuracy of ``weights`` over every example of ``clients``."""
    x = np.concatenate([data.x for data in clients])
    y = np.concatenate([data.y for data in clients])
    losses, correct = per_example(weights["trainable"], x, y)
    return {
        "loss": pytest.approx(losses.mean(), rel=1e-5),
        "sparse_categorical_accuracy": pytest.approx(correct.mean(), rel=1e-6),
        "num_examples": len(y),
    }


async def evaluate_rounds(process: FederatedEvaluation, state, rounds):
    outputs = []
    async with LocalContext(max_workers=2):
        for clients in rounds:
            output = await process.next(state, clients)
            state = output.state
            outputs.append(output)
    return outputs


async def test_metrics_of_a_round_and_of_all_rounds_since_the_weights_were_set() -> None:
    process = evaluation()
    weights = known_weights()
    state = process.set_model_weights(process.initialize(), weights)
    first, second = ragged_clients(), more_clients()

    outputs = await evaluate_rounds(process, state, [handles(first), handles(second)])

    rounds = [output.metrics["client_work"]["eval"] for output in outputs]
    assert rounds[0]["current_round_metrics"] == expected_metrics(weights, first.values())
    assert rounds[0]["total_rounds_metrics"] == expected_metrics(weights, first.values())
    assert rounds[1]["current_round_metrics"] == expected_metrics(weights, second.values())
    both = [*first.values(), *second.values()]
    assert rounds[1]["total_rounds_metrics"] == expected_metrics(weights, both)
    # The accuracy is not trivially 0 or 1, so it checks the masking of padded examples.
    assert 0 < rounds[1]["total_rounds_metrics"]["sparse_categorical_accuracy"] < 1

    # Setting weights starts the totals over.
    other = known_weights(seed=7)
    reset = process.set_model_weights(outputs[-1].state, other)
    (output,) = await evaluate_rounds(process, reset, [handles(first)])
    metrics = output.metrics["client_work"]["eval"]
    assert metrics["total_rounds_metrics"] == expected_metrics(other, first.values())
    assert metrics["current_round_metrics"] == metrics["total_rounds_metrics"]
    np.testing.assert_array_equal(
        process.get_model_weights(output.state)["trainable"][0], other["trainable"][0]
    )


async def test_an_evaluation_does_not_change_the_weights() -> None:
    process = evaluation()
    state = process.set_model_weights(process.initialize(), known_weights())
    (output,) = await evaluate_rounds(process, state, [handles(ragged_clients())])
    for kept, given in zip(
        output.state["model"]["trainable"], known_weights()["trainable"], strict=True
    ):
        assert kept.tobytes() == given.tobytes()


async def test_evaluate_once_evaluates_every_client_of_a_source() -> None:
    weights = known_weights(seed=3)
    async with LocalContext(max_workers=2):
        metrics = await evaluate_once(evaluation(), weights, InMemoryDataSource(more_clients()))

    current = metrics["client_work"]["eval"]["current_round_metrics"]
    assert current == expected_metrics(weights, more_clients().values())


async def test_an_evaluation_needs_clients() -> None:
    process = evaluation()
    with pytest.raises(ValueError, match="an evaluation round needs at least one client"):
        await process.next(process.initialize(), [])


async def test_an_evaluation_sees_every_example_once() -> None:
    with pytest.raises(ValueError, match=r"preprocess\.epochs must be 1, got 2"):
        build_fed_eval(SMALL_MODEL, preprocess=Preprocessing(epochs=2))
    with pytest.raises(TypeError, match="preprocess must be a Preprocessing, got str"):
        build_fed_eval(SMALL_MODEL, preprocess="batch")
    with pytest.raises(ValueError, match="clients_per_group must be an int >= 1 or None, got -1"):
        build_fed_eval(SMALL_MODEL, clients_per_group=-1)


async def test_an_evaluation_pickles_and_the_copy_evaluates_alike() -> None:
    process = evaluation()
    copy = pickle.loads(pickle.dumps(process))
    state = process.set_model_weights(process.initialize(), known_weights())
    clients = [handles(ragged_clients())]
    original = await evaluate_rounds(process, state, clients)
    copied = await evaluate_rounds(copy, state, clients)
    assert original[0].metrics == copied[0].metrics


async def test_clients_whose_examples_pad_apart_evaluate_with_one_compiled_shape() -> None:
    # 9 and 12 examples pad to 10 and 12, in 3 batches of 4 each: a group of one client
    # apiece, in both orders, as a held-out set evaluated round after round.
    process = build_fed_eval(
        SMALL_MODEL,
        loss=keras.losses.SparseCategoricalCrossentropy(),  # its own compiled function
        preprocess=Preprocessing(epochs=1, batch_size=4, shuffle_buffer=0),
        clients_per_group=1,
    )
    clients = {"g": make_client(9, 23), "h": make_client(12, 24)}
    weights = known_weights(seed=5)
    state = process.set_model_weights(process.initialize(), weights)
    in_order = handles(clients)

    outputs = await evaluate_rounds(process, state, [in_order, in_order[::-1]])

    assert process._compiled.traced_count == 1  # the argument shapes it compiled for
    expected = expected_metrics(weights, clients.values())
    for output in outputs:
        assert output.metrics["client_work"]["eval"]["current_round_metrics"] == expected


def images(count: int, seed: int) -> ClientArrays:
    """``count`` random 28x28 images with labels among 10 classes."""
    rng = np.random.default_rng(seed)
    x = rng.random((count, 28, 28), dtype=np.float32)
    return ClientArrays(x, rng.integers(0, 10, count).astype(np.int32))


async def test_the_evaluation_of_a_training_process_shapes_examples_as_it_trained() -> None:
    # A 784-input model trained on 28x28 images: evaluating it needs the training's
    # feature shape, which build_fed_eval takes from the training process.
    flat_model = functools.partial(softmax_regression, (784,), 10)
    training = build_weighted_fed_avg(
        flat_model, preprocess=Preprocessing(epochs=3, batch_size=6, feature_shape=(784,))
    )
    evaluation = build_fed_eval(flat_model, train_process=training)
    clients = {"a": images(5, 1), "b": images(13, 2)}
    flattened = {
        client_id: ClientArrays(data.x.reshape(len(data.y), 784), data.y)
        for client_id, data in clients.items()
    }
    weights = training.get_model_weights(training.initialize())
    async with LocalContext(max_workers=2):
        on_images = await evaluate_once(evaluation, weights, InMemoryDataSource(clients))
        on_flat = await evaluate_once(
            build_fed_eval(flat_model), weights, InMemoryDataSource(flattened)
        )

    assert evaluation.preprocess == Preprocessing(
        epochs=1, batch_size=6, shuffle_buffer=0, feature_shape=(784,)
    )
    metrics = on_images["client_work"]["eval"]["current_round_metrics"]
    assert metrics["num_examples"] == 18
    assert metrics == pytest.approx(on_flat["client_work"]["eval"]["current_round_metrics"])


async def test_a_given_preprocess_wins_over_the_training_process() -> None:
    training = build_weighted_fed_avg(SMALL_MODEL, preprocess=Preprocessing(batch_size=3))
    given = Preprocessing(epochs=1, batch_size=50, shuffle_buffer=0)
    assert build_fed_eval(SMALL_MODEL, preprocess=given, train_process=training).preprocess == given
    with pytest.raises(TypeError, match="train_process must be a WeightedFedAvg or None, got str"):
        build_fed_eval(SMALL_MODEL, train_process="fedavg")


# Evaluations built alike compile once.


class TracedDense(keras.layers.Dense):
    """A dense layer that counts the times its computation is traced (or built)."""

    traces = 0

    def call(self, inputs):
        TracedDense.traces += 1
        return super().call(inputs)


def traced_model() -> keras.Model:
    """``softmax_regression((FEATURES,), CLASSES)`` with a :class:`TracedDense` layer."""
    return keras.Sequential(
        [keras.Input((FEATURES,)), TracedDense(CLASSES), keras.layers.Softmax()]
    )


class DoubledCrossentropy(keras.losses.Loss):
    """Twice the cross-entropy: a loss only the object itself describes, not Keras."""

    def call(self, y_true, y_pred):
        return 2.0 * keras.losses.sparse_categorical_crossentropy(y_true, y_pred)


def traced_evaluation(loss=None) -> FederatedEvaluation:
    return build_fed_eval(
        traced_model,
        loss=loss,
        preprocess=Preprocessing(epochs=1, batch_size=4, shuffle_buffer=0),
        clients_per_group=3,
    )


async def test_a_new_evaluation_built_alike_reuses_the_compiled_function() -> None:
    # As a program whose create_process_fn builds an evaluation for every evaluated
    # round, and a worker that unpickles each one it is shipped.
    weights = known_weights()
    source = InMemoryDataSource(more_clients())
    async with LocalContext(max_workers=2):
        first = await evaluate_once(traced_evaluation(), weights, source)
        again, shipped = traced_evaluation(), pickle.loads(pickle.dumps(traced_evaluation()))
        traces = TracedDense.traces
        second = await evaluate_once(again, weights, source)
        third = await evaluate_once(shipped, weights, source)
        assert TracedDense.traces == traces

        # Another loss is another function: traced anew, with that loss.
        doubled = await evaluate_once(traced_evaluation(DoubledCrossentropy()), weights, source)
        assert TracedDense.traces > traces

    expected = expected_metrics(weights, more_clients().values())
    for metrics in (first, second, third):
        assert metrics["client_work"]["eval"]["current_round_metrics"] == expected
    doubled_metrics = doubled["client_work"]["eval"]["current_round_metrics"]
    assert doubled_metrics["loss"] == pytest.approx(2 * expected["loss"].expected, rel=1e-5)
