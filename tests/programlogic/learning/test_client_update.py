"""The client-update seam of the FedAvg builders: what each choice runs, what "auto"
says and picks, what "compiled" and "portable" refuse, and that they train alike."""

import functools
import logging
import pickle
import sys

import numpy as np
import pytest
from learning_support import CLASSES, FEATURES, handles, known_weights, make_client

from programlogic import LocalContext
from programlogic.datasets import Preprocessing
from programlogic.learning import (
    CLIENT_UPDATES,
    adam,
    build_fed_sgd,
    build_unweighted_fed_avg,
    build_unweighted_fed_prox,
    build_weighted_fed_avg,
    build_weighted_fed_prox,
    mlp,
    sgd,
    softmax_regression,
)
from programlogic.learning import client_update as seam
from programlogic.learning._tensorflow import keras

pytestmark = pytest.mark.anyio

SHUFFLED = Preprocessing(epochs=2, batch_size=4, shuffle_buffer=8)
SOFTMAX = functools.partial(softmax_regression, (FEATURES,), CLASSES)
MLP = functools.partial(mlp, (FEATURES,), CLASSES, 4)
KERNELS = (
    "programlogic.learning.client_update._softmax_kernel",
    "programlogic.learning.client_update._softmax_kernel_baseline",
)
BUILDERS = {
    "weighted fed avg": functools.partial(build_weighted_fed_avg, SOFTMAX, sgd(0.3)),
    "unweighted fed avg": functools.partial(build_unweighted_fed_avg, SOFTMAX, sgd(0.3)),
    "weighted fed prox": functools.partial(build_weighted_fed_prox, SOFTMAX, 0.2, sgd(0.3)),
    "unweighted fed prox": functools.partial(build_unweighted_fed_prox, SOFTMAX, 0.2, sgd(0.3)),
}


def regularized_model() -> keras.Model:
    return keras.Sequential(
        [
            keras.Input((FEATURES,)),
            keras.layers.Dense(CLASSES, kernel_regularizer="l2"),
            keras.layers.Softmax(),
        ]
    )


