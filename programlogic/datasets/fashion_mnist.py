"""Fashion-MNIST split into label-skewed clients, read from Debian's package.

Debian's ``dataset-fashion-mnist`` installs the four gzipped IDX files of Zalando's
release under ``/usr/share/datasets/fashion-mnist``: 60,000 training and 10,000 test
images of 28x28 grey pixels, each with a label among 10 kinds of clothing. They are
read with ``gzip`` and numpy only, once per process.
"""

from __future__ import annotations

import functools
import gzip
import math
import os
from pathlib import Path

import numpy as np

from managers.validation import check_choice, check_int, check_number, check_path
from programlogic.data import InMemoryDataSource, Sampling
from programlogic.datasets.arrays import ClientArrays, FederatedData
from programlogic.datasets.partition import dirichlet_partition

__all__ = ["DEFAULT_FASHION_MNIST_PATH", "load_fashion_mnist"]

DEFAULT_FASHION_MNIST_PATH = Path("/usr/share/datasets/fashion-mnist")
"""Where ``apt-get install dataset-fashion-mnist`` puts the files."""

_FILES = {
    "train_images": "train-images-idx3-ubyte.gz",
    "train_labels": "train-labels-idx1-ubyte.gz",
    "test_images": "t10k-images-idx3-ubyte.gz",
    "test_labels": "t10k-labels-idx1-ubyte.gz",
}
_UNSIGNED_BYTE = 0x08


def load_fashion_mnist(
    num_clients: int = 100,
    *,
    alpha: float = 0.5,
    num_test_clients: int = 10,
    seed: int = 0,
    path: str | os.PathLike[str] | None = None,
    sampling: Sampling | str = Sampling.UNIFORM,
) -> FederatedData:
    """Fashion-MNIST as ``num_clients`` label-skewed training clients and IID test clients.

    The 60,000 training images are split among ``num_clients`` clients
    (``"client_000"``, ...) by :func:`~programlogic.datasets.dirichlet_partition` with
    ``alpha`` and ``seed``: every client holds at least one image. The 10,000 test
    images are shuffled (seeded from ``seed`` too) and cut into ``num_test_clients``
    clients of equal size (``"test_00"``, ...). ``x`` is float32 in [0, 1] with shape
    ``[n, 28, 28]``, ``y`` the int32 class; ``feature_shape`` is ``(28, 28)`` and
    ``num_classes`` 10. Training clients are sampled as ``sampling`` says.

    ``path`` is the directory holding the four ``.gz`` files (default
    :data:`DEFAULT_FASHION_MNIST_PATH`); a missing file raises ``FileNotFoundError``.
    The decoded files are cached in the process (about 0.8 s to decode, 0.2 s to split
    again); a file replaced since, with another size or modification time, is read
    again.
    """
    check_int("num_clients", num_clients, minimum=1)
    check_number("alpha", alpha, above=0, finite=True)
    check_int("num_test_clients", num_test_clients, minimum=1)
    check_int("seed", seed, minimum=0)
    check_choice("sampling", sampling, Sampling)
    directory = check_path("path", DEFAULT_FASHION_MNIST_PATH if path is None else path)
    train_x, train_y, test_x, test_y = _read(directory)
    if num_test_clients > test_y.size:
        raise ValueError(
            f"num_test_clients must be at most the number of test images ({test_y.size}), "
            f"got {num_test_clients}"
        )

    train_parts = dirichlet_partition(train_y, num_clients, alpha, seed)
    test_order = np.random.default_rng([1, seed]).permutation(test_y.size)
    test_parts = [np.sort(part) for part in np.array_split(test_order, num_test_clients)]
    return FederatedData(
        train=InMemoryDataSource(
            _clients("client", train_x, train_y, train_parts), sampling=sampling
        ),
        test=InMemoryDataSource(_clients("test", test_x, test_y, test_parts)),
        feature_shape=(28, 28),
        num_classes=10,
        name="fashion_mnist",
    )


def _clients(
    prefix: str, images: np.ndarray, labels: np.ndarray, parts: list[np.ndarray]
) -> dict[str, ClientArrays]:
    """Clients holding ``images[part]`` scaled to [0, 1], converted in one pass."""
    order = np.concatenate(parts)
    x = np.divide(images[order], np.float32(255), dtype=np.float32)
    y = labels[order].astype(np.int32)
    bounds = np.cumsum([len(part) for part in parts])[:-1]
    width = len(str(len(parts) - 1))
    return {
        f"{prefix}_{index:0{width}d}": ClientArrays(client_x, client_y)
        for index, (client_x, client_y) in enumerate(
            zip(np.split(x, bounds), np.split(y, bounds), strict=True)
        )
    }


def _read(directory: Path) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The four decoded arrays of ``directory`` (uint8, read-only), cached per file version."""
    stamps = []
    for name in _FILES.values():
        file = directory / name
        try:
            stat = file.stat()
        except FileNotFoundError:
            raise FileNotFoundError(
                f"Fashion-MNIST file {file} not found: install it with "
                f"`apt-get install dataset-fashion-mnist` or pass path= its directory"
            ) from None
        stamps.append((stat.st_mtime_ns, stat.st_size))
    return _decode(directory.resolve(), tuple(stamps))


@functools.lru_cache(maxsize=2)
def _decode(
    directory: Path, stamps: tuple[tuple[int, int], ...]
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    del stamps  # part of the cache key only: a replaced file is read again
    arrays = tuple(_read_idx(directory / _FILES[key]) for key in _FILES)
    train_x, train_y, test_x, test_y = arrays
    for images, labels in ((train_x, train_y), (test_x, test_y)):
        if images.ndim != 3 or labels.ndim != 1 or images.shape[0] != labels.shape[0]:
            raise ValueError(
                f"Fashion-MNIST files in {directory} do not match: images of shape "
                f"{images.shape} with labels of shape {labels.shape}"
            )
    for array in arrays:
        array.setflags(write=False)
    return train_x, train_y, test_x, test_y


def _read_idx(file: Path) -> np.ndarray:
    """The array of a gzipped IDX file of unsigned bytes (the MNIST file format).

    The header is two zero bytes, a type byte (0x08 for unsigned bytes), the number of
    dimensions, then each dimension as a big-endian 32-bit int; the values follow.
    """
    with gzip.open(file, "rb") as stream:
        content = stream.read()
    if len(content) < 4 or content[:2] != b"\0\0" or content[2] != _UNSIGNED_BYTE:
        raise ValueError(f"{file} is not an IDX file of unsigned bytes (bad header)")
    ndim = content[3]
    header = 4 + 4 * ndim
    shape = tuple(
        int.from_bytes(content[4 + 4 * axis : 8 + 4 * axis], "big") for axis in range(ndim)
    )
    if len(content) != header + math.prod(shape):
        raise ValueError(
            f"{file} holds {len(content) - header} values after its header, "
            f"expected {math.prod(shape)} for shape {shape}"
        )
    return np.frombuffer(content, dtype=np.uint8, offset=header).reshape(shape)
