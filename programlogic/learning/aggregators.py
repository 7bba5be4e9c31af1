"""How a round's client updates become the one update the server applies.

A :class:`ModelAggregator` is given to a training process's builder as
``model_aggregator=`` (as TensorFlow Federated's aggregation factories are). Its work
is split where the data is, so that a round streams:

1. a per-client transform and a fold of a group's clients into one partial, traced
   into the compiled, vectorized group call on the worker (:meth:`ModelAggregator.fold_group`);
2. a merge of the groups' partials, in group order, with NumPy on a worker thread
   (:meth:`ModelAggregator.merge`);
3. a server-side finalize that turns the merged partial into the update, a new
   aggregator state and measurements (:meth:`ModelAggregator.finalize`).

Here: the contract, :func:`mean` (the default), :func:`unweighted_mean` and
:class:`ClientTransform`, the base of aggregators that change each client's update
before an inner one; :mod:`programlogic.learning.robust` has :func:`clipping`,
:func:`median` and :func:`trimmed_mean`.
"""

from __future__ import annotations

import abc
import dataclasses
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from managers.validation import check_choice, check_type
from programlogic.learning._tensorflow import tf

if TYPE_CHECKING:
    from programlogic.privacy import PrivacyAccounting

__all__ = [
    "CLIENT_WEIGHTINGS",
    "Aggregate",
    "ClientTransform",
    "Mean",
    "ModelAggregator",
    "Partial",
    "add_partials",
    "by_client",
    "check_aggregation",
    "client_norms",
    "fold_clients",
    "mean",
    "unweighted_mean",
]

CLIENT_WEIGHTINGS = ("num_examples", "uniform")
"""How client deltas are weighted: TFF's ``ClientWeighting.NUM_EXAMPLES`` and
``ClientWeighting.UNIFORM``."""

Partial = dict[str, Any]
"""A fold's result: a dict of tensors in the graph, of NumPy arrays once it left it."""


@dataclasses.dataclass
class Aggregate:
    """What :meth:`ModelAggregator.finalize` returns for a round.

    ``update``: the update the server optimizer applies, one array per trainable
    weight (any float dtype; cast to the weight's), or None when no client counted
    (the model then stays as it was). ``state``: the aggregator's state for the next
    round. ``measurements``: numbers released under the round's ``aggregator`` metrics;
    ``metrics``: groups of numbers released beside the process's own (``{"privacy":
    {...}}`` becomes the round's ``privacy/...`` metrics).
    """

    update: list[np.ndarray] | None
    state: dict[str, Any] = dataclasses.field(default_factory=dict)
    measurements: dict[str, Any] = dataclasses.field(default_factory=dict)
    metrics: dict[str, dict[str, Any]] = dataclasses.field(default_factory=dict)


class ModelAggregator(abc.ABC):
    """The contract of an aggregation of client model updates.

    A process calls, every round:

    - :meth:`params` on the aggregator's state, first: the values the compiled group
      call takes as inputs (a dict of NumPy scalars or arrays: values that change from
      round to round go here rather than into the traced graph, which would recompile);
      it may refuse a state it cannot go on from (ValueError);
    - :meth:`check_round` with the round's client ids, before any work (and
      :meth:`empty_round` instead of the steps below when there are none);
    - :meth:`fold_group` inside each group's compiled call, traced once per
      configuration: ``deltas`` is one tensor per trainable weight, stacked by client
      (``[clients, *shape]``, float32); ``weights`` float64 ``[clients]`` is each
      client's weight from the process's ``client_weighting``, 0 for a padding client,
      a client without examples and a client whose delta is not finite (whose delta is
      zeroed). It returns a partial: a dict of tensors;
    - :meth:`merge` with the partial merged so far (None at first) and the next
      group's, in group order, off the event loop: NumPy arrays in, NumPy arrays out
      (it may update ``total`` in place);
    - :meth:`finalize` on the server with the state, the merged partial (None if the
      round had no group) and the round number, returning an :class:`Aggregate`.

    The state (:meth:`initialize`) is part of the program state when it is not empty,
    so that an aggregator that adapts (a clipping norm, the secret of a noise
    generator) resumes exactly; it is never released. Aggregators are immutable and
    hashable (their fields decide the compiled graph, which processes configured
    alike share) and pickle, so that they travel to workers.
    """

    def initialize(self) -> dict[str, Any]:
        """The state before the first round (default: none)."""
        return {}

    def params(self, state: dict[str, Any]) -> dict[str, Any]:
        """The compiled group call's inputs for a round with ``state`` (default: none)."""
        return {}

    def check_round(self, client_ids: Sequence[str]) -> None:
        """Raise (ValueError) before a round of these clients this aggregator cannot take."""

    def empty_round(self, trainable: list[np.ndarray]) -> Partial | None:
        """The merged partial of a round without clients, or None (the default) to refuse
        such a round: a differentially private aggregator must still add its noise and
        count the round (Poisson sampling can select nobody). ``trainable`` are the
        model's trainable weights, for their shapes."""
        return None

    def privacy_accounting(self) -> PrivacyAccounting | None:
        """How this aggregator's privacy is accounted, relative to its own state, or None
        (the default) for an aggregator that adds no noise. A process returns it, nested
        under where it keeps this state, as its ``privacy_accounting()``, by which
        ``train_model`` knows a run is differentially private (see
        :class:`~programlogic.privacy.PrivacyAccounting`)."""
        return None

    @abc.abstractmethod
    def fold_group(self, params: dict[str, Any], deltas: list[Any], weights: Any) -> Partial:
        """A group's clients folded into one partial, in TensorFlow (traced)."""

    @abc.abstractmethod
    def merge(self, total: Partial | None, partial: Partial) -> Partial:
        """``total`` and the next group's ``partial`` as one partial, in NumPy."""

    @abc.abstractmethod
    def finalize(self, state: dict[str, Any], total: Partial | None, round_num: int) -> Aggregate:
        """The round's update, next state and measurements from the merged partial."""

    @abc.abstractmethod
    def describe(self) -> dict[str, Any]:
        """The configuration a resumed run must share, as a JSON-able dict."""


