import pickle
import sys
from pathlib import Path

import h5py
import numpy as np
import pytest

from programlogic import ClientHandle, FederatedDataSource
from programlogic.datasets import HDF5DataSource, Preprocessing, load_emnist_h5

pytestmark = pytest.mark.anyio

SIZES = {"f0000_14": 3, "f0001_41": 5, "f0002_33": 1, "f0003_07": 4}


def write_h5(file: Path, sizes: dict[str, int], offset: float = 0.0) -> None:
    """TFF's layout; every pixel of example j of client k is k + j / 10 + offset."""
    with h5py.File(file, "w") as h5:
        examples = h5.create_group("examples")
        for k, (client_id, size) in enumerate(sizes.items()):
            group = examples.create_group(client_id)
            values = k + np.arange(size, dtype=np.float32) / 10 + offset
            group.create_dataset("pixels", data=np.repeat(values, 784).reshape(size, 28, 28))
            group.create_dataset("label", data=np.arange(size, dtype=np.int32) + k)


@pytest.fixture
def files(tmp_path: Path) -> Path:
    write_h5(tmp_path / "fed_emnist_digitsonly_train.h5", SIZES)
    write_h5(tmp_path / "fed_emnist_digitsonly_test.h5", {"f0000_14": 2, "f0003_07": 1}, 0.5)
    return tmp_path / "fed_emnist_digitsonly_train.h5"


async def test_clients_are_the_writers_of_the_file_and_load_their_arrays(files: Path) -> None:
    data = load_emnist_h5(files)
    assert isinstance(data.train, FederatedDataSource)
    assert data.train.client_ids == sorted(SIZES)
    assert (data.feature_shape, data.num_classes, data.name) == ((28, 28), 10, "emnist_digits")
    arrays = {h.client_id: h.load() for h in data.train.all_clients()}
    second = arrays["f0001_41"]
    assert second.x.shape == (5, 28, 28) and second.x.dtype == np.float32
    assert second.y.tolist() == [1, 2, 3, 4, 5] and second.y.dtype == np.int32
    np.testing.assert_allclose(second.x[:, 3, 3], [1.0, 1.1, 1.2, 1.3, 1.4])
    assert [arrays[key].y.size for key in sorted(SIZES)] == [SIZES[k] for k in sorted(SIZES)]


async def test_the_test_file_is_found_next_to_the_training_file(files: Path) -> None:
    test = load_emnist_h5(files).test
    assert test.client_ids == ["f0000_14", "f0003_07"]
    np.testing.assert_allclose(test.all_clients()[0].load().x[:, 0, 0], [0.5, 0.6])


async def test_handles_read_the_file_when_loaded_not_before(files: Path) -> None:
    data = load_emnist_h5(files)
    write_h5(files, SIZES, offset=7.0)  # rewritten after the source was made
    assert data.train.all_clients()[0].load().x[0, 0, 0] == 7.0


async def test_handles_pickle_as_a_path_and_an_id(files: Path) -> None:
    handle = load_emnist_h5(files).train.iterator(0).select(1, 1)[0]
    assert isinstance(handle, ClientHandle)
    payload = pickle.dumps(handle)
    assert len(payload) < 500
    copy = pickle.loads(payload)
    assert copy.client_id == handle.client_id
    np.testing.assert_array_equal(copy.load().x, handle.load().x)


async def test_sampling_and_preprocessing_work_on_the_lazy_source(files: Path) -> None:
    data = load_emnist_h5(files, sampling="with_replacement")
    chosen = data.train.iterator(3).select(10, 1)
    assert len(chosen) == 10 and {h.client_id for h in chosen} <= set(SIZES)
    batches = Preprocessing(epochs=2, batch_size=4, feature_shape=(784,))(chosen[0].load(), 1)
    assert batches.x.shape[1:] == (4, 784)


async def test_letters_and_digits_have_62_classes(files: Path) -> None:
    data = load_emnist_h5(
        files, files.with_name("fed_emnist_digitsonly_test.h5"), only_digits=False
    )
    assert (data.num_classes, data.name) == (62, "emnist")


async def test_errors_name_the_argument_or_the_file(files: Path, tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="test_path is needed when train_path has no '_train'"):
        load_emnist_h5(tmp_path / "emnist.h5")
    with pytest.raises(
        FileNotFoundError, match=r"federated HDF5 file .*missing_test\.h5 not found"
    ):
        load_emnist_h5(files, tmp_path / "missing_test.h5")
    with h5py.File(tmp_path / "other.h5", "w") as h5:
        h5.create_dataset("pixels", data=np.zeros(3))
    with pytest.raises(ValueError, match=r"other\.h5 has no group 'examples'"):
        HDF5DataSource(tmp_path / "other.h5")
    with pytest.raises(ValueError, match=r"sampling must be one of .* got 'some'"):
        load_emnist_h5(files, sampling="some")
    with pytest.raises(TypeError, match="only_digits must be a bool, got str 'yes'"):
        load_emnist_h5(files, only_digits="yes")


async def test_without_h5py_the_error_names_the_extra(
    files: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    handle = load_emnist_h5(files).train.all_clients()[0]
    monkeypatch.setitem(sys.modules, "h5py", None)
    with pytest.raises(ImportError, match=r"needs h5py.*pip install 'programlogic\[learning\]'"):
        load_emnist_h5(files)
    with pytest.raises(ImportError, match=r"needs h5py.*pip install 'programlogic\[learning\]'"):
        handle.load()
