"""What FedAvg and FedEval share: grouping a round's clients and one compiled group function.

A learning process here runs its client work through the current federated context a
group of clients at a time, in one compiled, vectorized TensorFlow call. Tracing and
compiling that call costs seconds, so processes configured alike share it: the
compiled function is kept in a small process-wide cache, keyed by everything its graph
depends on. A program that builds a new evaluation process for every evaluation, or a
worker that unpickles a process it was shipped again, then compiles once.
"""

from __future__ import annotations

import abc
import collections
import dataclasses
import functools
import math
import threading
from collections.abc import Callable, Hashable, Sequence
from typing import Any

import numpy as np

from managers.validation import check_int, check_type
from programlogic.context import FederatedContext, get_context
from programlogic.datasets.preprocessing import Preprocessing
from programlogic.learning._tensorflow import CompiledFunction, keras
from programlogic.learning.keras_model import (
    DEFAULT_LOSS,
    FunctionalModel,
    ModelWeights,
    stack_clients,
)

__all__ = [
    "MAX_CLIENTS_PER_GROUP",
    "SHARED_FUNCTIONS",
    "GroupedProcess",
    "check_clients_per_group",
    "functional_model",
    "plan_group_size",
    "ratio",
    "shared_compiled",
    "training_model",
]

MAX_CLIENTS_PER_GROUP = 64
"""The largest group the default grouping makes: bounds the memory of one compiled call."""


def plan_group_size(num_clients: int, parallelism: int, clients_per_group: int | None) -> int:
    """How many clients of a round of ``num_clients`` go into one compiled call.

    ``clients_per_group`` when given (at most ``num_clients``). Otherwise the round is
    split evenly over ``parallelism`` workers: into the fewest groups of at most
    :data:`MAX_CLIENTS_PER_GROUP` clients whose number is a multiple of
    ``parallelism`` (at least ``parallelism`` groups), so that every worker computes as
    many groups; where those groups would leave the last one empty, groups up to a
    quarter smaller that split the round into such a multiple, if any.
    """
    if clients_per_group is not None:
        return min(clients_per_group, num_clients)
    parallelism = max(1, parallelism)
    groups = max(parallelism, math.ceil(num_clients / MAX_CLIENTS_PER_GROUP))
    groups = math.ceil(groups / parallelism) * parallelism
    size = max(1, math.ceil(num_clients / groups))
    # Groups of that size may number fewer (10,000 clients in 158 groups make 157 of
    # 64), leaving one worker a last group alone: a slightly smaller size splits evenly.
    for smaller in range(size, math.ceil(size * 3 / 4) - 1, -1):
        if math.ceil(num_clients / smaller) % parallelism == 0:
            return smaller
    return size


def check_clients_per_group(clients_per_group: object) -> None:
    """Raise unless ``clients_per_group`` is None or an int >= 1 (TypeError or ValueError)."""
    check_int("clients_per_group", clients_per_group, minimum=1, allow_none=True)


def ratio(numerator: float, denominator: float) -> float:
    """``numerator / denominator`` rounded to float32, as TensorFlow metrics report it."""
    if denominator == 0:
        return math.nan
    return float(np.float32(numerator / denominator))


def functional_model(
    model_fn: Callable[[], Any], loss: Any, metrics: Sequence[Any]
) -> FunctionalModel:
    """The :class:`FunctionalModel` a builder makes; ``loss`` None is :data:`DEFAULT_LOSS`."""
    return FunctionalModel(model_fn, DEFAULT_LOSS if loss is None else loss, metrics)


SHARED_FUNCTIONS = 8
"""How many compiled group functions the process keeps for processes built later."""

_shared: collections.OrderedDict[Hashable, CompiledFunction] = collections.OrderedDict()
_shared_lock = threading.Lock()


class _Same:
    """A key part equal only to the very same object (for objects equal by identity alone)."""

    def __init__(self, value: object) -> None:
        self.value = value

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _Same) and other.value is self.value

    def __hash__(self) -> int:
        return id(self.value)


def _callable_key(fn: Any) -> Hashable:
    # Partials are equal when made of equal parts (as a worker's unpickled copy is).
    if isinstance(fn, functools.partial):
        return (_callable_key(fn.func), fn.args, tuple(sorted(fn.keywords.items())))
    return fn


def _model_key(model: FunctionalModel) -> Hashable:
    """What a graph of ``model`` depends on: equal keys build the same graph.

    ``model_fn`` must build the same model every call (unpickling relies on it too); the
    weights' shapes and dtypes and Keras' dtype policy guard against one that does not.
    A loss is only known to compute what it computes itself: a Keras loss's config may
    leave out its arguments (``Huber``'s ``delta``).
    """
    return (
        _callable_key(model.model_fn),
        _Same(model.loss),
        model.metrics,
        model.input_shape,
        len(model.model.trainable_variables),
        tuple((tuple(v.shape), str(v.dtype)) for v in model.model.weights),
        keras.config.dtype_policy().name,
    )


