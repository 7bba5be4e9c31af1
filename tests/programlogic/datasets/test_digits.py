import sys

import numpy as np
import pytest

from programlogic.datasets import Preprocessing, load_digits_writers
from programlogic.datasets.digits import writer_forms

pytestmark = pytest.mark.anyio

FORM_SIZES = [130, 126, 130, 130, 130, 130, 130, 123, 128, 130, 128, 130, 122, 130]


async def test_fourteen_writers_ten_for_training_and_four_held_out() -> None:
    data = load_digits_writers()
    assert data.train.client_ids == [f"writer_{i:02d}" for i in range(10)]
    assert data.test.client_ids == [f"writer_{i:02d}" for i in range(10, 14)]
    sizes = [len(h.load().y) for h in data.train.all_clients() + data.test.all_clients()]
    assert sizes == FORM_SIZES
    assert all(122 <= size <= 130 for size in sizes) and sum(sizes) == 1797
    assert (data.feature_shape, data.num_classes) == ((64,), 10)


async def test_each_writer_starts_with_the_printed_runs_of_digits() -> None:
    data = load_digits_writers()
    for handle in data.train.all_clients() + data.test.all_clients():
        first = handle.load().y[:10].tolist()
        # forms 7 and 12 lost digits of their first run
        assert first in (list(range(10)), [*range(1, 10), 0], [0, 1, 2, 3, 4, 5, 6, 9, 0, 1])


async def test_client_arrays_are_scaled_pixels_and_int_labels() -> None:
    arrays = load_digits_writers().train.all_clients()[0].load()
    assert arrays.x.shape == (130, 64) and arrays.x.dtype == np.float32
    assert arrays.y.shape == (130,) and arrays.y.dtype == np.int32
    assert arrays.x.min() == 0.0 and arrays.x.max() == 1.0
    batches = Preprocessing(epochs=1, batch_size=20, feature_shape=(8, 8, 1))(arrays, 0)
    assert batches.x.shape == (7, 20, 8, 8, 1) and batches.mask.sum() == 130


async def test_the_training_source_samples_as_asked() -> None:
    fixed = load_digits_writers(sampling="fixed").train.iterator(0)
    assert len({tuple(map(str, fixed.select(3, r))) for r in range(1, 6)}) == 1
    with pytest.raises(ValueError, match=r"sampling must be one of .* got 'often'"):
        load_digits_writers(sampling="often")


async def test_writer_forms_splits_at_runs_after_the_random_digits() -> None:
    runs = [0, 1, 2, 3, 4, 5, 6, 7, 8, 9] * 3
    random = [0, 9, 5, 5, 6, 5, 0, 9, 8, 9, 8, 4, 1, 7, 7, 3, 5, 1, 0, 0, 2, 2] * 2
    second = [1, 2, 3, 4, 5, 6, 7, 9, 0, 1, 2, 3, 4]  # lost its first 0 and an 8
    labels = np.array(runs + random + second + random)
    forms = writer_forms(labels)
    assert [form.size for form in forms] == [30 + 44, 13 + 44]
    assert np.concatenate(forms).tolist() == list(range(labels.size))


async def test_without_scikit_learn_the_error_names_the_extra(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(sys.modules, "sklearn", None)
    monkeypatch.setitem(sys.modules, "sklearn.datasets", None)
    with pytest.raises(ImportError, match=r"scikit-learn.*pip install 'programlogic\[learning\]'"):
        load_digits_writers()


async def test_the_digits_are_scikit_learns_read_without_importing_it() -> None:
    from sklearn.datasets import load_digits

    from programlogic.datasets.digits import _digits

    pixels, labels = _digits()
    expected_pixels, expected_labels = load_digits(return_X_y=True)
    assert np.array_equal(pixels, expected_pixels) and pixels.dtype == expected_pixels.dtype
    assert np.array_equal(labels, expected_labels)
