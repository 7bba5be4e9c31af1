"""The Keras model release manager: models a user loads in another process and serves.

A FedAvg run on the digits releases its final model; a fresh Python process loads each
format as a user would and predicts, and the predictions must be those of a model built
here with the trained weights.
"""

import functools
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from managers import MemoryProgramStateManager
from programlogic import LocalContext, final_model_key, train_model
from programlogic.datasets import Preprocessing, load_digits_writers
from programlogic.learning import (
    KerasModelReleaseManager,
    build_weighted_fed_avg,
    sgd,
    softmax_regression,
)
from programlogic.learning._tensorflow import keras
from programlogic.learning.keras_release import model_version

# Keras' .keras writer reads a TensorFlow variable with np.array(variable, copy=False),
# which NumPy 2 warns about (TensorFlow's variables predate the copy keyword).
pytestmark = [
    pytest.mark.anyio,
    pytest.mark.filterwarnings(
        "ignore:__array__ implementation doesn't accept a copy keyword:DeprecationWarning"
    ),
]

DIGITS = load_digits_writers()
MODEL_FN = functools.partial(softmax_regression, DIGITS.feature_shape, DIGITS.num_classes)

LOAD_AND_PREDICT = textwrap.dedent(
    """
    import sys

    import keras
    import numpy as np
    import tensorflow as tf

    version, features, out = sys.argv[1:]
    x = np.load(features)
    model = keras.saving.load_model(f"{version}/model.keras")
    np.save(f"{out}/keras.npy", model.predict(x, verbose=0))
    serve = tf.saved_model.load(version).signatures["serving_default"]
    np.save(f"{out}/saved_model.npy", serve(inputs=tf.constant(x))["output_0"].numpy())
    """
)


def weights_like(seed: int) -> dict[str, list[np.ndarray]]:
    """Weights for the digits' softmax regression, drawn from ``seed``."""
    model = MODEL_FN()
    draw = np.random.default_rng(seed)
    return {
        "trainable": [draw.normal(size=v.shape).astype(np.float32) for v in model.weights],
        "non_trainable": [],
    }


def predictions(weights: dict[str, list[np.ndarray]], x: np.ndarray) -> np.ndarray:
    model = MODEL_FN()
    model.set_weights([*weights["trainable"], *weights["non_trainable"]])
    return model.predict(x, verbose=0)


def loaded_kernel(path: Path) -> np.ndarray:
    return keras.saving.load_model(path).get_weights()[0]


