"""Ray's errors as ours: the one table every call of the Ray backend goes through.

=====================================  ===============================================
Raised by Ray                          Raised by RayContext (Ray's error as ``__cause__``)
=====================================  ===============================================
``ray.exceptions.RayTaskError``        :class:`~programlogic.exceptions.ClientError`:
                                       the client work raised (its error, the clients)
our own exceptions                     unchanged
``ConnectionError`` (``ray.init``)     :class:`~programlogic.exceptions.ClusterConnectionError`
every other ``RayError``               :class:`~programlogic.exceptions.ProgramLogicError`
                                       saying what could not be done
``TypeError``                          unchanged: a value Ray cannot serialize
=====================================  ===============================================

A lost cluster is diagnosed apart from this table (its control service no longer
answers) and is a :class:`~programlogic.exceptions.ClusterConnectionError` too.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from programlogic.exceptions import ClientError, ClusterConnectionError, ProgramLogicError

__all__ = ["translate"]


def _client_work_failed(error: Any, what: str, client_ids: Sequence[str]) -> BaseException:
    cause = error.cause
    return cause if isinstance(cause, ClientError) else ClientError(client_ids, cause)


def _cluster_unreachable(error: Any, what: str, client_ids: Sequence[str]) -> BaseException:
    return ClusterConnectionError(f"RayContext could not {what}: {error}")


def _ray_failed(error: Any, what: str, client_ids: Sequence[str]) -> BaseException:
    return ProgramLogicError(f"RayContext could not {what}: {type(error).__name__}: {error}")


def _unchanged(error: Any, what: str, client_ids: Sequence[str]) -> BaseException:
    return error


Rule = Callable[[Any, str, Sequence[str]], BaseException]


def _table(ray: Any) -> list[tuple[type[BaseException], Rule]]:
    """The rows of the table, first match wins."""
    return [
        (ray.exceptions.RayTaskError, _client_work_failed),  # also when it is its cause's kind
        (ProgramLogicError, _unchanged),
        (ray.exceptions.RayError, _ray_failed),
        (ConnectionError, _cluster_unreachable),
        (TypeError, _unchanged),
    ]


def translate(
    ray: Any, error: BaseException, what: str, client_ids: Sequence[str] = ()
) -> BaseException:
    """Our exception for ``error``, raised by Ray while it tried to ``what``.

    ``client_ids`` names the clients whose work Ray ran, if any. Errors that are not
    Ray's (of our code, or cancellation) come back unchanged.
    """
    for kind, rule in _table(ray):
        if isinstance(error, kind):
            translated = rule(error, what, client_ids)
            if translated is not error and translated.__cause__ is None:
                translated.__cause__ = error
            return translated
    return error
