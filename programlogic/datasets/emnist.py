"""Federated EMNIST from the HDF5 files of TFF's ``tff.simulation.datasets.emnist``.

TFF's archives (``fed_emnist_digitsonly.tar.bz2`` and ``fed_emnist.tar.bz2``) hold a
training and a test file, ``*_train.h5`` and ``*_test.h5``, in the layout of TFF's
``HDF5ClientData``: a top-level group ``examples`` with one subgroup per writer, named
by the writer's id, holding the datasets ``pixels`` (float32, ``[n, 28, 28]``) and
``label`` (int32, ``[n]``). The test file holds other examples of the same writers.

With thousands of writers the data is read lazily: the source only lists the ids, and
a client's handle opens the file and reads that writer's arrays when loaded (where the
client's work runs), so nothing but the loader's path travels to a worker.
"""

from __future__ import annotations

import os

import numpy as np

from managers.validation import check_bool, check_path
from programlogic._optional import require
from programlogic.data import ClientHandle, HandleDataSource, Sampling
from programlogic.datasets.arrays import ClientArrays, FederatedData

__all__ = ["HDF5DataSource", "load_emnist_h5"]

_EXAMPLES = "examples"


def _h5py():
    return require("h5py", "h5py", "reading federated EMNIST")


class HDF5ClientLoader:
    """Reads one client's :class:`ClientArrays` from a federated HDF5 file when called.

    It holds only the file's path and the client id, so it pickles cheaply to another
    process; each call opens the file, reads ``examples/<client_id>/pixels`` and
    ``label`` and closes it.
    """

    __slots__ = ("client_id", "path")

    def __init__(self, path: str | os.PathLike[str], client_id: str) -> None:
        self.path = os.fspath(path)
        self.client_id = client_id

    def __call__(self) -> ClientArrays:
        """The client's examples: pixels as float32, labels as int32."""
        with _h5py().File(self.path, "r") as file:
            group = file[_EXAMPLES][self.client_id]
            return ClientArrays(
                np.asarray(group["pixels"][()], dtype=np.float32),
                np.asarray(group["label"][()], dtype=np.int32),
            )

    def __repr__(self) -> str:
        return f"HDF5ClientLoader({self.path!r}, {self.client_id!r})"


class HDF5DataSource(HandleDataSource):
    """A federated data source over one HDF5 file in TFF's layout, read lazily.

    Opening it reads only the client ids (the subgroups of ``examples``, sorted). Its
    handles load a client's arrays from the file with :class:`HDF5ClientLoader`.
    ``sampling`` chooses how rounds pick clients (see :class:`~programlogic.Sampling`).
    """

    def __init__(
        self, path: str | os.PathLike[str], *, sampling: Sampling | str = Sampling.UNIFORM
    ) -> None:
        self.path = check_path("path", path)
        if not self.path.is_file():
            raise FileNotFoundError(f"federated HDF5 file {self.path} not found")
        h5py = _h5py()
        with h5py.File(self.path, "r") as file:
            examples = file.get(_EXAMPLES)
            if not isinstance(examples, h5py.Group):
                raise ValueError(
                    f"{self.path} has no group {_EXAMPLES!r}, so it is not a federated "
                    f"HDF5 file in TFF's layout"
                )
            client_ids = sorted(examples.keys())
        if not client_ids:
            raise ValueError(f"{self.path} holds no clients under {_EXAMPLES!r}")
        super().__init__(
            [
                ClientHandle(client_id, HDF5ClientLoader(self.path, client_id))
                for client_id in client_ids
            ],
            sampling=sampling,
        )


def load_emnist_h5(
    train_path: str | os.PathLike[str],
    test_path: str | os.PathLike[str] | None = None,
    *,
    only_digits: bool = True,
    sampling: Sampling | str = Sampling.UNIFORM,
) -> FederatedData:
    """Federated EMNIST from TFF's HDF5 files, one client per writer, read lazily.

    ``train_path`` is the training file (``fed_emnist_digitsonly_train.h5`` or
    ``fed_emnist_train.h5``); ``test_path`` the test file, by default the training
    file's name with ``_train`` replaced by ``_test`` in the same directory.
    ``only_digits`` says which archive the files come from: 10 classes (digits) or 62
    (digits and letters); it is not checked against the labels, which would read every
    client. ``x`` is float32 ``[n, 28, 28]`` as stored, ``y`` int32; ``feature_shape``
    is ``(28, 28)``. Training clients are sampled as ``sampling`` says.

    Needs h5py (``pip install 'programlogic[learning]'``).
    """
    check_bool("only_digits", only_digits)
    train_path = check_path("train_path", train_path)
    test_path = check_path("test_path", test_path, allow_none=True)
    if test_path is None:
        if "_train" not in train_path.name:
            raise ValueError(
                f"test_path is needed when train_path has no '_train' in its name to "
                f"replace with '_test', got train_path {str(train_path)!r}"
            )
        head, _, tail = train_path.name.rpartition("_train")
        test_path = train_path.with_name(f"{head}_test{tail}")
    return FederatedData(
        train=HDF5DataSource(train_path, sampling=sampling),
        test=HDF5DataSource(test_path),
        feature_shape=(28, 28),
        num_classes=10 if only_digits else 62,
        name="emnist_digits" if only_digits else "emnist",
    )
