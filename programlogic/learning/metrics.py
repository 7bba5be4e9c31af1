"""Keras metrics and losses for the federated processes: metrics whose state sums.

A federated round reports a metric as TensorFlow Federated's default aggregation does:
each client's metric variables (Keras' "state") are summed across the round's clients
and the metric is finalized once, on the sums. For metrics whose variables are sums,
counts or confusion counts that equals the metric over the union of the clients' data.
:class:`SummableMetric` wraps such a Keras metric; other metrics are refused.
"""

from __future__ import annotations

import json
import math
import re
import threading
from collections.abc import Sequence
from typing import Any

import numpy as np

from managers.validation import check_interface, describe
from programlogic.learning._tensorflow import keras, tf

__all__ = [
    "SUMMABLE_METRIC_CLASSES",
    "SummableMetric",
    "as_loss",
    "as_metrics",
    "client_sums",
]

SUMMABLE_METRIC_CLASSES: tuple[type, ...] = (
    keras.metrics.Mean,
    keras.metrics.Sum,
    keras.metrics.AUC,
    keras.metrics.Precision,
    keras.metrics.Recall,
    keras.metrics.TruePositives,
    keras.metrics.FalsePositives,
    keras.metrics.TrueNegatives,
    keras.metrics.FalseNegatives,
)
"""Keras metric classes (and their subclasses) whose variables are all sums or counts.

``Mean`` covers the mean-style metrics (``MeanMetricWrapper``: the accuracies,
``SparseTopKCategoricalAccuracy``, ``MeanSquaredError``, ``MeanAbsoluteError``, ...), whose
variables are a weighted total and a count; ``AUC``, ``Precision``, ``Recall`` and the
confusion counts hold per-threshold counts.
"""


def _json(value: Any) -> Any:
    if value is None or isinstance(value, bool | int | str):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else str(value)
    if isinstance(value, list | tuple):
        return [_json(each) for each in value]
    if isinstance(value, dict):
        return {str(key): _json(each) for key, each in sorted(value.items())}
    if isinstance(value, np.generic | np.ndarray):
        return _json(value.tolist())
    return getattr(value, "__name__", None) or type(value).__name__


def _stable_name(metric: Any) -> str:
    """The metric's name, without the counter Keras appends to a default name (``auc_1``)."""
    kind = re.sub(r"(.)([A-Z][a-z]+)", r"\1_\2", type(metric).__name__)
    default = re.sub(r"([a-z0-9])([A-Z])", r"\1_\2", kind).lower()
    if re.fullmatch(rf"{re.escape(default)}_\d+", metric.name):
        return default
    return str(metric.name)


class SummableMetric:
    """A Keras metric whose variables sum across clients, as a federated process uses it.

    ``metric`` is a Keras metric object or a name Keras knows
    (``"sparse_categorical_accuracy"``, ``"auc"``, ``"mae"``). It is released under its
    name, without the counter Keras appends to default names (``auc``, not ``auc_1``).
    Its class must be one of :data:`SUMMABLE_METRIC_CLASSES` (ValueError otherwise,
    naming the metric and why).
    Metrics compare equal when of the same class and configuration.
    """

    def __init__(self, metric: Any) -> None:
        self.given_name = metric if isinstance(metric, str) else None
        if isinstance(metric, str):
            try:
                found = keras.metrics.get(metric)
            except (ValueError, TypeError) as error:
                raise ValueError(f"metrics: Keras knows no metric named {metric!r}") from error
            if not isinstance(found, keras.metrics.Metric):
                raise ValueError(f"metrics: {metric!r} does not name a Keras metric object")
            metric = found
        check_interface("metrics", metric, "keras.metrics.Metric", ["stateless_update_state"])
        if not isinstance(metric, SUMMABLE_METRIC_CLASSES):
            raise ValueError(
                f"metrics: {_stable_name(metric)!r} ({type(metric).__name__}) is not summable: its "
                "variables are not known to be sums or counts, so summing them across "
                "clients would not give the metric of the clients' data (supported: "
                f"{', '.join(kind.__name__ for kind in SUMMABLE_METRIC_CLASSES)} and subclasses)"
            )
        variables = list(metric.variables)
        if not variables or any(not v.dtype.startswith("float") for v in variables):
            raise ValueError(
                f"metrics: {_stable_name(metric)!r} ({type(metric).__name__}) is not summable: it "
                "must hold float variables"
            )
        self.metric = metric
        self.name: str = _stable_name(metric)
        self.shapes = [(tuple(int(n) for n in v.shape), str(v.dtype)) for v in variables]
        self._key = (type(metric), json.dumps(self._config(), sort_keys=True))
        self._lock = threading.Lock()

    def __eq__(self, other: object) -> bool:
        return isinstance(other, SummableMetric) and other._key == self._key

    def __hash__(self) -> int:
        return hash(self._key)

    def __getstate__(self) -> dict[str, Any]:
        if self.given_name is not None:
            return {"metric": self.given_name}
        return {"metric": self.metric}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["metric"])

    def describe(self) -> Any:
        """The name given, or the metric's class and configuration (JSON values)."""
        if self.given_name is not None:
            return self.given_name
        return {"class": type(self.metric).__name__, "config": self._config()}

    def _config(self) -> Any:
        return _json({**self.metric.get_config(), "name": self.name})

    def state_names(self) -> list[str]:
        """The names of the metric's summed values: ``<name>/<variable index>``."""
        return [f"{self.name}/{index}" for index in range(len(self.shapes))]

    def zeros(self) -> dict[str, Any]:
        """Zero state tensors, by :meth:`state_names`, traced into the caller's graph."""
        return {
            name: tf.zeros(shape, dtype)
            for name, (shape, dtype) in zip(self.state_names(), self.shapes, strict=True)
        }

    def batch_state(self, y: Any, outputs: Any, mask: Any) -> dict[str, Any]:
        """The metric's variables over one batch, examples weighted by ``mask``."""
        zeros = [tf.zeros(shape, dtype) for shape, dtype in self.shapes]
        values = self.metric.stateless_update_state(zeros, y, outputs, sample_weight=mask)
        return dict(zip(self.state_names(), values, strict=True))

    def result(self, sums: dict[str, Any]) -> float:
        """The metric of summed variables; a mean of no example is NaN."""
        values = [np.asarray(sums.get(name, 0.0), dtype=np.float64) for name in self.state_names()]
        values = [
            np.broadcast_to(v, shape) for v, (shape, _) in zip(values, self.shapes, strict=True)
        ]
        if isinstance(self.metric, keras.metrics.Mean) and len(values) == 2:
            total, count = (float(v) for v in values)
            return math.nan if count == 0 else float(np.float32(total / count))
        cast = [v.astype(dtype) for v, (_, dtype) in zip(values, self.shapes, strict=True)]
        with self._lock:
            return float(np.asarray(self.metric.stateless_result(cast)))


