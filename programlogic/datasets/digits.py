"""Scikit-learn's bundled handwritten digits, one client per writer.

``sklearn.datasets.load_digits`` holds 1797 real 8x8 digits (the test part of UCI's
optdigits) with no download. Its rows are in the order of the writers' forms, so the
digits can be grouped by the person who wrote them: a natural, small federated data
set for examples and tests.
"""

from __future__ import annotations

import gzip
import importlib.util
from pathlib import Path

import numpy as np

from programlogic._optional import require
from programlogic.data import InMemoryDataSource, Sampling
from programlogic.datasets.arrays import ClientArrays, FederatedData

__all__ = ["load_digits_writers"]

NUM_WRITERS = 14
NUM_TRAIN_WRITERS = 10
_RUN_LENGTH = 4
_MIN_GAP = 20


def writer_forms(labels: np.ndarray) -> list[np.ndarray]:
    """Split the rows of ``load_digits`` into the forms of its writers; row indices per form.

    Every form starts with the digits printed as runs that count up (0123456789 three
    times), followed by the same 100 digits in a fixed random order, which has no four
    digits counting up. Some digits of a form are missing (the data set dropped them),
    so a form may start at 1 instead of 0, or lose digits inside its runs. The rule: a
    row is a *run row* when its label and the three next ones count up by one modulo 10
    (like 7890); a form starts at row 0 and at every run row that comes more than 20
    rows after the previous run row. On scikit-learn's data, run rows of one form are
    at most 4 rows apart and those of consecutive forms 97 to 103 rows (the random
    digits lie between them), so the threshold of 20 has a wide margin on both sides.

    On scikit-learn's data this gives 14 forms of 130, 126, 130, 130, 130, 130, 130,
    123, 128, 130, 128, 130, 122 and 130 digits.
    """
    labels = np.asarray(labels)
    up = (np.diff(labels) % 10) == 1  # row i counts up to row i + 1
    counts_up = up[: max(labels.size - 3, 0)].copy()
    for offset in range(1, _RUN_LENGTH - 1):
        counts_up &= up[offset : offset + counts_up.size]
    run_rows = np.flatnonzero(counts_up)
    starts = [0]
    previous = -_MIN_GAP - 1
    for row in run_rows.tolist():
        if row - previous > _MIN_GAP and row > 0:
            starts.append(row)
        previous = row
    bounds = [*starts, labels.size]
    return [np.arange(bounds[i], bounds[i + 1]) for i in range(len(starts))]


def load_digits_writers(*, sampling: Sampling | str = Sampling.UNIFORM) -> FederatedData:
    """Scikit-learn's 1797 handwritten digits as 14 clients, one per writer.

    The rows are split into writers' forms by :func:`writer_forms` (122 to 130 digits
    each). Writers 0-9 (``"writer_00"`` to ``"writer_09"``) are the training clients,
    sampled as ``sampling`` says; writers 10-13 are held-out test clients. ``x`` is the
    64 pixels of a digit scaled to [0, 1] (float32, shape ``[n, 64]``), ``y`` the digit
    (int32); ``feature_shape`` is ``(64,)`` and ``num_classes`` 10.

    Needs scikit-learn (``pip install 'programlogic[learning]'``).
    """
    pixels, labels = _digits()
    forms = writer_forms(labels)
    if len(forms) != NUM_WRITERS:  # pragma: no cover - only if scikit-learn's data changes
        raise RuntimeError(
            f"expected the digits of {NUM_WRITERS} writers in scikit-learn's load_digits, "
            f"found {len(forms)} forms of {[len(form) for form in forms]} digits"
        )
    x = (np.asarray(pixels, dtype=np.float32) / 16.0).reshape(-1, 64)
    y = np.asarray(labels, dtype=np.int32)
    clients = {
        f"writer_{writer:02d}": ClientArrays(x[rows], y[rows]) for writer, rows in enumerate(forms)
    }
    ids = list(clients)
    return FederatedData(
        train=InMemoryDataSource(
            {key: clients[key] for key in ids[:NUM_TRAIN_WRITERS]}, sampling=sampling
        ),
        test=InMemoryDataSource({key: clients[key] for key in ids[NUM_TRAIN_WRITERS:]}),
        feature_shape=(64,),
        num_classes=10,
        name="digits_writers",
    )


def _digits() -> tuple[np.ndarray, np.ndarray]:
    """``load_digits(return_X_y=True)``, read from scikit-learn's bundled file where it is.

    Importing ``sklearn.datasets`` imports SciPy and most of scikit-learn (about 65 MB
    and 0.5 s); the data is one gzipped CSV file of the package, which ``find_spec``
    locates without importing it. Where the file is not (another layout), the import.
    """
    spec = importlib.util.find_spec("sklearn")
    if spec is not None and spec.origin is not None:
        path = Path(spec.origin).parent / "datasets" / "data" / "digits.csv.gz"
        if path.is_file():
            with gzip.open(path, "rt", encoding="utf-8") as file:
                data = np.loadtxt(file, delimiter=",")
            return data[:, :-1], data[:, -1].astype(int)
    datasets = require("sklearn.datasets", "scikit-learn", "load_digits_writers")
    return datasets.load_digits(return_X_y=True)