async def test_each_format_loads_in_a_fresh_process_and_predicts_as_the_trained_weights(
    tmp_path: Path,
) -> None:
    process = build_weighted_fed_avg(
        MODEL_FN,
        sgd(0.3),
        sgd(1.0),
        preprocess=Preprocessing(epochs=1, batch_size=20, shuffle_buffer=100),
    )
    async with LocalContext():
        result = await train_model(
            train_process=process,
            train_data_source=DIGITS.train,
            train_per_round_clients=3,
            train_total_rounds=2,
            program_state_manager=MemoryProgramStateManager(),
            model_output_manager=KerasModelReleaseManager(tmp_path, MODEL_FN),
        )
    assert os.listdir(tmp_path / "model") == ["2"]  # final_model_key(2) -> version 2
    version = tmp_path / "model" / "2"
    assert (version / "saved_model.pb").is_file() and (version / "model.keras").is_file()

    x = np.concatenate([client.load().x for client in DIGITS.test.all_clients()[:2]])
    np.save(tmp_path / "x.npy", x)
    loaded = subprocess.run(
        [sys.executable, "-c", LOAD_AND_PREDICT, str(version), str(tmp_path / "x.npy"), tmp_path],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert loaded.returncode == 0, loaded.stderr
    expected = predictions(process.get_model_weights(result.state), x)
    assert expected.shape == (len(x), 10) and expected.std() > 0.01  # a trained model
    for name in ("keras", "saved_model"):
        np.testing.assert_allclose(np.load(tmp_path / f"{name}.npy"), expected, rtol=0, atol=1e-6)


async def test_releasing_a_key_again_replaces_its_version_whole(tmp_path: Path) -> None:
    models = KerasModelReleaseManager(tmp_path, MODEL_FN, formats=("keras",), name="digits")
    first, second = weights_like(1), weights_like(2)
    async with models:
        await models.release(first, 3)
        await models.release(weights_like(5), final_model_key(5))
        await models.release(second, 3)
    assert sorted(os.listdir(tmp_path / "digits")) == ["3", "5"]
    assert os.listdir(tmp_path / "digits" / "3") == ["digits.keras"]
    assert models.keras_path(3) == tmp_path / "digits" / "3" / "digits.keras"
    np.testing.assert_array_equal(loaded_kernel(models.keras_path(3)), second["trainable"][0])


async def test_a_crash_while_replacing_leaves_the_old_version_and_a_restart_puts_it_back(
    tmp_path: Path,
) -> None:
    old = weights_like(1)
    async with KerasModelReleaseManager(tmp_path, MODEL_FN) as models:
        await models.release(old, 3)
    # What a crash between moving version 3 aside and renaming its replacement leaves:
    (tmp_path / "model" / "3").rename(tmp_path / "model" / ".old-3-0badc0de")
    (tmp_path / "model" / ".new-3-5eed5eed").mkdir()
    (tmp_path / "model" / ".new-3-5eed5eed" / "model.keras").write_bytes(b"half")
    async with KerasModelReleaseManager(tmp_path, MODEL_FN) as restarted:
        await restarted.release(weights_like(2), 4)
    assert sorted(os.listdir(tmp_path / "model")) == ["3", "4"]
    np.testing.assert_array_equal(
        loaded_kernel(tmp_path / "model" / "3" / "model.keras"), old["trainable"][0]
    )
    assert (tmp_path / "model" / "3" / "saved_model.pb").is_file()  # moved back with it


async def test_a_failed_release_leaves_the_version_it_would_replace(tmp_path: Path) -> None:
    old = weights_like(1)
    async with KerasModelReleaseManager(tmp_path, MODEL_FN) as models:
        await models.release(old, 3)
        wrong = {"trainable": [np.zeros((3, 3), np.float32), np.zeros(10)], "non_trainable": []}
        with pytest.raises(ValueError, match=r"trainable\[0\].* has shape \(3, 3\)"):
            await models.release(wrong, 3)
        with pytest.raises(TypeError, match="model weights must be"):
            await models.release({"kernel": 1.0}, 3)
    assert os.listdir(tmp_path / "model") == ["3"]
    np.testing.assert_array_equal(loaded_kernel(models.keras_path(3)), old["trainable"][0])


async def test_an_evaluated_model_is_written_with_its_weights(tmp_path: Path) -> None:
    weights = weights_like(4)
    async with KerasModelReleaseManager(tmp_path, MODEL_FN, formats=["keras"]) as models:
        await models.release({"weights": weights, "metrics": {"loss": 0.5}}, 6)
    np.testing.assert_array_equal(loaded_kernel(models.keras_path(6)), weights["trainable"][0])


async def test_a_version_is_the_round_of_the_key(tmp_path: Path) -> None:
    assert model_version(7) == 7
    assert model_version(final_model_key(12)) == 12
    with pytest.raises(TypeError, match="got 'best'"):
        model_version("best")
    with pytest.raises(ValueError, match="got -1"):
        model_version(-1)
    with pytest.raises(TypeError, match=r"release key must be an int or a str, got float 1\.0"):
        model_version(1.0)
    models = KerasModelReleaseManager(tmp_path, MODEL_FN)
    assert models.version_path(final_model_key(3)) == tmp_path / "model" / "3"
    assert models.base_path == tmp_path / "model"


async def test_model_fn_must_build_a_keras_model(tmp_path: Path) -> None:
    async with KerasModelReleaseManager(tmp_path, dict) as models:
        with pytest.raises(TypeError, match=r"model_fn must return a keras\.Model, got dict"):
            await models.release(weights_like(1), 1)
    assert not (tmp_path / "model").exists()
