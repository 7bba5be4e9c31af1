"""The tree of a payload of :mod:`managers.serialization`, and its blob section.

:func:`encode` turns a structure into a tree of JSON values and the blob section that
holds the raw bytes of its arrays and ``bytes`` leaves; :func:`decode` turns them back
into the structure. The tree's tags are described in :mod:`managers.serialization`.

Both bound the structure alike, so that a crafted payload (its checksum valid) cannot
exhaust the stack or the memory of the program loading it: at most :data:`MAX_DEPTH`
levels of containers and at most :data:`MAX_NODES` values.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import numpy as np

from managers.exceptions import SerializationError

__all__ = ["ALIGN", "MAX_DEPTH", "MAX_NODES", "ZEROS", "Blobs", "decode", "encode"]

MAX_DEPTH = 100
"""The deepest a stored structure nests: dicts, lists, tuples and dataclasses each count
one level, and so does each level of a structured dtype's fields."""
MAX_NODES = 1_000_000
"""The most values a stored structure holds, containers and leaves alike (an array is
one value): store long sequences as arrays."""

ALIGN = 16  # arrays start at a multiple of this in the blob section
ZEROS = bytes(ALIGN)
_INT64_MIN = -(2**63)
_INT64_MAX = 2**63 - 1
_NONFINITE = {"nan": math.nan, "inf": math.inf, "-inf": -math.inf}


# Encoding.


def encode(structure: Any) -> tuple[Any, Blobs]:
    """The tree of ``structure``, and the blob section it points into.

    Raises:
        TypeError: a leaf cannot be stored, or a dict key is not a ``str`` (the message
            names its path).
        SerializationError: the structure nests deeper than :data:`MAX_DEPTH` or holds
            more than :data:`MAX_NODES` values (the message names the path where).
    """
    blobs = Blobs()
    try:
        return _encode(structure, blobs, 0), blobs
    except _TooLarge as error:
        raise SerializationError(error.message()) from None
    except _Unstorable as error:
        raise TypeError(error.message()) from None


class _Unstorable(Exception):
    """A value that cannot be stored; collects its path while it unwinds."""

    def __init__(self, subject: str, reason: str) -> None:
        super().__init__(reason)
        self.subject = subject
        self.reason = reason
        self.keys: list[str] = []

    def message(self) -> str:
        path = "/".join(reversed(self.keys))
        where = f"at {path!r}" if path else "at the root"
        return f"cannot store {self.subject} {where}: {self.reason}"


class _TooLarge(_Unstorable):
    """A structure beyond :data:`MAX_DEPTH` or :data:`MAX_NODES`."""


def _too_deep() -> str:
    return f"it nests deeper than {MAX_DEPTH} levels"


def _too_many() -> str:
    return f"it holds more than {MAX_NODES:,} values; store long sequences as arrays"


class Blobs:
    """The blob section being built: buffers in order and their total size; and the
    number of values encoded so far."""

    def __init__(self) -> None:
        self.buffers: list[memoryview] = []
        self.size = 0
        self.nodes = 0

    def add(self, buffer: memoryview, align: int) -> int:
        padding = -self.size % align
        if padding:
            self.buffers.append(memoryview(ZEROS)[:padding])
            self.size += padding
        offset = self.size
        self.buffers.append(buffer)
        self.size += buffer.nbytes
        return offset


def _encode(node: Any, blobs: Blobs, depth: int) -> Any:
    """``node``'s tree; ``depth`` is the number of containers around it."""
    blobs.nodes += 1
    if blobs.nodes > MAX_NODES:
        raise _TooLarge("the structure", _too_many())
    kind = type(node)
    if kind is str:
        if not node.isascii():
            _check_utf8(node, "leaf")
        return node
    if kind is bool or node is None:
        return node
    if kind is int:
        return node if _INT64_MIN <= node <= _INT64_MAX else {"$int": hex(node)}
    if kind is float:
        return node if math.isfinite(node) else {"$float": repr(node)}
    if kind is dict:
        return _encode_dict(node, blobs, depth + 1)
    if kind is list:
        return _encode_items(node, blobs, depth + 1)
    if kind is np.ndarray:
        return _encode_array(node, blobs, depth)
    if isinstance(node, np.generic):
        return _encode_scalar(node, depth)
    if isinstance(node, tuple):
        return {"$tuple": _encode_items(node, blobs, depth + 1)}
    if isinstance(node, dict):
        return _encode_dict(node, blobs, depth + 1)
    if dataclasses.is_dataclass(node) and not isinstance(node, type):
        fields = {field.name: getattr(node, field.name) for field in dataclasses.fields(node)}
        return _encode_dict(fields, blobs, depth + 1)
    if kind is bytes:
        return {"$bytes": [blobs.add(memoryview(node), 1), len(node)]}
    if kind is complex:
        return {"$complex": [_encode(node.real, blobs, depth), _encode(node.imag, blobs, depth)]}
    return _encode_other(node, blobs, depth)


