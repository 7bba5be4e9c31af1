"""Federated data sets as numpy arrays, and the client preprocessing that batches them.

A loader returns a :class:`FederatedData` (training and held-out test sources whose
client handles load :class:`ClientArrays`); :class:`Preprocessing` turns one client's
arrays into shuffled, padded, masked batches, seeded with :func:`client_seed`::

    data = load_digits_writers()
    preprocess = Preprocessing(epochs=5, batch_size=20, shuffle_buffer=100)
    for handle in data.train.iterator(seed=0).select(5, round_num=1):
        batches = preprocess(handle.load(), client_seed(0, 1, handle.client_id))

The data sets:

- :func:`load_digits_writers`: scikit-learn's 1797 bundled 8x8 digits, one client per
  writer (10 training, 4 test); no download.
- :func:`load_fashion_mnist`: Fashion-MNIST from Debian's ``dataset-fashion-mnist``,
  split into label-skewed clients by :func:`dirichlet_partition`.
- :func:`load_emnist_h5`: federated EMNIST from TFF's HDF5 files, read lazily per client.

Nothing here imports TensorFlow; scikit-learn and h5py are imported on first use.
"""

from programlogic.datasets.arrays import ClientArrays, FederatedData
from programlogic.datasets.digits import load_digits_writers
from programlogic.datasets.emnist import HDF5DataSource, load_emnist_h5
from programlogic.datasets.fashion_mnist import load_fashion_mnist
from programlogic.datasets.partition import dirichlet_partition
from programlogic.datasets.preprocessing import (
    BatchOrder,
    ClientBatches,
    Preprocessing,
    client_seed,
)

__all__ = [
    "BatchOrder",
    "ClientArrays",
    "ClientBatches",
    "FederatedData",
    "HDF5DataSource",
    "Preprocessing",
    "client_seed",
    "dirichlet_partition",
    "load_digits_writers",
    "load_emnist_h5",
    "load_fashion_mnist",
]