def channels_first_model() -> keras.Model:
    return keras.Sequential(
        [
            keras.Input((2, FEATURES // 2, 1)),
            keras.layers.Flatten(data_format="channels_first"),
            keras.layers.Dense(CLASSES),
            keras.layers.Softmax(),
        ]
    )


@pytest.fixture
def without_extensions(monkeypatch):
    """An install that built neither extension: importing one fails as Python fails it."""
    for name in KERNELS:
        monkeypatch.setitem(sys.modules, name, None)


@pytest.fixture
def fresh_log(monkeypatch, caplog):
    """The seam's log, as a new Python process would write it (each message once)."""
    monkeypatch.setattr(seam, "_logged", set())
    with caplog.at_level(logging.INFO, logger="programlogic.learning.client_update"):
        yield caplog


async def run_rounds(process, rounds=3):
    state = process.set_model_weights(process.initialize(), known_weights())
    clients = handles({str(i): make_client(count, i) for i, count in enumerate((3, 7, 12, 5))})
    history = []
    async with LocalContext(max_workers=2):
        for _ in range(rounds):
            output = await process.next(state, clients)
            state = output.state
            history.append(output)
    return history


def assert_trained_alike(history, other) -> None:
    for output, other_output in zip(history, other, strict=True):
        for weight, other_weight in zip(
            output.state["model"]["trainable"],
            other_output.state["model"]["trainable"],
            strict=True,
        ):
            np.testing.assert_allclose(weight, other_weight, rtol=1e-5, atol=1e-6)
        train = output.metrics["client_work"]["train"]
        other_train = other_output.metrics["client_work"]["train"]
        assert train.keys() == other_train.keys()
        for name, value in other_train.items():
            assert train[name] == pytest.approx(value, rel=1e-5), name


async def test_the_choices_are_named_in_one_place() -> None:
    assert CLIENT_UPDATES == ("auto", "compiled", "portable", "traced")


@pytest.mark.parametrize("builder", list(BUILDERS))
@pytest.mark.parametrize(
    "client_update, active",
    [
        ("auto", "compiled"),
        ("compiled", "compiled"),
        ("portable", "portable"),
        ("traced", "traced"),
    ],
)
async def test_each_builder_runs_the_update_it_is_given(builder, client_update, active) -> None:
    process = BUILDERS[builder](client_update=client_update)
    assert process.client_update == client_update
    assert process.active_client_update == active


@pytest.mark.parametrize("builder", list(BUILDERS))
async def test_every_update_trains_the_softmax_regression_alike(builder) -> None:
    def build(client_update):
        return BUILDERS[builder](preprocess=SHUFFLED, seed=5, client_update=client_update)

    traced = await run_rounds(build("traced"))
    assert_trained_alike(await run_rounds(build("compiled")), traced)
    assert_trained_alike(await run_rounds(build("portable")), traced)


@pytest.mark.parametrize("client_update", ["compiled", "portable"])
async def test_the_loops_give_the_same_bits_from_run_to_run(client_update) -> None:
    def build():
        return build_weighted_fed_avg(SOFTMAX, sgd(0.3), preprocess=SHUFFLED, seed=5,
                                      client_update=client_update)  # fmt: skip

    first, again = await run_rounds(build()), await run_rounds(build())
    for output, other in zip(first, again, strict=True):
        for weight, other_weight in zip(
            output.state["model"]["trainable"], other.state["model"]["trainable"], strict=True
        ):
            np.testing.assert_array_equal(weight, other_weight)


@pytest.mark.parametrize(
    "build, reason",
    [
        (functools.partial(build_weighted_fed_avg, MLP, sgd(0.1)), "activation is relu"),
        (
            functools.partial(build_weighted_fed_avg, SOFTMAX, sgd(0.1, momentum=0.5)),
            "SGD with momentum",
        ),
        (functools.partial(build_weighted_fed_avg, SOFTMAX, adam(0.1)), "optimizer is Adam"),
        (functools.partial(build_weighted_fed_avg, regularized_model, sgd(0.1)), "regularizer"),
        (
            functools.partial(build_weighted_fed_avg, channels_first_model, sgd(0.1)),
            "channels-first",
        ),
        (
            functools.partial(build_weighted_fed_avg, SOFTMAX, sgd(0.1), metrics=("accuracy",)),
            "metrics",
        ),
        (
            functools.partial(build_weighted_fed_avg, SOFTMAX, sgd(0.1), loss="mse"),
            "MeanSquaredError",
        ),
    ],
    ids=["mlp", "momentum", "adam", "regularizer", "channels first", "metric", "loss"],
)
async def test_a_model_the_loop_cannot_train_is_traced_by_auto_and_refused_by_the_loops(
    build, reason, fresh_log
) -> None:
    assert build().active_client_update == "traced"
    assert "chose the traced update" in fresh_log.text and reason in fresh_log.text
    for client_update in ("compiled", "portable"):
        with pytest.raises(ValueError, match=rf"client_update='{client_update}'.*{reason}"):
            build(client_update=client_update)
    assert build(client_update="traced").active_client_update == "traced"


async def test_fed_sgd_has_no_local_training_to_compile() -> None:
    assert build_fed_sgd(SOFTMAX).active_client_update == "traced"


async def test_auto_logs_each_choice_once(fresh_log) -> None:
    for _ in range(3):
        build_weighted_fed_avg(SOFTMAX, sgd(0.25))
        build_weighted_fed_avg(SOFTMAX, adam(0.1))
    assert fresh_log.text.count("chose the compiled loop") == 1
    assert fresh_log.text.count("optimizer is Adam") == 1
    build_weighted_fed_avg(SOFTMAX, sgd(0.25), client_update="compiled")
    build_weighted_fed_avg(SOFTMAX, adam(0.1), client_update="traced")
    assert len(fresh_log.records) == 2  # only "auto" explains itself


async def test_an_install_with_a_c_compiler_builds_both_loops() -> None:
    # The development install (and CI's) compiles both extensions (setup.py).
    assert build_weighted_fed_avg(SOFTMAX, client_update="compiled")
    assert build_weighted_fed_avg(SOFTMAX, client_update="portable")


async def test_without_the_extensions_auto_traces_and_says_what_is_missing(
    without_extensions, fresh_log
) -> None:
    process = build_weighted_fed_avg(SOFTMAX, sgd(0.25))

    assert process.active_client_update == "traced"
    (record,) = fresh_log.records
    assert record.levelno == logging.WARNING
    assert "_softmax_kernel is not installed" in record.getMessage()
    assert "C compiler" in record.getMessage()


@pytest.mark.parametrize("client_update", ["compiled", "portable"])
async def test_without_the_extensions_the_loops_are_refused_naming_the_module(
    without_extensions, client_update
) -> None:
    module = KERNELS[client_update == "portable"].rpartition(".")[2]
    with pytest.raises(ValueError, match=rf"client_update='{client_update}'.*{module} is not"):
        build_weighted_fed_avg(SOFTMAX, client_update=client_update)


@pytest.mark.parametrize("builder", list(BUILDERS))
async def test_a_run_without_the_extensions_trains_the_model_the_loop_trains(
    builder, monkeypatch
) -> None:
    with_loop = BUILDERS[builder](preprocess=SHUFFLED, seed=5)
    looped = await run_rounds(with_loop)
    for name in KERNELS:
        monkeypatch.setitem(sys.modules, name, None)
    without = BUILDERS[builder](preprocess=SHUFFLED, seed=5)

    assert (with_loop.active_client_update, without.active_client_update) == ("compiled", "traced")
    assert_trained_alike(looped, await run_rounds(without))


async def test_a_copy_unpickled_where_the_extensions_are_missing_chooses_again(
    monkeypatch,
) -> None:
    # What a Ray worker installed without a C compiler does with the process it is sent.
    auto, compiled = (
        build_weighted_fed_avg(SOFTMAX, client_update=c) for c in ("auto", "compiled")
    )
    shipped_auto, shipped_compiled = pickle.dumps(auto), pickle.dumps(compiled)
    assert pickle.loads(shipped_auto).active_client_update == "compiled"
    for name in KERNELS:
        monkeypatch.setitem(sys.modules, name, None)

    assert pickle.loads(shipped_auto).active_client_update == "traced"
    with pytest.raises(ValueError, match="client_update='compiled'"):
        pickle.loads(shipped_compiled)


@pytest.mark.parametrize("bad, error", [("fast", ValueError), (None, TypeError), (1, TypeError)])
async def test_a_client_update_not_among_the_choices_is_refused(bad, error) -> None:
    with pytest.raises(error, match="client_update must be one of 'auto', 'compiled'"):
        build_weighted_fed_avg(SOFTMAX, client_update=bad)


async def test_the_configuration_leaves_the_client_update_out() -> None:
    # A run resumed on a machine without the loop, or traced, trains the same model.
    configs = {
        c: build_weighted_fed_avg(SOFTMAX, client_update=c).describe_configuration()
        for c in CLIENT_UPDATES
    }
    assert all(config == configs["auto"] for config in configs.values())