def _encode_other(node: Any, blobs: Blobs, depth: int) -> Any:
    """Leaves that are not stored as they are: array-likes, or refused ones."""
    kind = type(node)
    if isinstance(node, np.ndarray):
        raise _Unstorable(
            "leaf",
            f"numpy array subclasses ({kind.__name__}) cannot be stored; "
            "convert it with np.asarray first",
        )
    if isinstance(node, int | float | complex | str | bytes):
        raise _Unstorable(
            "leaf",
            f"subclasses of built-in types ({kind.__name__}) cannot be stored losslessly; "
            "convert it to the built-in type first",
        )
    if hasattr(node, "__array__"):
        try:
            array = np.asarray(node)
        except Exception as error:
            raise _Unstorable("leaf", f"np.asarray failed on {kind.__name__}: {error}") from None
        return _encode_array(array, blobs, depth)
    raise _Unstorable(
        "leaf",
        f"objects of type {kind.__module__}.{kind.__qualname__} cannot be stored; "
        "leaves are int, float, complex, bool, None, str, bytes, numpy scalars and arrays",
    )


def _encode_dict(items: dict[str, Any], blobs: Blobs, depth: int) -> dict[str, Any]:
    if depth > MAX_DEPTH:
        raise _TooLarge("the structure", _too_deep())
    encoded = {}
    for key, child in items.items():
        if type(key) is not str:
            raise _Unstorable("dict", f"its keys must be str, found {type(key).__name__} {key!r}")
        if not key.isascii():
            _check_utf8(key, "dict")
        try:
            encoded[f"${key}" if key[:1] == "$" else key] = _encode(child, blobs, depth)
        except _Unstorable as error:
            error.keys.append(key)
            raise
    return encoded


def _encode_items(items: list[Any] | tuple[Any, ...], blobs: Blobs, depth: int) -> list[Any]:
    if depth > MAX_DEPTH:
        raise _TooLarge("the structure", _too_deep())
    encoded = []
    for index, child in enumerate(items):
        try:
            encoded.append(_encode(child, blobs, depth))
        except _Unstorable as error:
            error.keys.append(str(index))
            raise
    return encoded


def _check_utf8(text: str, subject: str) -> None:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as error:
        raise _Unstorable(
            subject, f"{text!r} cannot be encoded as UTF-8 ({error.reason})"
        ) from None


def _encode_array(array: np.ndarray, blobs: Blobs, depth: int) -> dict[str, list[Any]]:
    if array.dtype.hasobject:
        raise _Unstorable(
            "leaf",
            f"numpy arrays whose dtype holds Python objects ({array.dtype}) cannot be stored",
        )
    order = "C"
    if not array.flags.c_contiguous:
        if array.flags.f_contiguous:
            order, array = "F", array.T
        else:
            array = np.ascontiguousarray(array)
    offset = 0
    if array.nbytes:
        raw = memoryview(array.reshape(-1).view(np.uint8))
        offset = blobs.add(raw, ALIGN)
    shape = list(array.shape[::-1] if order == "F" else array.shape)
    return {"$array": [_describe(array.dtype, depth), shape, offset, order]}


def _encode_scalar(scalar: np.generic, depth: int) -> dict[str, list[Any]]:
    array = np.asarray(scalar)
    if array.dtype.hasobject:
        raise _Unstorable("leaf", f"numpy scalars of dtype {array.dtype} cannot be stored")
    return {"$scalar": [_describe(array.dtype, depth), array.tobytes().hex()]}


def _describe(dtype: np.dtype, depth: int) -> Any:
    """``dtype`` as the tree stores it; ``depth`` levels hold it."""
    if (dtype.fields is not None or dtype.subdtype is not None) and depth >= MAX_DEPTH:
        raise _TooLarge("the structure", _too_deep())
    if dtype.fields is not None:
        names = list(dtype.names)
        description: dict[str, Any] = {
            "names": names,
            "formats": [_describe(dtype.fields[name][0], depth + 1) for name in names],
            "offsets": [dtype.fields[name][1] for name in names],
            "itemsize": dtype.itemsize,
        }
        titles = [dtype.fields[name][2] if len(dtype.fields[name]) > 2 else None for name in names]
        if any(title is not None for title in titles):
            description["titles"] = titles
        return description
    if dtype.subdtype is not None:
        base, shape = dtype.subdtype
        return [_describe(base, depth + 1), list(shape)]
    return dtype.str


# Decoding.


def decode(tree: Any, section: memoryview) -> Any:
    """The structure that ``tree`` (parsed from JSON) and the blob ``section`` encode.

    Raises:
        SerializationError: the tree is not one that :func:`encode` writes (one beyond
            :data:`MAX_DEPTH` or :data:`MAX_NODES` included), or points outside
            ``section``.
    """
    return _decode(tree, _BlobReader(section), 0)


