"""TFF values as plain structures and back, guided by their TFF types.

A plain structure is what the file state manager stores losslessly and release managers
understand: a named TFF struct becomes a ``dict`` (in the type's order), an unnamed one a
``list``, and a tensor a numpy array of the type's dtype (a numpy scalar when the
tensor is rank 0). Going back rebuilds the Python containers the TFF type records
(``LearningAlgorithmState``, ``ModelWeights``, ``OrderedDict``...), so TFF computations
accept the result as if it came from TFF.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import tensorflow_federated as tff

__all__ = ["from_plain", "to_plain"]


def _member(type_spec: tff.Type) -> tff.Type:
    """The member type of a federated type placed once (at the server); others as they are."""
    if isinstance(type_spec, tff.FederatedType):
        if not type_spec.all_equal:
            raise TypeError(f"values of the non-all-equal federated type {type_spec} are not plain")
        return type_spec.member
    return type_spec


def _names(type_spec: tff.StructType, path: str) -> list[str] | None:
    """The element names of a struct type: all of them, or ``None`` when it has none."""
    names = [name for name, _ in tff.structure.iter_elements(type_spec)]
    if all(name is None for name in names):
        return None
    if any(name is None for name in names):
        raise TypeError(
            f"at {path or 'the top'}: a struct mixing named and unnamed elements, {type_spec}"
        )
    return names  # type: ignore[return-value]


def to_plain(value: Any, type_spec: tff.Type) -> Any:
    """``value``, a Python value of TFF type ``type_spec``, as a plain structure.

    Named elements of ``value`` are matched to the type's by name, unnamed ones by
    position.

    Raises:
        TypeError, ValueError: ``value`` does not have the structure of ``type_spec``,
            or the type holds what has no plain form (sequences, functions); the message
            names the path of what differs.
    """
    return _to_plain(value, type_spec, "")


def _to_plain(value: Any, type_spec: tff.Type, path: str) -> Any:
    where = path or "the top"
    type_spec = _member(type_spec)
    if isinstance(type_spec, tff.TensorType):
        array = np.asarray(value, dtype=type_spec.dtype)
        return array[()] if array.ndim == 0 else array
    if isinstance(type_spec, tff.StructType):
        elements = tff.structure.to_elements(tff.structure.from_container(value))
        types = list(tff.structure.iter_elements(type_spec))
        if len(elements) != len(types):
            raise ValueError(f"at {where}: {len(elements)} elements for the type {type_spec}")
        names = _names(type_spec, path)
        given = [name for name, _ in elements]
        if names is not None and all(name is not None for name in given):
            if set(given) != set(names):
                raise ValueError(f"at {where}: expected the names {names}, got {given}")
            by_name = dict(elements)
            items = [by_name[name] for name in names]
        else:
            items = [item for _, item in elements]
        plain = [
            _to_plain(item, element_type, f"{path}/{name if name is not None else index}")
            for index, (item, (name, element_type)) in enumerate(zip(items, types, strict=True))
        ]
        return plain if names is None else dict(zip(names, plain, strict=True))
    raise TypeError(f"at {where}: values of type {type_spec} have no plain form")


def from_plain(plain: Any, type_spec: tff.Type) -> Any:
    """The Python value of TFF type ``type_spec`` that ``plain`` describes.

    Raises:
        TypeError, ValueError: ``plain`` does not have the structure, shapes or dtypes
            of ``type_spec``; the message names the path of what differs.
    """
    member = _member(type_spec)
    return tff.types.type_to_py_container(_to_struct(plain, member, ""), member)


def _to_struct(plain: Any, type_spec: tff.Type, path: str) -> Any:
    where = path or "the top"
    if isinstance(type_spec, tff.TensorType):
        if isinstance(plain, Mapping | list | tuple) and not isinstance(plain, np.ndarray):
            raise TypeError(
                f"at {where}: expected a {type_spec} tensor, got {type(plain).__name__}"
            )
        array = np.asarray(plain)
        if array.dtype != type_spec.dtype and not np.can_cast(
            array.dtype, type_spec.dtype, casting="same_kind"
        ):
            raise TypeError(f"at {where}: expected dtype {type_spec.dtype}, got {array.dtype}")
        array = array.astype(type_spec.dtype, copy=False)
        if not _shape_fits(type_spec.shape, array.shape):
            raise ValueError(f"at {where}: expected shape {type_spec.shape}, got {array.shape}")
        return array[()] if array.ndim == 0 else array
    if isinstance(type_spec, tff.StructType):
        types = list(tff.structure.iter_elements(type_spec))
        names = _names(type_spec, path)
        if names is None:
            if not isinstance(plain, Sequence) or isinstance(plain, str | bytes):
                raise TypeError(
                    f"at {where}: expected a list for {type_spec}, got {type(plain).__name__}"
                )
            if len(plain) != len(types):
                raise ValueError(
                    f"at {where}: expected {len(types)} elements for {type_spec}, got {len(plain)}"
                )
            items = list(plain)
        else:
            if not isinstance(plain, Mapping):
                raise TypeError(
                    f"at {where}: expected a dict for {type_spec}, got {type(plain).__name__}"
                )
            if list(plain.keys()) != names and set(plain.keys()) != set(names):
                raise ValueError(
                    f"at {where}: expected the keys {names}, got {sorted(map(str, plain.keys()))}"
                )
            items = [plain[name] for name in names]
        return tff.structure.Struct(
            [
                (
                    name,
                    _to_struct(item, element_type, f"{path}/{name if name is not None else index}"),
                )
                for index, (item, (name, element_type)) in enumerate(zip(items, types, strict=True))
            ]
        )
    raise TypeError(f"at {where}: values of type {type_spec} have no plain form")


def _shape_fits(expected: Sequence[int | None] | None, shape: tuple[int, ...]) -> bool:
    if expected is None:
        return True
    return len(expected) == len(shape) and all(
        want is None or want == have for want, have in zip(expected, shape, strict=True)
    )