@dataclasses.dataclass(frozen=True)
class Mean(ModelAggregator):
    """The mean of the client deltas weighted by the process's client weights, summed in
    float64 (``weighted=False``: every counted client weighs 1).

    Streams: a partial is one model-sized sum and a weight, whatever the number of
    clients. The update is None when the weights sum to 0.
    """

    weighted: bool = True

    def fold_group(self, params: dict[str, Any], deltas: list[Any], weights: Any) -> Partial:
        """The group's weighted sum of deltas (float64) and its summed weight."""
        if not self.weighted:
            weights = tf.where(weights > 0, tf.ones_like(weights), tf.zeros_like(weights))
        sums = [
            tf.reduce_sum(tf.cast(delta, tf.float64) * by_client(weights, delta), axis=0)
            for delta in deltas
        ]
        return {"sum": sums, "weight": tf.reduce_sum(weights)}

    def merge(self, total: Partial | None, partial: Partial) -> Partial:
        """The sums added, in place once the first partial was copied."""
        return add_partials(total, partial)

    def finalize(self, state: dict[str, Any], total: Partial | None, round_num: int) -> Aggregate:
        """The weighted mean, or None when no client weighed anything."""
        if total is None or total["weight"] <= 0:
            return Aggregate(None, state)
        return Aggregate([each / total["weight"] for each in total["sum"]], state)

    def describe(self) -> dict[str, Any]:
        """``{"aggregator": "mean", "weighted": ...}``."""
        return {"aggregator": "mean", "weighted": self.weighted}


