"""FedAvg and FedEval describe their configuration, and train_model holds a resume to it."""

from __future__ import annotations

import functools
import json
import re
from typing import Any

import keras
import numpy as np
import pytest
from learning_support import CLASSES, FEATURES, ragged_clients

from managers import MemoryProgramStateManager, MemoryReleaseManager
from programlogic import InMemoryDataSource, LocalContext, ResumeError, train_model
from programlogic.datasets import Preprocessing
from programlogic.learning import (
    adam,
    build_fed_eval,
    build_weighted_fed_avg,
    mlp,
    sgd,
    softmax_regression,
)

pytestmark = pytest.mark.anyio

PREPROCESS = Preprocessing(epochs=1, batch_size=4, shuffle_buffer=0)


def tanh_mlp(input_shape: tuple[int, ...], num_classes: int) -> keras.Model:
    """The example MLP with tanh in place of ReLU."""
    return keras.Sequential(
        [
            keras.Input(input_shape),
            keras.layers.Dense(128, activation="tanh"),
            keras.layers.Dense(num_classes),
            keras.layers.Softmax(),
        ]
    )


MLP = functools.partial(mlp, (FEATURES,), CLASSES)


def fed_avg(**overrides: Any):
    arguments: dict[str, Any] = {
        "client_optimizer": sgd(0.02),
        "server_optimizer": sgd(1.0),
        "preprocess": PREPROCESS,
        "seed": 3,
    }
    model_fn = overrides.pop("model_fn", MLP)
    arguments.update(overrides)
    return build_weighted_fed_avg(model_fn, **arguments)


async def test_fed_avg_describes_the_same_configuration_for_the_same_arguments() -> None:
    description = fed_avg().describe_configuration()
    assert json.loads(json.dumps(description)) == description
    assert fed_avg().describe_configuration() == description
    assert description["client_optimizer"] == {
        "class": "SGD",
        "learning_rate": 0.02,
        "momentum": 0.0,
    }
    assert description["preprocess"] == {
        "epochs": 1,
        "batch_size": 4,
        "shuffle_buffer": 0,
        "feature_shape": None,
    }
    layers = description["model"]["layers"]
    assert [layer["class"] for layer in layers] == ["Reshape", "Dense", "Dense", "Softmax"]
    assert layers[1]["activation"] == "relu"
    assert layers[1]["weights"] == [[[FEATURES, 128], "float32"], [[128], "float32"]]


@pytest.mark.parametrize(
    ("overrides", "path"),
    [
        ({"client_optimizer": sgd(0.01)}, "client_optimizer/learning_rate"),
        ({"client_optimizer": sgd(0.02, momentum=0.9)}, "client_optimizer/momentum"),
        ({"server_optimizer": adam()}, "server_optimizer/class"),
        ({"preprocess": Preprocessing(epochs=2, batch_size=4)}, "preprocess/epochs"),
        ({"seed": 4}, "seed"),
        ({"model_fn": functools.partial(mlp, (FEATURES,), CLASSES, 64)}, "model/layers/1"),
        ({"model_fn": functools.partial(tanh_mlp, (FEATURES,), CLASSES)}, "model/layers"),
        (
            {"loss": keras.losses.SparseCategoricalCrossentropy(from_logits=True)},
            "model/loss/from_logits",
        ),
        ({"metrics": ()}, "model/metrics"),
    ],
)
async def test_fed_avg_describes_another_configuration_when_a_hyperparameter_differs(
    overrides: dict[str, Any], path: str
) -> None:
    description = fed_avg(**overrides).describe_configuration()
    assert json.loads(json.dumps(description)) == description
    assert description != fed_avg().describe_configuration()
    assert path in _differing_paths("", fed_avg().describe_configuration(), description)


async def test_fed_eval_describes_its_model_and_preprocessing() -> None:
    model_fn = functools.partial(softmax_regression, (FEATURES,), CLASSES)
    description = build_fed_eval(model_fn).describe_configuration()
    assert description == build_fed_eval(model_fn).describe_configuration()
    assert set(description) == {"model", "preprocess"}
    other = build_fed_eval(model_fn, preprocess=Preprocessing(epochs=1, batch_size=7))
    assert other.describe_configuration()["preprocess"]["batch_size"] == 7


async def train(process: Any, state: MemoryProgramStateManager, rounds: int, **extra: Any):
    async with LocalContext(max_workers=2):
        return await train_model(
            train_process=process,
            train_data_source=InMemoryDataSource(ragged_clients()),
            train_per_round_clients=2,
            train_total_rounds=rounds,
            program_state_manager=state,
            model_output_manager=MemoryReleaseManager(),
            **extra,
        )


async def test_resuming_fed_avg_with_a_lowered_learning_rate_is_refused_then_allowed() -> None:
    state = MemoryProgramStateManager()
    await train(fed_avg(), state, 1)
    lowered = fed_avg(client_optimizer=sgd(0.01))
    named = "process/client_optimizer/learning_rate=0.02 (this run: 0.01)"
    with pytest.raises(ResumeError, match=re.escape(named)):
        await train(lowered, state, 2)
    result = await train(lowered, state, 2, resume_with_changed_configuration=True)
    assert result.resumed_from == 1 and result.round_num == 2


async def test_resuming_fed_avg_with_another_model_shape_names_the_weights() -> None:
    # It used to fail in the server step with NumPy's "operands could not be broadcast".
    state = MemoryProgramStateManager()
    await train(fed_avg(), state, 1)
    smaller = fed_avg(model_fn=functools.partial(mlp, (FEATURES,), CLASSES, 64))
    named = "model/trainable/0: shape (8, 128) float32 (this run: shape (8, 64) float32)"
    with pytest.raises(ResumeError, match=re.escape(named)):
        await train(smaller, state, 2, resume_with_changed_configuration=True)


def _differing_paths(path: str, was: Any, now: Any) -> set[str]:
    """Every path, and its prefixes, at which two descriptions differ."""
    if isinstance(was, dict) and isinstance(now, dict):
        found = set()
        for key in {**was, **now}:
            found |= _differing_paths(f"{path}/{key}".lstrip("/"), was.get(key), now.get(key))
        return found | ({path} if found else set())
    if isinstance(was, list) and isinstance(now, list) and len(was) == len(now):
        found = set()
        for index, (old, new) in enumerate(zip(was, now, strict=True)):
            found |= _differing_paths(f"{path}/{index}", old, new)
        return found | ({path} if found else set())
    return {path} if was != now else set()


async def test_numpy_hyperparameters_are_described_as_json_numbers() -> None:
    process = fed_avg(client_optimizer=adam(np.float32(0.5), beta_1=np.float64(0.8)))
    described = process.describe_configuration()["client_optimizer"]
    assert json.loads(json.dumps(described)) == described
    assert described["learning_rate"] == 0.5 and type(described["learning_rate"]) is float
    assert described["beta_1"] == 0.8
