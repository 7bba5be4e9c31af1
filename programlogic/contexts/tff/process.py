"""TFF learning processes as programlogic learning processes."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import tensorflow as tf
import tensorflow_federated as tff

from managers.validation import check_callable
from programlogic.context import get_context
from programlogic.contexts.tff.context import TFFContext
from programlogic.contexts.tff.structures import from_plain, to_plain
from programlogic.data import ClientHandle
from programlogic.exceptions import ClientError
from programlogic.process import LearningProcessOutput

__all__ = ["TFFLearningProcess", "build_tff_evaluation"]

ClientDataFn = Callable[[Any], Any]
"""Turns what a client handle loads into what the TFF process takes (a ``tf.data.Dataset``)."""


class TFFLearningProcess:
    """A ``tff.learning.templates.LearningProcess`` as a programlogic learning process.

    ``train_model`` (and ``EvaluationManager``) drive it like any
    :class:`~programlogic.LearningProcess`; it runs only inside a
    :class:`~programlogic.contexts.tff.TFFContext`, whose thread computes every call.

    - State: a plain structure (nested dicts and lists of numpy arrays and numpy
      scalars, dicts where TFF names the elements), which the file state manager
      stores losslessly; each call converts it to TFF's containers and back, guided
      by the process's TFF types, so a resumed run continues bit for bit.
    - ``next(state, clients)``: each client's data is loaded on the context's thread,
      turned into a ``tf.data.Dataset`` by ``client_data_fn`` (by default the loaded
      data must already be one), and the TFF process runs its round on the clients in
      the order given. A process whose clients take other values than datasets (one
      made by ``tff.simulation.compose_dataset_computation_with_learning_process``
      takes client ids) gets the loaded data as it is, or through ``client_data_fn``.
      The metrics come back as nested dicts named as TFF names them
      (``client_work/train/loss``), with numpy scalars as leaves.
    - ``get_model_weights(state)``: ``{"trainable": [...], "non_trainable": [...]}``;
      ``set_model_weights`` takes that form (or TFF's ``ModelWeights``).

    Raises:
        TypeError: ``tff_process`` is not a TFF ``LearningProcess``, or
            ``client_data_fn`` is not callable.
    """

    def __init__(
        self,
        tff_process: tff.learning.templates.LearningProcess,
        *,
        client_data_fn: ClientDataFn | None = None,
    ) -> None:
        if not isinstance(tff_process, tff.learning.templates.LearningProcess):
            raise TypeError(
                "tff_process must be a tff.learning.templates.LearningProcess, got "
                f"{type(tff_process).__name__}"
            )
        check_callable("client_data_fn", client_data_fn, allow_none=True)
        self.tff_process = tff_process
        self._client_data_fn = client_data_fn
        self._state_type = tff_process.initialize.type_signature.result
        next_type = tff_process.next.type_signature
        client_data_type = next_type.parameter[1]
        member = getattr(client_data_type, "member", client_data_type)
        self._takes_datasets = isinstance(member, tff.SequenceType)
        self._metrics_type = next_type.result.metrics
        self._weights_type = tff_process.get_model_weights.type_signature.result

    async def initialize(self) -> Any:
        """The TFF process's initial state, as a plain structure."""
        return await _context("initialize").run(self._initialize)

    async def next(self, state: Any, clients: Sequence[ClientHandle]) -> LearningProcessOutput:
        """One TFF round from ``state`` on ``clients``; plain state and metrics."""
        return await _context("next").run(self._next, state, list(clients))

    async def get_model_weights(self, state: Any) -> Any:
        """The model weights of ``state``: ``{"trainable": [...], "non_trainable": [...]}``."""
        return await _context("get_model_weights").run(self._get_model_weights, state)

    async def set_model_weights(self, state: Any, weights: Any) -> Any:
        """``state`` holding ``weights`` (plain, or TFF's ``ModelWeights``)."""
        return await _context("set_model_weights").run(self._set_model_weights, state, weights)

    def to_tff_state(self, state: Any) -> Any:
        """A plain state as the TFF process's own state value (its Python containers)."""
        return from_plain(state, self._state_type)

    def from_tff_state(self, tff_state: Any) -> Any:
        """A state of the TFF process (as TFF returns it) as a plain structure."""
        return to_plain(tff_state, self._state_type)

    def _initialize(self) -> Any:
        return self.from_tff_state(self.tff_process.initialize())

    def _next(self, state: Any, clients: list[ClientHandle]) -> LearningProcessOutput:
        tff_state = self.to_tff_state(state)
        client_data = [self._client_data(client) for client in clients]
        output = self.tff_process.next(tff_state, client_data)
        return LearningProcessOutput(
            state=self.from_tff_state(output.state),
            metrics=to_plain(output.metrics, self._metrics_type),
        )

    def _get_model_weights(self, state: Any) -> Any:
        weights = self.tff_process.get_model_weights(self.to_tff_state(state))
        return to_plain(weights, self._weights_type)

    def _set_model_weights(self, state: Any, weights: Any) -> Any:
        if not isinstance(weights, tff.learning.models.ModelWeights):
            weights = from_plain(weights, self._weights_type)
        return self.from_tff_state(
            self.tff_process.set_model_weights(self.to_tff_state(state), weights)
        )

    def _client_data(self, client: ClientHandle) -> Any:
        try:
            data = client.load()
            if self._client_data_fn is not None:
                data = self._client_data_fn(data)
            if self._takes_datasets and not isinstance(data, tf.data.Dataset):
                raise TypeError(
                    "client data must be a tf.data.Dataset (give TFFLearningProcess a "
                    f"client_data_fn to make one), got {type(data).__name__}"
                )
        except Exception as error:
            raise ClientError([client.client_id], error) from error
        return data


def build_tff_evaluation(
    model_fn: Callable[[], tff.learning.models.VariableModel],
    *,
    client_data_fn: ClientDataFn | None = None,
    **fed_eval_arguments: Any,
) -> TFFLearningProcess:
    """Federated evaluation of ``model_fn``'s model, for :class:`~programlogic.EvaluationManager`.

    The process is ``tff.learning.algorithms.build_fed_eval(model_fn,
    **fed_eval_arguments)`` wrapped in :class:`TFFLearningProcess`: its state holds
    the weights under evaluation (``set_model_weights`` takes what a training
    ``TFFLearningProcess.get_model_weights`` returns), and ``next`` evaluates them on
    the given clients, with metrics under ``client_work/eval`` (``current_round_metrics``
    and ``total_rounds_metrics``).
    """
    check_callable("model_fn", model_fn)
    process = tff.learning.algorithms.build_fed_eval(model_fn, **fed_eval_arguments)
    return TFFLearningProcess(process, client_data_fn=client_data_fn)


def _context(method: str) -> TFFContext:
    context = get_context()
    if not isinstance(context, TFFContext):
        raise TypeError(
            f"TFFLearningProcess.{method} runs in a TFFContext, but the current context is "
            f"a {type(context).__name__}: use `async with TFFContext():`"
        )
    return context
