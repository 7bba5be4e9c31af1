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
    "map_children",
    "map_structure",
    "map_with_paths",
    "reshape",
    "structure_misfit",
    "unflatten",
]

PATH_SEPARATOR = "/"
"""What joins the keys of a path name: ``client_work/train/loss``."""


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


def map_children(fn: Callable[[Any], Any], container: Any) -> Any:
    """``container`` rebuilt with its own type, each child replaced by ``fn(child)``.

    One level only: ``fn`` receives child containers as they are and decides whether to
    go deeper. Children are visited in container order (dict insertion order, dataclass
    fields in declaration order). Dicts keep their
    type and settings (:func:`dict_like`), NamedTuples and tuple subclasses their class;
    dataclasses are rebuilt through their constructor (``dataclasses.replace``), and
    fields outside ``__init__`` are set to ``fn(field)`` afterwards.

    Raises:
        TypeError: ``container`` is not a container (see :func:`is_container`).
    """
    if isinstance(container, dict):
        return dict_like(container, {key: fn(child) for key, child in container.items()})
    if isinstance(container, list):
        return [fn(child) for child in container]
    if isinstance(container, tuple):
        items = [fn(child) for child in container]
        if hasattr(container, "_fields"):
            return type(container)(*items)
        return tuple(items) if type(container) is tuple else type(container)(items)
    if _is_dataclass_instance(container):
        fields = dataclasses.fields(container)
        values = {field.name: fn(getattr(container, field.name)) for field in fields}
        rebuilt = dataclasses.replace(
            container, **{field.name: values[field.name] for field in fields if field.init}
        )
        for field in fields:
            if not field.init:
                object.__setattr__(rebuilt, field.name, values[field.name])
        return rebuilt
    raise TypeError(f"map_children needs a container, got {type(container).__name__}")


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
    if is_container(template):
        return map_children(lambda child: _rebuild(child, iterator), template)
    return next(iterator)


_MISSING = object()


def structure_misfit(state: Any, initial_state: Any) -> str | None:
    """Where ``state`` does not have the structure of ``initial_state``, or ``None``.

    The paths of their leaves must be the same, and leaves that are arrays (or numbers)
    must have the same shape, and the same dtype where both are NumPy values. The first
    difference is named: its path, then ``state``'s leaf and (``this run``)
    ``initial_state``'s.
    """
    leaves, initial = dict(flatten(state)), dict(flatten(initial_state))
    for path in {**initial, **leaves}:
        was, now = _leaf_kind(leaves.get(path, _MISSING)), _leaf_kind(initial.get(path, _MISSING))
        if _kinds_differ(was, now):
            return f"{path or 'the root'}: {_show_kind(was)} (this run: {_show_kind(now)})"
    return None


def _leaf_kind(leaf: Any) -> Any:
    """``_MISSING``; ``(shape, dtype)`` of an array-like leaf (dtype ``None`` for a Python
    number); or ``None`` for a leaf of any other kind, whose value alone may change."""
    if leaf is _MISSING:
        return _MISSING
    if isinstance(leaf, bool | int | float | complex):
        return (), None
    shape, dtype = getattr(leaf, "shape", None), getattr(leaf, "dtype", None)
    if shape is None or dtype is None:
        return None
    try:
        return tuple(int(size) for size in shape), str(dtype)
    except TypeError:  # a dimension unknown until run time
        return None


def _kinds_differ(was: Any, now: Any) -> bool:
    if was is _MISSING or now is _MISSING:
        return was is not now
    if was is None or now is None:
        return False
    (was_shape, was_dtype), (now_shape, now_dtype) = was, now
    if was_shape != now_shape:
        return True
    return was_dtype is not None and now_dtype is not None and was_dtype != now_dtype


def _show_kind(kind: Any) -> str:
    if kind is _MISSING:
        return "nothing"
    if kind is None:
        return "a value"
    shape, dtype = kind
    return f"shape {shape} {dtype or 'number'}"
