"""The data sources of the library kept to the FederatedDataSource contract."""

import gzip
from collections.abc import Callable
from pathlib import Path

import h5py
import numpy as np
import pytest

from programlogic import InMemoryDataSource
from programlogic.datasets import load_digits_writers, load_emnist_h5, load_fashion_mnist
from programlogic.datasets.fashion_mnist import DEFAULT_FASHION_MNIST_PATH
from programlogic.testing import FakeDataSource
from programlogic.testing.contracts import FederatedDataSourceContract


class TestInMemoryDataSource(FederatedDataSourceContract):
    @pytest.fixture
    def make_source(self) -> Callable[[], InMemoryDataSource]:
        data = {f"writer_{i}": {"x": np.full((i + 1, 2), i, np.float32)} for i in range(7)}
        return lambda: InMemoryDataSource(data)


class TestFixedCohortInMemoryDataSource(FederatedDataSourceContract):
    @pytest.fixture
    def make_source(self) -> Callable[[], InMemoryDataSource]:
        return lambda: InMemoryDataSource({f"c{i}": [i] for i in range(5)}, sampling="fixed")


class TestInMemoryDataSourceWithReplacement(FederatedDataSourceContract):
    distinct_clients = False

    @pytest.fixture
    def make_source(self) -> Callable[[], InMemoryDataSource]:
        return lambda: InMemoryDataSource(
            {f"c{i}": [i] for i in range(4)}, sampling="with_replacement"
        )


class TestFakeDataSource(FederatedDataSourceContract):
    @pytest.fixture
    def make_source(self) -> Callable[[], FakeDataSource]:
        return lambda: FakeDataSource(12, examples_per_client=3, seed=4)


class TestDigitsWritersDataSource(FederatedDataSourceContract):
    @pytest.fixture
    def make_source(self):
        return lambda: load_digits_writers().train


@pytest.mark.skipif(
    not (DEFAULT_FASHION_MNIST_PATH / "train-images-idx3-ubyte.gz").exists(),
    reason=f"Fashion-MNIST is not installed at {DEFAULT_FASHION_MNIST_PATH} "
    "(apt-get install dataset-fashion-mnist)",
)
class TestFashionMnistDataSource(FederatedDataSourceContract):
    @pytest.fixture
    def make_source(self):
        return lambda: load_fashion_mnist(20, alpha=0.5, num_test_clients=2, seed=1).train


class TestFashionMnistLayoutDataSource(FederatedDataSourceContract):
    """The Fashion-MNIST loader on small files of its layout (IDX, gzipped)."""

    @pytest.fixture
    def make_source(self, tmp_path: Path):
        for prefix, count in (("train", 120), ("t10k", 20)):
            images = np.arange(count * 28 * 28).reshape(count, 28, 28) % 256
            write_idx(tmp_path / f"{prefix}-images-idx3-ubyte.gz", images)
            write_idx(tmp_path / f"{prefix}-labels-idx1-ubyte.gz", np.arange(count) % 10)
        return lambda: load_fashion_mnist(8, num_test_clients=2, seed=3, path=tmp_path).train


def write_idx(file: Path, array: np.ndarray) -> None:
    """``array`` as an IDX file of unsigned bytes, gzipped."""
    header = bytes([0, 0, 0x08, array.ndim]) + b"".join(n.to_bytes(4, "big") for n in array.shape)
    with gzip.open(file, "wb") as stream:
        stream.write(header + array.astype(np.uint8).tobytes())


class TestEmnistHDF5DataSource(FederatedDataSourceContract):
    @pytest.fixture
    def make_source(self, tmp_path: Path):
        train = tmp_path / "fed_emnist_digitsonly_train.h5"
        for path, writers in ((train, 6), (tmp_path / "fed_emnist_digitsonly_test.h5", 2)):
            with h5py.File(path, "w") as h5:
                examples = h5.create_group("examples")
                for k in range(writers):
                    group = examples.create_group(f"f{k:04d}_{k * 7 % 100:02d}")
                    pixels = np.full((k + 1, 28, 28), k / 10, dtype=np.float32)
                    group.create_dataset("pixels", data=pixels)
                    group.create_dataset("label", data=np.arange(k + 1, dtype=np.int32) % 10)
        return lambda: load_emnist_h5(train).train


class DuplicatingSource:
    """A source of one's own whose client ids hold one id twice."""

    def __init__(self) -> None:
        self.inner = FakeDataSource(4)

    @property
    def client_ids(self) -> list[str]:
        return [*self.inner.client_ids, "client_2"]

    def iterator(self, seed: int):
        return self.inner.iterator(seed)


@pytest.mark.anyio
async def test_the_suite_fails_a_source_whose_client_ids_repeat() -> None:
    suite = FederatedDataSourceContract()
    with pytest.raises(AssertionError, match=r"must be distinct.*\['client_2'\]"):
        await suite.test_client_ids_are_distinct_strings_in_a_stable_order(DuplicatingSource)


class TestPoissonInMemoryDataSource(FederatedDataSourceContract):
    exact_round_size = False

    @pytest.fixture
    def make_source(self) -> Callable[[], InMemoryDataSource]:
        return lambda: InMemoryDataSource({f"c{i}": [i] for i in range(12)}, sampling="poisson")
