import dataclasses
import pickle

import numpy as np
import pytest

from programlogic import InMemoryDataSource
from programlogic.datasets import ClientArrays, FederatedData

pytestmark = pytest.mark.anyio


async def test_client_arrays_unpack_and_pickle() -> None:
    arrays = ClientArrays(np.ones((2, 3), np.float32), np.array([4, 5], np.int32))
    x, y = pickle.loads(pickle.dumps(arrays))
    assert x.shape == (2, 3) and y.tolist() == [4, 5]


async def test_federated_data_is_frozen() -> None:
    source = InMemoryDataSource({"a": ClientArrays(np.ones((1, 2)), np.zeros(1, np.int32))})
    data = FederatedData(source, source, (2,), 3, "tiny")
    with pytest.raises(dataclasses.FrozenInstanceError):
        data.num_classes = 4  # type: ignore[misc]
