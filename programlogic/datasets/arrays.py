"""What a data set loader returns: the arrays of one client, and a whole federated data set.

A loader (``load_digits_writers``, ``load_fashion_mnist``, ``load_emnist_h5``) returns a
:class:`FederatedData`: a source of training clients, a source of held-out test clients
and the shape of what they hold. Loading a client's handle gives its
:class:`ClientArrays`; :class:`~programlogic.datasets.Preprocessing` turns those into
batches.
"""

from __future__ import annotations

import dataclasses
from typing import NamedTuple

import numpy as np

from programlogic.data import FederatedDataSource

__all__ = ["ClientArrays", "FederatedData"]


class ClientArrays(NamedTuple):
    """The examples of one client, as its loader returns them.

    ``x`` is float32 with shape ``[n, *features]``; ``y`` holds the int32 class label of
    each example, shape ``[n]``.
    """

    x: np.ndarray
    y: np.ndarray


@dataclasses.dataclass(frozen=True)
class FederatedData:
    """A federated data set: training clients, held-out test clients and their shapes.

    ``train`` and ``test`` are data sources whose handles load :class:`ClientArrays`;
    ``train`` samples clients as the loader's ``sampling`` argument says, ``test``
    uniformly (evaluate on all of it with ``test.all_clients()`` where the source has
    it). ``feature_shape`` is the shape of one example's ``x`` and ``num_classes`` the
    number of labels; ``name`` says which data set and split this is.
    """

    train: FederatedDataSource
    test: FederatedDataSource
    feature_shape: tuple[int, ...]
    num_classes: int
    name: str