class ClientTransform(ModelAggregator):
    """An aggregator that transforms each client's delta and weight, then hands the
    clients to an ``inner`` aggregator.

    Subclasses implement :meth:`transform` (traced, vectorized over the group's
    clients) and may count per-client statistics, which are summed over the round and
    released as measurements with :meth:`measure`. The inner aggregator's state is this
    one's ``"inner"`` state, its measurements are released beside this one's and its
    metrics (a DP aggregator's ``privacy/...``) as they are.
    """

    inner: ModelAggregator

    @abc.abstractmethod
    def transform(
        self, params: dict[str, Any], deltas: list[Any], weights: Any
    ) -> tuple[list[Any], Any, dict[str, Any]]:
        """``(deltas, weights, counts)``: the transformed clients and scalar counts to sum."""

    def measure(self, counts: dict[str, float]) -> dict[str, Any]:
        """The measurements of a round from its summed counts (default: the counts)."""
        return dict(counts)

    def initialize(self) -> dict[str, Any]:
        """The inner aggregator's state under ``"inner"``, or none."""
        inner = self.inner.initialize()
        return {"inner": inner} if inner else {}

    def params(self, state: dict[str, Any]) -> dict[str, Any]:
        """The inner aggregator's params under ``"inner"``."""
        return {"inner": self.inner.params(state.get("inner", {}))}

    def check_round(self, client_ids: Sequence[str]) -> None:
        """The inner aggregator's check."""
        self.inner.check_round(client_ids)

    def privacy_accounting(self) -> PrivacyAccounting | None:
        """The inner aggregator's, whose state is this one's ``"inner"``."""
        accounting = self.inner.privacy_accounting()
        return None if accounting is None else accounting.within("inner")

    def fold_group(self, params: dict[str, Any], deltas: list[Any], weights: Any) -> Partial:
        """The transformed clients folded by the inner aggregator, and the summed counts."""
        deltas, weights, counts = self.transform(params, deltas, weights)
        return {
            "inner": self.inner.fold_group(params["inner"], deltas, weights),
            "counts": {name: tf.reduce_sum(value) for name, value in counts.items()},
        }

    def merge(self, total: Partial | None, partial: Partial) -> Partial:
        """The inner partials merged and the counts added."""
        if total is None:
            total = {"inner": None, "counts": None}
        return {
            "inner": self.inner.merge(total["inner"], partial["inner"]),
            "counts": add_partials(total["counts"], partial["counts"]),
        }

    def finalize(self, state: dict[str, Any], total: Partial | None, round_num: int) -> Aggregate:
        """The inner aggregate, with this transform's measurements added."""
        inner_state = state.get("inner", {})
        result = self.inner.finalize(
            inner_state, None if total is None else total["inner"], round_num
        )
        counts = {} if total is None else total["counts"]
        measurements = {**self.measure(counts), **result.measurements}
        new_state = {"inner": result.state} if result.state else {}
        return Aggregate(result.update, new_state, measurements, result.metrics)


def mean() -> Mean:
    """The mean of the client deltas weighted by the process's ``client_weighting`` (the
    default of every training process)."""
    return Mean()


def unweighted_mean() -> Mean:
    """The mean of the counted clients' deltas with equal weights."""
    return Mean(weighted=False)


def fold_clients(
    aggregator: ModelAggregator,
    params: dict[str, Any],
    deltas: Sequence[Any],
    finite: Any,
    num_examples: Any,
    client_weighting: str,
) -> Partial:
    """A group's partial (traced): each client weighted by ``client_weighting``
    (``"num_examples"``, or ``"uniform"``: 1 if it has examples), weight 0 and delta
    zeroed where its delta is not finite, folded by ``aggregator``."""
    examples = tf.cast(num_examples, tf.float64)
    if client_weighting == "uniform":
        examples = tf.where(examples > 0, tf.ones_like(examples), tf.zeros_like(examples))
    weights = tf.where(finite, examples, tf.zeros_like(examples))
    kept = [tf.where(by_client(finite, delta), delta, tf.zeros_like(delta)) for delta in deltas]
    return aggregator.fold_group(params, kept, weights)


def by_client(values: Any, delta: Any) -> Any:
    """``values`` (one a client, ``[clients]``) shaped to broadcast against ``delta``
    (stacked by client, ``[clients, *shape]``), traced."""
    return tf.reshape(values, [-1] + [1] * (len(delta.shape) - 1))


def client_norms(deltas: Sequence[Any]) -> Any:
    """Each client's global L2 norm over all its ``deltas`` (stacked by client), traced."""
    squares = [
        tf.reduce_sum(tf.reshape(tf.square(delta), [tf.shape(delta)[0], -1]), axis=1)
        for delta in deltas
    ]
    return tf.sqrt(tf.add_n(squares))


def add_partials(total: Partial | None, partial: Partial) -> Partial:
    """``partial`` added to ``total`` key by key: lists of arrays elementwise in float64
    (in place once ``total`` exists, a copy at first), numbers as floats."""
    if total is None:
        return {
            key: [np.array(each, dtype=np.float64) for each in value]
            if isinstance(value, list)
            else float(value)
            for key, value in partial.items()
        }
    for key, value in partial.items():
        if isinstance(value, list):
            for each, more in zip(total[key], value, strict=True):
                np.add(each, more, out=each)
        else:
            total[key] += float(value)
    return total


def check_aggregation(
    client_weighting: Any, model_aggregator: Any
) -> tuple[str, ModelAggregator | None]:
    """A builder's ``client_weighting`` (one of :data:`CLIENT_WEIGHTINGS`) and
    ``model_aggregator`` (a :class:`ModelAggregator` or None), checked."""
    client_weighting = check_choice("client_weighting", client_weighting, CLIENT_WEIGHTINGS)
    check_type("model_aggregator", model_aggregator, ModelAggregator, allow_none=True)
    return client_weighting, model_aggregator