def as_metrics(metrics: Any) -> tuple[SummableMetric, ...]:
    """``metrics`` (Keras metric objects or names) as :class:`SummableMetric` s, names unique."""
    if isinstance(metrics, str) or not isinstance(metrics, Sequence):
        raise TypeError(
            f"metrics must be a sequence of Keras metrics or their names, got {describe(metrics)}"
        )
    try:
        converted = tuple(
            each if isinstance(each, SummableMetric) else SummableMetric(each) for each in metrics
        )
    except ValueError as error:
        raise ValueError(f"{error}; got metrics {describe(metrics)}") from None
    names = [each.name for each in converted]
    for name in names:
        if names.count(name) > 1:
            raise ValueError(
                f"metrics: two metrics are named {name!r} (give them distinct names); "
                f"got metrics {describe(metrics)}"
            )
    return converted


def client_sums(sums: dict[str, Any], index: int) -> dict[str, Any]:
    """Client ``index``'s sums from a group's ``[group, ...]`` arrays: scalars as floats,
    metric variables with a shape as float64 arrays."""
    picked: dict[str, Any] = {}
    for name, value in sums.items():
        value = np.asarray(value)[index]
        picked[name] = float(value) if value.ndim == 0 else value.astype(np.float64)
    return picked


_LOSSES: dict[str, Any] = {}
_losses_lock = threading.Lock()


def as_loss(loss: Any) -> Any:
    """``loss`` as a Keras loss object: an object is kept, a name (``"mse"``,
    ``"BinaryCrossentropy"``) made into the class's object with default arguments.

    A name gives the same object every time, so processes built with it share their
    compiled functions.
    """
    if not isinstance(loss, str):
        return check_interface("loss", loss, "keras.losses.Loss", ["call"])
    with _losses_lock:
        if loss not in _LOSSES:
            _LOSSES[loss] = _loss_by_name(loss)
        return _LOSSES[loss]


def _loss_by_name(name: str) -> Any:
    kind = getattr(keras.losses, name, None)
    if isinstance(kind, type) and issubclass(kind, keras.losses.Loss):
        return kind()
    try:
        found = keras.losses.get(name)
    except (ValueError, TypeError) as error:
        raise ValueError(f"loss: Keras knows no loss named {name!r}") from error
    if isinstance(found, keras.losses.Loss):
        return found
    function = getattr(found, "__name__", None)
    for kind in vars(keras.losses).values():
        if isinstance(kind, type) and issubclass(kind, keras.losses.Loss):
            try:
                candidate = kind()
            except TypeError:
                continue
            if getattr(candidate, "fn", None) is found or candidate.name == function:
                return candidate
    raise ValueError(f"loss: {name!r} does not name a Keras loss class")
