"""Value references and their concurrent materialization.

A *value reference* is anything with an ``async get_value()`` method: a result a backend
is still computing, a tensor that lives on a remote worker, a value read lazily from
disk. Contexts may hand back references so that computations pipeline; managers call
:func:`materialize` to turn a structure that holds references into plain values.

Example::

    class Later:
        def __init__(self, value):
            self.value = value

        async def get_value(self):
            return self.value

    await materialize({"loss": Later(0.5), "round": 3})  # {"loss": 0.5, "round": 3}
"""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

import numpy as np

from managers.structure import is_container, leaves, unflatten
from managers.taskgroups import task_group

__all__ = ["ValueReference", "is_value_reference", "materialize"]


@runtime_checkable
class ValueReference(Protocol):
    """A value that becomes available by awaiting ``get_value()``.

    ``get_value`` may be awaited more than once and from several tasks at a time; each
    call returns the same value (or raises the same kind of error).
    """

    async def get_value(self) -> Any:
        """The referenced value, once it is available."""


def is_value_reference(value: object) -> bool:
    """Whether ``value`` is a value reference (has an ``async get_value()``)."""
    return callable(getattr(value, "get_value", None))


async def materialize(structure: Any) -> Any:
    """``structure`` with every value reference in it replaced by its value.

    All references are awaited concurrently; containers keep their types. The first
    error raised by a reference propagates unchanged (several as an ``ExceptionGroup``)
    and cancels the others. A structure without references is returned as it is,
    without a copy.
    """
    if not _holds_reference(structure):
        return structure
    flat = leaves(structure)
    positions = [i for i, leaf in enumerate(flat) if is_value_reference(leaf)]
    resolved = list(flat)

    async def resolve(position: int) -> None:
        resolved[position] = await flat[position].get_value()

    if len(positions) == 1:
        await resolve(positions[0])
    else:
        async with task_group() as group:
            for position in positions:
                group.start_soon(resolve, position)
    return unflatten(structure, resolved)


def _holds_reference(structure: Any) -> bool:
    stack = [structure]
    while stack:
        node = stack.pop()
        kind = type(node)
        if kind in _PLAIN_LEAVES:
            continue
        if kind is dict:
            stack.extend(node.values())
        elif kind is list or kind is tuple:
            stack.extend(node)
        elif is_container(node):
            stack.extend(leaves(node))
        elif is_value_reference(node):
            return True
    return False


_PLAIN_LEAVES = frozenset({int, float, bool, str, bytes, complex, type(None), np.ndarray})
