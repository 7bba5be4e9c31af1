"""Partitioning a centralized data set into clients, seeded.

:func:`dirichlet_partition` gives each client a label distribution drawn from a
Dirichlet distribution (label skew), the usual way to make non-IID clients out of a
centralized data set such as Fashion-MNIST.
"""

from __future__ import annotations

import numpy as np

from managers.validation import check_int, check_number

__all__ = ["dirichlet_partition"]


def dirichlet_partition(
    labels: np.ndarray, num_clients: int, alpha: float, seed: int
) -> list[np.ndarray]:
    """Split the examples of ``labels`` among ``num_clients`` clients with label skew.

    For each class (in increasing label order) its examples are shuffled and cut into
    ``num_clients`` consecutive pieces whose sizes follow proportions drawn from a
    symmetric Dirichlet(``alpha``): a small ``alpha`` (0.1) gives each client few
    classes, a large one (100) nearly the same mix everywhere. Every example goes to
    exactly one client.

    Every client gets at least one example: when the draw leaves clients empty, each of
    them in turn (in client order) takes one example from the client holding the most
    examples at that moment (its largest index; the lowest client on a tie). This
    always ends, since there are at least as many examples as clients, and it moves at
    most ``num_clients`` examples.

    Returns one int64 array of indices into ``labels`` per client, sorted ascending. A
    pure function of its arguments: the randomness is ``np.random.default_rng(seed)``.
    """
    labels = np.asarray(labels)
    if labels.ndim != 1:
        raise ValueError(f"labels must be one-dimensional, got shape {labels.shape}")
    check_int("num_clients", num_clients, minimum=1)
    if num_clients > labels.size:
        raise ValueError(
            f"num_clients must be at most the number of examples ({labels.size}), got {num_clients}"
        )
    check_number("alpha", alpha, above=0, finite=True)
    check_int("seed", seed, minimum=0)

    rng = np.random.default_rng(seed)
    owner = np.empty(labels.size, dtype=np.intp)
    concentration = np.full(num_clients, float(alpha))
    for label in np.unique(labels):
        members = rng.permutation(np.flatnonzero(labels == label))
        proportions = rng.dirichlet(concentration)
        cuts = np.floor(np.cumsum(proportions)[:-1] * members.size).astype(np.intp)
        cuts = np.clip(cuts, 0, members.size)
        sizes = np.diff(np.concatenate([[0], cuts, [members.size]]))
        owner[members] = np.repeat(np.arange(num_clients), sizes)

    sizes = np.bincount(owner, minlength=num_clients)
    for empty in np.flatnonzero(sizes == 0).tolist():
        donor = int(np.argmax(sizes))
        owner[np.flatnonzero(owner == donor)[-1]] = empty
        sizes[donor] -= 1
        sizes[empty] += 1

    by_client = np.argsort(owner, kind="stable").astype(np.int64)
    return np.split(by_client, np.cumsum(sizes)[:-1])
