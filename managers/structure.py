"""Nested structures: flatten them with path names, rebuild them, map over their leaves.

A *structure* is a nest of containers whose non-container values are *leaves*. The
containers are:

- ``dict`` (and other ``Mapping`` types that are dicts) with ``str`` keys, in insertion
  order, which is kept everywhere: never sorted;
- ``list``;
- ``tuple`` and ``NamedTuple`` types;
- dataclass instances (every field, in declaration order).

Everything else is a leaf: Python scalars, ``str``, ``bytes``, ``None``, numpy scalars
and arrays, tensors, value references.

A leaf's *path* joins the keys from the root to it with ``/``: ``client_work/train/loss``.
List and tuple positions are written as decimal numbers (``weights/0``); NamedTuple
and dataclass members by their field names (``metrics/loss``). The root leaf
of a structure that is itself a leaf has the path ``""``. Paths are what metric names,
CSV columns and TensorBoard tags are made of.

Example::

    >>> flatten({"train": {"loss": 0.5, "num_examples": 10}, "weights": [1, 2]})
    [('train/loss', 0.5), ('train/num_examples', 10), ('weights/0', 1), ('weights/1', 2)]
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Callable, Iterable, Iterator
from typing import Any

__all__ = [
    "PATH_SEPARATOR",
    "children",
    "dict_like",
    "flatten",
    "is_container",
    "join_path",
    "leaves",
    "map_structure",
    "map_with_paths",
    "reshape",
    "unflatten",
]

PATH_SEPARATOR = "/"


def is_container(value: object) -> bool:
    """Whether ``value`` is a container of a structure (dict, list, tuple, dataclass)."""
    return isinstance(value, dict | list | tuple) or _is_dataclass_instance(value)


def join_path(prefix: str, key: str) -> str:
    """The path of ``key`` inside the container at path ``prefix``."""
    return f"{prefix}{PATH_SEPARATOR}{key}" if prefix else key


def dict_like(template: dict[str, Any], items: dict[str, Any]) -> dict[str, Any]:
    """``items`` in a dict of ``template``'s type and settings (an OrderedDict, a
    defaultdict with its default factory); a plain dict when ``template`` is one."""
    if type(template) is dict:
        return items
    rebuilt = copy.copy(template)
    rebuilt.clear()
    rebuilt.update(items)
    return rebuilt


def flatten(structure: Any) -> list[tuple[str, Any]]:
    """The ``(path, leaf)`` pairs of ``structure``, depth first, in container order.

    Raises:
        TypeError: a dict key is not a ``str`` (the message names the path).
    """
    found: list[tuple[str, Any]] = []
    _walk(structure, "", found)
    return found


def leaves(structure: Any) -> list[Any]:
    """The leaves of ``structure`` in the order :func:`flatten` gives."""
    return [leaf for _, leaf in flatten(structure)]


def unflatten(template: Any, new_leaves: Iterable[Any]) -> Any:
    """A structure shaped like ``template`` whose leaves are taken from ``new_leaves``.

    Containers are rebuilt with the template's types: NamedTuples as their class,
    dataclasses through their constructor (``dataclasses.replace``).

    Raises:
        ValueError: ``new_leaves`` holds fewer or more leaves than ``template``.
    """
    iterator = iter(new_leaves)
    expected = len(leaves(template))
    try:
        result = _rebuild(template, iterator)
    except StopIteration:
        raise ValueError(
            f"unflatten needs {expected} leaves for this template, but fewer were given"
        ) from None
    if next(iterator, _MISSING) is not _MISSING:
        raise ValueError(
            f"unflatten needs {expected} leaves for this template, but more were given"
        )
    return result


def reshape(template: Any, value: Any) -> Any:
    """``value`` with the container types of ``template``.

    Where ``template`` holds ``None`` the subtree of ``value`` is kept as it is; dict
    keys of ``value`` that the template lacks are kept too. This is how state managers
    give a loaded state the container types of a template (e.g. an initial state).
    """
    if template is None:
        return value
    if isinstance(template, dict) and isinstance(value, dict):
        reshaped = {key: reshape(template.get(key), child) for key, child in value.items()}
        return dict_like(template, reshaped)
    return unflatten(template, leaves(value))


def map_structure(fn: Callable[[Any], Any], structure: Any) -> Any:
    """``structure`` with every leaf replaced by ``fn(leaf)``; containers keep their types."""
    return unflatten(structure, [fn(leaf) for leaf in leaves(structure)])


def map_with_paths(fn: Callable[[str, Any], Any], structure: Any) -> Any:
    """``structure`` with every leaf replaced by ``fn(path, leaf)``."""
    return unflatten(structure, [fn(path, leaf) for path, leaf in flatten(structure)])


_MISSING = object()


def _is_dataclass_instance(value: object) -> bool:
    return dataclasses.is_dataclass(value) and not isinstance(value, type)


def children(container: Any, path: str = "") -> Iterator[tuple[str, Any]]:
    """The ``(key, child)`` pairs of a container, keys as path names use them.

    ``path`` is the container's own path, named in the error for a non-str dict key.
    """
    if isinstance(container, dict):
        for key, child in container.items():
            if not isinstance(key, str):
                where = f"at {path!r}" if path else "at the root"
                raise TypeError(
                    f"dict keys of a structure must be str; found {type(key).__name__} "
                    f"key {key!r} {where}"
                )
            yield key, child
    elif hasattr(container, "_fields") and isinstance(container, tuple):
        yield from zip(container._fields, container, strict=True)
    elif isinstance(container, list | tuple):
        for index, child in enumerate(container):
            yield str(index), child
    else:
        for field in dataclasses.fields(container):
            yield field.name, getattr(container, field.name)


def _walk(node: Any, path: str, found: list[tuple[str, Any]]) -> None:
    if not is_container(node):
        found.append((path, node))
        return
    for key, child in children(node, path):
        _walk(child, join_path(path, key), found)


def _rebuild(template: Any, iterator: Iterator[Any]) -> Any:
    if isinstance(template, dict):
        return dict_like(
            template, {key: _rebuild(child, iterator) for key, child in template.items()}
        )
    if isinstance(template, list):
        return [_rebuild(child, iterator) for child in template]
    if isinstance(template, tuple):
        items = [_rebuild(child, iterator) for child in template]
        if hasattr(template, "_fields"):
            return type(template)(*items)
        return tuple(items) if type(template) is tuple else type(template)(items)
    if _is_dataclass_instance(template):
        values = {
            field.name: _rebuild(getattr(template, field.name), iterator)
            for field in dataclasses.fields(template)
        }
        init_values = {f.name: values[f.name] for f in dataclasses.fields(template) if f.init}
        rebuilt = dataclasses.replace(template, **init_values)
        for field in dataclasses.fields(template):
            if not field.init:
                object.__setattr__(rebuilt, field.name, values[field.name])
        return rebuilt
    return next(iterator)
