from pathlib import Path
from typing import NamedTuple

import numpy as np
import pytest

from managers import ModelFileReleaseManager, SerializationError, VersionNotFoundError

pytestmark = pytest.mark.anyio


class Weights(NamedTuple):
    kernel: np.ndarray
    bias: np.ndarray


def weights(scale: float) -> Weights:
    return Weights(np.full((3, 2), scale, np.float32), np.arange(2, dtype=np.float64) * scale)


async def test_a_released_model_loads_back_exactly(tmp_path: Path) -> None:
    manager = ModelFileReleaseManager(tmp_path / "models")
    await manager.release(weights(1.5), "final_training_checkpoint_round_10")
    loaded = await manager.load("final_training_checkpoint_round_10", weights(0.0))
    assert type(loaded) is Weights
    assert loaded.kernel.dtype == np.float32
    np.testing.assert_array_equal(loaded.kernel, weights(1.5).kernel)
    np.testing.assert_array_equal(loaded.bias, weights(1.5).bias)
    assert (tmp_path / "models" / "final_training_checkpoint_round_10.model").is_file()


async def test_a_file_per_key_and_re_release_replaces(tmp_path: Path) -> None:
    manager = ModelFileReleaseManager(tmp_path)
    await manager.release({"w": np.ones(2)}, 3)
    await manager.release({"w": np.zeros(2)}, 1)
    await manager.release({"w": np.full(2, 7.0)}, 3)
    await manager.release({"w": np.ones(1)}, "best")
    assert await manager.keys() == [1, 3, "best"]
    np.testing.assert_array_equal((await manager.load(3))["w"], [7.0, 7.0])
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no temporary left


async def test_int_keys_and_str_keys_that_read_as_ints_are_separate_files(
    tmp_path: Path,
) -> None:
    manager = ModelFileReleaseManager(tmp_path)
    await manager.release({"w": np.ones(1)}, 1)
    await manager.release({"w": np.zeros(1)}, "1")
    await manager.release({"w": np.full(1, 2.0)}, -2)
    await manager.release({"w": np.full(1, 3.0)}, "-2")
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "-2.model",
        "1.model",
        "=-2.model",
        "=1.model",
    ]
    reopened = ModelFileReleaseManager(tmp_path)
    assert await reopened.keys() == [-2, 1, "-2", "1"]
    np.testing.assert_array_equal((await reopened.load(1))["w"], [1.0])
    np.testing.assert_array_equal((await reopened.load("1"))["w"], [0.0])
    np.testing.assert_array_equal((await reopened.load(-2))["w"], [2.0])


async def test_missing_and_damaged_models_are_clear_errors(tmp_path: Path) -> None:
    manager = ModelFileReleaseManager(tmp_path)
    with pytest.raises(VersionNotFoundError, match="no model was released under key 4"):
        await manager.load(4)
    await manager.release({"w": np.ones(1000)}, 4)
    path = tmp_path / "4.model"
    path.write_bytes(path.read_bytes()[:-10])
    with pytest.raises(SerializationError):
        await manager.load(4)


@pytest.mark.parametrize("key", ["../escape", ".hidden", "a/b", ""])
async def test_keys_must_be_plain_file_names(tmp_path: Path, key: str) -> None:
    with pytest.raises(ValueError, match="plain file name"):
        await ModelFileReleaseManager(tmp_path).release({"w": 1}, key)


async def test_bad_keys_are_type_errors(tmp_path: Path) -> None:
    with pytest.raises(TypeError, match="int or a str"):
        await ModelFileReleaseManager(tmp_path).release({"w": 1}, 1.5)  # type: ignore[arg-type]
