"""Aggregators robust to outlying client updates: norm clipping, the coordinate-wise
median and the trimmed mean (TensorFlow Federated's ``clipping_factory``, Flower's
FedMedian and FedTrimmedAvg).

Each is a :class:`~programlogic.learning.aggregators.ModelAggregator`, given to a
training process's builder as ``model_aggregator=``.
"""

from __future__ import annotations

import abc
import dataclasses
from collections.abc import Sequence
from typing import Any

import numpy as np

from managers.validation import check_int, check_number, check_type
from programlogic.learning._tensorflow import tf
from programlogic.learning.aggregators import (
    Aggregate,
    ClientTransform,
    Mean,
    ModelAggregator,
    Partial,
    by_client,
    client_norms,
)

__all__ = [
    "Clipping",
    "Median",
    "TrimmedMean",
    "clipping",
    "median",
    "trimmed_mean",
]


class _KeepsEveryUpdate(ModelAggregator):
    """An aggregator whose statistic needs every client's update: it does not stream.

    A round keeps each counted client's delta (float32) until it is finalized, so its
    memory is clients x model size: :attr:`max_clients` bounds it, and a round with more
    clients is refused before it starts. Client weights only decide which clients count
    (weight > 0): the statistic itself is unweighted, as in Flower.
    """

    max_clients: int

    def check_round(self, client_ids: Sequence[str]) -> None:
        """Refuse a round of more than ``max_clients`` clients (ValueError)."""
        if len(client_ids) > self.max_clients:
            raise ValueError(
                f"{type(self).__name__.lower()} keeps every client's update in memory: a round "
                f"of {len(client_ids)} clients is more than its max_clients={self.max_clients}"
            )

    def fold_group(self, params: dict[str, Any], deltas: list[Any], weights: Any) -> Partial:
        """The group's deltas and weights as they are."""
        return {"deltas": list(deltas), "weights": weights}

    def merge(self, total: Partial | None, partial: Partial) -> Partial:
        """The counted clients' deltas appended, group by group."""
        counted = np.asarray(partial["weights"]) > 0
        rows = [np.asarray(delta)[counted] for delta in partial["deltas"]]
        if total is None:
            return {"deltas": [[each] for each in rows]}
        for kept, more in zip(total["deltas"], rows, strict=True):
            kept.append(more)
        return total

    def finalize(self, state: dict[str, Any], total: Partial | None, round_num: int) -> Aggregate:
        """The statistic over the counted clients, coordinate by coordinate."""
        if total is None:
            return Aggregate(None, state)
        stacked = [np.concatenate(parts) for parts in total["deltas"]]
        if not len(stacked[0]):
            return Aggregate(None, state)
        return Aggregate([self._statistic(each.astype(np.float64)) for each in stacked], state)

    @abc.abstractmethod
    def _statistic(self, updates: np.ndarray) -> np.ndarray:
        """The statistic over axis 0 (clients) of ``updates``."""


@dataclasses.dataclass(frozen=True)
class Median(_KeepsEveryUpdate):
    """The coordinate-wise median of the counted clients' deltas (Flower's FedMedian).

    Robust to a minority of clients sending arbitrary updates. Keeps every update of a
    round in memory, at most ``max_clients`` of them.
    """

    max_clients: int = 10_000

    def _statistic(self, updates: np.ndarray) -> np.ndarray:
        return np.median(updates, axis=0)

    def describe(self) -> dict[str, Any]:
        """``{"aggregator": "median"}``."""
        return {"aggregator": "median"}


@dataclasses.dataclass(frozen=True)
class TrimmedMean(_KeepsEveryUpdate):
    """The coordinate-wise trimmed mean of the counted clients' deltas (Flower's
    FedTrimmedAvg): at each coordinate the ``int(beta * n)`` largest and as many
    smallest of the ``n`` values are left out and the rest averaged.

    Keeps every update of a round in memory, at most ``max_clients`` of them.
    """

    beta: float = 0.2
    max_clients: int = 10_000

    def _statistic(self, updates: np.ndarray) -> np.ndarray:
        cut = int(self.beta * len(updates))
        ordered = np.sort(updates, axis=0)
        return ordered[cut : len(updates) - cut].mean(axis=0)

    def describe(self) -> dict[str, Any]:
        """``{"aggregator": "trimmed_mean", "beta": ...}``."""
        return {"aggregator": "trimmed_mean", "beta": self.beta}


@dataclasses.dataclass(frozen=True)
class Clipping(ClientTransform):
    """Each client's delta scaled down to a global L2 norm of at most ``clip_norm`` (the
    norm over all its trainable weights together, as ``tf.clip_by_global_norm`` and
    TensorFlow Federated's ``clipping_factory`` compute it), then ``inner``.

    Measurements: ``clip_norm`` and ``clipped_count``, the number of counted clients
    whose delta was scaled down.
    """

    clip_norm: float
    inner: ModelAggregator = dataclasses.field(default_factory=lambda: Mean())

    def params(self, state: dict[str, Any]) -> dict[str, Any]:
        """The clip norm (float32) and the inner aggregator's params."""
        return {**super().params(state), "clip_norm": np.float32(self.clip_norm)}

    def transform(
        self, params: dict[str, Any], deltas: list[Any], weights: Any
    ) -> tuple[list[Any], Any, dict[str, Any]]:
        """The deltas clipped; counts the counted clients that were."""
        clip_norm = params["clip_norm"]
        norms = client_norms(deltas)
        scales = clip_norm / tf.maximum(norms, clip_norm)
        clipped = [delta * by_client(scales, delta) for delta in deltas]
        was_clipped = tf.logical_and(norms > clip_norm, weights > 0)
        return clipped, weights, {"clipped_count": tf.cast(was_clipped, tf.float64)}

    def measure(self, counts: dict[str, float]) -> dict[str, Any]:
        """``{"clip_norm": ..., "clipped_count": ...}``."""
        return {
            "clip_norm": float(self.clip_norm),
            "clipped_count": int(counts.get("clipped_count", 0)),
        }

    def describe(self) -> dict[str, Any]:
        """The clip norm and the inner aggregator's description."""
        return {
            "aggregator": "clipping",
            "clip_norm": self.clip_norm,
            "inner": self.inner.describe(),
        }


def clipping(clip_norm: float, inner: ModelAggregator | None = None) -> Clipping:
    """Clip each client's delta to the global L2 norm ``clip_norm`` (a positive number),
    then aggregate with ``inner`` (default :func:`mean`): TFF's ``clipping_factory``
    with a constant norm."""
    check_number("clip_norm", clip_norm, above=0, finite=True)
    check_type("inner", inner, ModelAggregator, allow_none=True)
    return Clipping(float(clip_norm), Mean() if inner is None else inner)


def median(*, max_clients: int = 10_000) -> Median:
    """The coordinate-wise median of the clients' deltas (Flower's FedMedian); a round
    keeps every update, of at most ``max_clients`` clients."""
    return Median(max_clients=check_int("max_clients", max_clients, minimum=1))


def trimmed_mean(beta: float = 0.2, *, max_clients: int = 10_000) -> TrimmedMean:
    """The coordinate-wise mean after leaving out the ``beta`` fraction (0 <= beta < 0.5)
    of largest and of smallest values (Flower's FedTrimmedAvg); a round keeps every
    update, of at most ``max_clients`` clients."""
    check_number("beta", beta, minimum=0, below=0.5)
    return TrimmedMean(float(beta), check_int("max_clients", max_clients, minimum=1))