def shared_compiled(key: Hashable, fn: Callable[..., Any]) -> CompiledFunction:
    """The compiled ``fn``, or the one compiled for an earlier function of the same ``key``.

    The :data:`SHARED_FUNCTIONS` most recently asked for are kept; a key that does not
    hash (an argument of ``model_fn`` that is an array, say) gets a function of its own.
    """
    try:
        hash(key)
    except TypeError:
        return CompiledFunction(fn)
    with _shared_lock:
        compiled = _shared.get(key)
        if compiled is None:
            compiled = _shared[key] = CompiledFunction(fn)
            if len(_shared) > SHARED_FUNCTIONS:
                _shared.popitem(last=False)
        _shared.move_to_end(key)
        return compiled


class GroupedProcess(abc.ABC):
    """A learning process whose client work runs in compiled, vectorized client groups.

    Subclasses name their group graph with :meth:`_group_graph` and run it on a group
    with :meth:`_run_group`. Processes whose graphs have the same key share one
    compiled function (see :func:`shared_compiled`). The process pickles without it; the
    copy gets it again where it is unpickled.
    """

    def __init__(
        self, model: FunctionalModel, preprocess: Preprocessing, clients_per_group: int | None
    ) -> None:
        self.model = model
        self.preprocess = preprocess
        self.clients_per_group = clients_per_group
        self._compiled = self._compile()

    def describe_configuration(self) -> dict[str, Any]:
        """What a resumed run must share: the model (:meth:`FunctionalModel.describe`) and
        the preprocessing, as a JSON-able dict.

        ``clients_per_group`` is left out: it is how the work is split, which a resumed
        run (on another machine, say) may change.
        """
        preprocess = dataclasses.asdict(self.preprocess)
        if preprocess["feature_shape"] is not None:
            preprocess["feature_shape"] = list(preprocess["feature_shape"])
        return {"model": self.model.describe(), "preprocess": preprocess}

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        del state["_compiled"]  # holds a tf.function: found or rebuilt where it is unpickled
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._compiled = self._compile()

    @abc.abstractmethod
    def _group_graph(self) -> tuple[Callable[..., Any], tuple[Hashable, ...]]:
        """``(graph, config)``: the group function is ``graph(model, *config, *weights, group)``.

        ``graph`` is a module-level function and ``config`` hashable values that, with
        the model, determine the graph it traces; ``weights`` are the trainable and
        non-trainable lists of arrays and ``group`` a
        :class:`~programlogic.learning.keras_model.ClientGroup`, followed by any inputs
        :meth:`_run_group` is given.
        """

    def _compile(self) -> CompiledFunction:
        graph, config = self._group_graph()
        fn = functools.partial(graph, self.model, *config)
        return shared_compiled((graph, _model_key(self.model), config), fn)

    def _run_group(
        self,
        weights: ModelWeights,
        datas: Sequence[Any],
        seeds: Sequence[int],
        group_size: int,
        *inputs: Any,
        whole_batches: bool = False,
    ) -> Any:
        """The compiled group function on ``datas``, preprocessed with a seed each, padded
        (``whole_batches`` as in :func:`stack_clients`), with the further ``inputs`` its
        graph takes after the group.

        A client's seed also gives its seed-generator states (its dropout, say).
        """
        examples = [self.preprocess.examples(data) for data in datas]
        orders = [
            self.preprocess.order(len(client.y), seed)
            for client, seed in zip(examples, seeds, strict=True)
        ]
        random_states = [self.model.random_states(seed) for seed in seeds]
        group = stack_clients(
            examples, orders, group_size, random_states, whole_batches=whole_batches
        )
        return self._compiled(weights["trainable"], weights["non_trainable"], group, *inputs)

    def _plan_round(self, clients: Sequence[Any], round_name: str) -> tuple[FederatedContext, int]:
        """The current context and the round's group size; ``round_name`` names it in errors."""
        if not clients:
            raise ValueError(f"{round_name} needs at least one client, got none")
        context = get_context()
        return context, plan_group_size(len(clients), context.parallelism, self.clients_per_group)


def training_model(
    model_fn: Callable[[], Any],
    loss: Any,
    metrics: Sequence[Any],
    preprocess: Preprocessing,
    seed: int,
    clients_per_group: int | None,
) -> FunctionalModel:
    """The model of a training process's builder, once ``preprocess``, ``seed`` and
    ``clients_per_group`` are checked."""
    check_type("preprocess", preprocess, Preprocessing)
    check_int("seed", seed, minimum=0)
    check_clients_per_group(clients_per_group)
    return functional_model(model_fn, loss, metrics)
