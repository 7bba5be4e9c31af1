"""The learning process protocol: what ``train_model`` drives round by round."""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, NamedTuple, Protocol, runtime_checkable

from programlogic.context import get_context
from programlogic.data import ClientHandle

__all__ = ["LearningProcess", "LearningProcessOutput"]


class LearningProcessOutput(NamedTuple):
    """What one round of a learning process returns: the new state and its metrics."""

    state: Any
    metrics: Any


@runtime_checkable
class LearningProcess(Protocol):
    """A federated learning algorithm as a state machine over rounds.

    - ``initialize()`` returns the initial state (the round-0 checkpoint).
    - ``next(state, clients)`` runs one round on the given client handles and returns a
      :class:`LearningProcessOutput`. It may be a plain function, which ``train_model``
      runs off the event loop through the federated context, or a coroutine function,
      which is awaited and typically calls the current context's ``map_clients``.
      Training metrics go under ``client_work/train`` (``client_work/train/loss``).
    - ``get_model_weights(state)`` returns the model weights held in a state;
      ``set_model_weights(state, weights)`` returns a state holding ``weights``.

    Any of the four may be sync or async. A process must not mutate a state it was
    given: ``train_model`` may still be saving the previous round's state while the
    next round computes. A state keeps the structure of ``initialize()``'s (the same
    paths, and arrays of the same shapes and dtypes): ``train_model`` refuses to resume
    a saved state that does not fit the initial one.

    Optionally, a plain (sync) method ``describe_configuration()`` returns a JSON-able
    dict of the hyperparameters a resumed run must share (learning rates, the model's
    layers and shapes, preprocessing), equal for two processes built with the same
    arguments, or ``None``. ``train_model`` records it in every checkpoint and refuses
    to resume with another one unless told to
    (``resume_with_changed_configuration=True``). It is not one of the protocol's
    members, so processes without it still satisfy ``isinstance``; without it, nothing
    of the configuration is compared.
    """

    def initialize(self) -> Any | Awaitable[Any]:
        """The initial state."""
        ...

    def next(
        self, state: Any, clients: Sequence[ClientHandle]
    ) -> LearningProcessOutput | Awaitable[LearningProcessOutput]:
        """One round on ``clients``, from ``state``."""
        ...

    def get_model_weights(self, state: Any) -> Any:
        """The model weights held in ``state``."""
        ...

    def set_model_weights(self, state: Any, weights: Any) -> Any:
        """A state like ``state`` that holds ``weights``."""
        ...


def as_async(fn: Callable[..., Any]) -> Callable[..., Awaitable[Any]]:
    """``fn`` as a coroutine function.

    A coroutine function is returned as it is. Any other callable is run through the
    current federated context (off the event loop) when the returned function is
    awaited; if it returns an awaitable, that is awaited too.
    """
    if inspect.iscoroutinefunction(fn):
        return fn

    async def off_the_loop(*args: Any) -> Any:
        result = await get_context().run(fn, *args)
        return await result if inspect.isawaitable(result) else result

    return off_the_loop