def _check_depth(depth: int) -> None:
    if depth > MAX_DEPTH:
        raise SerializationError(f"the payload's tree {_too_deep()}")


class _BlobReader:
    """Slices of the blob section; arrays are views when the section is writable. Counts
    the values decoded."""

    def __init__(self, section: memoryview) -> None:
        self.section = section
        self.nodes = 0

    def count(self) -> None:
        self.nodes += 1
        if self.nodes > MAX_NODES:
            raise SerializationError(f"the payload's tree {_too_many()}")

    def slice(self, offset: Any, size: int) -> memoryview:
        if type(offset) is not int or offset < 0 or offset + size > self.section.nbytes:
            raise SerializationError(
                f"the payload's tree points outside its blob section (offset {offset!r}, "
                f"{size} bytes, section of {self.section.nbytes} bytes)"
            )
        return self.section[offset : offset + size]

    def array(self, payload: Any, depth: int) -> np.ndarray:
        description, shape, offset, order = payload
        dtype = _dtype(description, depth)
        if not all(type(size) is int and size >= 0 for size in shape) or order not in ("C", "F"):
            raise SerializationError(f"the payload's tree holds a malformed array {payload!r}")
        shape = tuple(shape)
        count = math.prod(shape)
        if count == 0 or dtype.itemsize == 0:
            return np.zeros(shape, dtype, order=order)
        raw = self.slice(offset, count * dtype.itemsize)
        flat = np.frombuffer(raw, dtype=dtype, count=count)
        if raw.readonly:
            flat = flat.copy()
        if order == "F":
            return flat.reshape(shape[::-1]).T
        return flat.reshape(shape)


def _decode(node: Any, blobs: _BlobReader, depth: int) -> Any:
    """The value of ``node``; ``depth`` is the number of containers around it."""
    blobs.count()
    kind = type(node)
    if kind is list:
        _check_depth(depth + 1)
        return [_decode(child, blobs, depth + 1) for child in node]
    if kind is not dict:
        return node
    if len(node) == 1:
        ((key, value),) = node.items()
        if key[:1] == "$" and key[1:2] != "$":
            return _decode_tagged(key, value, blobs, depth)
    _check_depth(depth + 1)
    decoded = {}
    for key, child in node.items():
        if key[:1] == "$":
            if key[1:2] != "$":
                raise SerializationError(f"the payload's tree holds an unknown key {key!r}")
            key = key[1:]
        decoded[key] = _decode(child, blobs, depth + 1)
    return decoded


def _decode_tagged(tag: str, value: Any, blobs: _BlobReader, depth: int) -> Any:
    if tag == "$array":
        return blobs.array(value, depth)
    if tag == "$tuple":
        _check_depth(depth + 1)
        if type(value) is not list:
            raise SerializationError(
                f"the payload's tree holds a malformed tuple: a {type(value).__name__}, not a list"
            )
        return tuple(_decode(child, blobs, depth + 1) for child in value)
    if tag == "$scalar":
        description, raw_hex = value
        dtype = _dtype(description, depth)
        raw = bytes.fromhex(raw_hex)
        if len(raw) != dtype.itemsize:
            raise SerializationError(f"the payload's tree holds a malformed scalar {value!r}")
        if dtype.itemsize == 0:
            return np.zeros(1, dtype)[0]
        return np.frombuffer(raw, dtype=dtype, count=1).copy()[0]
    if tag == "$int":
        return int(value, 16)
    if tag == "$float":
        return _NONFINITE[value]
    if tag == "$bytes":
        offset, size = value
        return blobs.slice(offset, size).tobytes()
    if tag == "$complex":
        real, imag = (_decode(part, blobs, depth) for part in value)
        if type(real) is not float or type(imag) is not float:
            raise SerializationError(f"the payload's tree holds a malformed complex {value!r}")
        return complex(real, imag)
    raise SerializationError(f"the payload's tree holds an unknown tag {tag!r}")


def _dtype(description: Any, depth: int) -> np.dtype:
    """The dtype a tree describes; ``depth`` levels hold it."""
    if type(description) in (list, dict):
        _check_depth(depth + 1)
    if type(description) is str:
        dtype = np.dtype(description)
    elif type(description) is list:
        base, shape = description
        dtype = np.dtype((_dtype(base, depth + 1), tuple(shape)))
    elif type(description) is dict:
        fields = dict(description)
        fields["formats"] = [_dtype(item, depth + 1) for item in fields["formats"]]
        dtype = np.dtype(fields)
    else:
        raise SerializationError(f"the payload's tree holds a malformed dtype {description!r}")
    if dtype.hasobject:
        raise SerializationError(f"the payload's tree holds an object dtype {description!r}")
    return dtype
