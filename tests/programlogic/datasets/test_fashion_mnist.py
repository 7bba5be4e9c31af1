import gzip
import pickle
import re
from pathlib import Path

import numpy as np
import pytest

from programlogic.datasets import load_fashion_mnist
from programlogic.datasets.fashion_mnist import DEFAULT_FASHION_MNIST_PATH

pytestmark = pytest.mark.anyio

INSTALLED = (DEFAULT_FASHION_MNIST_PATH / "train-images-idx3-ubyte.gz").exists()


def write_idx(file: Path, array: np.ndarray) -> None:
    header = bytes([0, 0, 0x08, array.ndim]) + b"".join(
        size.to_bytes(4, "big") for size in array.shape
    )
    with gzip.open(file, "wb") as stream:
        stream.write(header + array.astype(np.uint8).tobytes())


def write_fake_files(directory: Path, train: int = 300, test: int = 40, shift: int = 0) -> None:
    """Image i holds i in its first two pixels (low byte, high byte), plus ``shift`` in
    every other pixel, and is labelled i % 10."""
    for prefix, count in (("train", train), ("t10k", test)):
        images = np.full((count, 28, 28), shift, dtype=np.uint8)
        images[:, 0, 0] = np.arange(count) % 256
        images[:, 0, 1] = np.arange(count) // 256
        write_idx(directory / f"{prefix}-images-idx3-ubyte.gz", images)
        write_idx(directory / f"{prefix}-labels-idx1-ubyte.gz", np.arange(count) % 10)


def image_ids(x: np.ndarray) -> np.ndarray:
    return np.rint(x[:, 0, 0] * 255).astype(int) + 256 * np.rint(x[:, 0, 1] * 255).astype(int)


def all_arrays(source) -> tuple[np.ndarray, np.ndarray]:
    loaded = [handle.load() for handle in source.all_clients()]
    return np.concatenate([c.x for c in loaded]), np.concatenate([c.y for c in loaded])


async def test_clients_hold_every_image_once_scaled_with_its_label(tmp_path: Path) -> None:
    write_fake_files(tmp_path)
    data = load_fashion_mnist(12, alpha=0.3, num_test_clients=4, seed=1, path=tmp_path)
    assert data.train.client_ids == [f"client_{i:02d}" for i in range(12)]
    assert data.test.client_ids == [f"test_{i}" for i in range(4)]
    assert (data.feature_shape, data.num_classes, data.name) == ((28, 28), 10, "fashion_mnist")
    x, y = all_arrays(data.train)
    assert x.shape == (300, 28, 28) and x.dtype == np.float32 and y.dtype == np.int32
    ids = image_ids(x)
    assert sorted(ids.tolist()) == list(range(300))
    assert (y == ids % 10).all()
    assert (x >= 0).all() and (x <= 1).all()
    assert all(len(h.load().y) >= 1 for h in data.train.all_clients())


async def test_test_clients_are_equal_shuffled_pieces_of_the_test_images(tmp_path: Path) -> None:
    write_fake_files(tmp_path)
    data = load_fashion_mnist(5, num_test_clients=4, path=tmp_path)
    pieces = [handle.load() for handle in data.test.all_clients()]
    assert [piece.y.size for piece in pieces] == [10] * 4
    ids = np.concatenate([image_ids(piece.x) for piece in pieces])
    assert sorted(ids.tolist()) == list(range(40))
    assert ids.tolist() != list(range(40))


async def test_the_split_is_a_pure_function_of_the_seed(tmp_path: Path) -> None:
    write_fake_files(tmp_path)

    def sizes(seed: int) -> list[int]:
        data = load_fashion_mnist(8, seed=seed, path=tmp_path)
        return [len(h.load().y) for h in data.train.all_clients()]

    assert sizes(3) == sizes(3)
    assert sizes(3) != sizes(4)


async def test_a_replaced_file_is_read_again(tmp_path: Path) -> None:
    write_fake_files(tmp_path)
    before, _ = all_arrays(load_fashion_mnist(2, path=tmp_path).test)
    write_fake_files(tmp_path, test=50, shift=100)
    after, _ = all_arrays(load_fashion_mnist(2, path=tmp_path).test)
    assert before.shape[0] == 40 and (before[:, 5, 5] == 0).all()
    assert after.shape[0] == 50
    np.testing.assert_allclose(after[:, 5, 5], 100 / 255)


async def test_missing_files_name_the_path_and_the_package(tmp_path: Path) -> None:
    expected = re.escape(str(tmp_path / "train-images-idx3-ubyte.gz"))
    with pytest.raises(FileNotFoundError, match=f"{expected}.*apt-get install dataset-fashion"):
        load_fashion_mnist(path=tmp_path)


async def test_a_file_that_is_not_idx_is_a_value_error(tmp_path: Path) -> None:
    write_fake_files(tmp_path)
    with gzip.open(tmp_path / "t10k-labels-idx1-ubyte.gz", "wb") as stream:
        stream.write(b"not an idx file")
    with pytest.raises(ValueError, match=r"t10k-labels-idx1-ubyte.gz is not an IDX file"):
        load_fashion_mnist(path=tmp_path)


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        ({"num_clients": 0}, "num_clients must be an int >= 1, got 0"),
        ({"num_clients": 301}, r"at most the number of examples \(300\), got 301"),
        ({"num_test_clients": 41}, r"at most the number of test images \(40\), got 41"),
        ({"alpha": -1.0}, "alpha must be a finite number > 0, got -1.0"),
        ({"sampling": "all"}, "sampling must be one of .* got 'all'"),
    ],
)
async def test_bad_arguments_are_value_errors(
    tmp_path: Path, arguments: dict, message: str
) -> None:
    write_fake_files(tmp_path)
    with pytest.raises(ValueError, match=message):
        load_fashion_mnist(**({"path": tmp_path} | arguments))


async def test_an_argument_of_the_wrong_type_is_a_type_error(tmp_path: Path) -> None:
    write_fake_files(tmp_path)
    with pytest.raises(TypeError, match=r"seed must be an int >= 0, got float 1\.5"):
        load_fashion_mnist(path=tmp_path, seed=1.5)


@pytest.mark.skipif(
    not INSTALLED,
    reason=f"Debian's dataset-fashion-mnist is not installed in {DEFAULT_FASHION_MNIST_PATH}",
)
async def test_the_real_files_give_label_skewed_clients() -> None:
    data = load_fashion_mnist(100, alpha=0.5, num_test_clients=10, seed=0)
    train = [handle.load() for handle in data.train.all_clients()]
    assert len(train) == 100 and min(client.y.size for client in train) >= 1
    assert sum(client.y.size for client in train) == 60_000
    assert [len(handle.load().y) for handle in data.test.all_clients()] == [1000] * 10
    first = train[0]
    assert first.x.shape[1:] == (28, 28) and first.x.dtype == np.float32
    assert 0.0 <= first.x.min() and first.x.max() <= 1.0
    shares = [np.bincount(client.y, minlength=10).max() / client.y.size for client in train]
    assert np.mean(shares) > 0.3  # an even mix of the 10 classes would give about 0.1
    assert pickle.loads(pickle.dumps(first)).y.tolist() == first.y.tolist()
