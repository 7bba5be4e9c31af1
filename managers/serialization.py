"""A lossless codec for structures: :func:`dumps` a structure to bytes, :func:`loads` it back.

What round-trips exactly: dicts with ``str`` keys (in their order, never sorted), lists,
tuples, ``int`` of any size, ``float`` (``nan``, ``inf``, ``-inf``, ``-0.0`` included),
``complex``, ``bool``, ``None``, ``str``, ``bytes``, numpy scalars (their dtype kept:
``np.float32(1.5)`` comes back as ``np.float32``) and numpy arrays of any non-object
dtype and shape (0-d and empty, bool, complex, ``U``, ``S``, datetime64, timedelta64,
structured, big-endian; C- or Fortran-ordered, non-contiguous ones are stored as C).
Other objects with ``__array__`` (TF and JAX tensors) are stored as numpy arrays.

Loading never imports a class by name nor executes code (there is no pickle anywhere),
so the classes of a structure's containers are not stored: without a template,
NamedTuples come back as tuples and dataclasses (and dict subclasses) as dicts. Given a
``structure`` template, :func:`loads` rebuilds the template's container types, like
:func:`managers.structure.unflatten`; a ``None`` in a template leaves that subtree as
decoded.

A leaf that cannot be stored (an object-dtype array, an arbitrary object, a ``str``
subclass) raises ``TypeError`` naming its path: ``cannot store leaf at 'optimizer/step':
...``. Data that cannot be read back raises :class:`SerializationError`.

Format, version 1 (integers little-endian)::

    offset  size  field
    0       8     magic b"\\x89PLC\\r\\n\\x1a\\n"
    8       4     format version, uint32 (1)
    12      4     CRC-32C of every byte from offset 16 to the end, uint32
    16      8     tree length T, uint64
    24      8     blob section length B, uint64
    32      T     the tree: JSON (UTF-8)
                  zero bytes up to the next multiple of 16
            B     the blob section: the raw bytes of arrays and of ``bytes`` leaves;
                  each array starts at a multiple of 16 from the section's start

In the tree, dicts are JSON objects in their order (a key that starts with ``$`` is
written with one more ``$``), lists are JSON arrays, and ``str``, ``bool``, ``None``,
finite floats and ints that fit in 64 bits are themselves. Every other value is an
object with a single ``$``-key::

    {"$tuple": [item, ...]}                  tuple and NamedTuple
    {"$int": "-0x1f..."}                     int beyond 64 bits, in hex
    {"$float": "nan" | "inf" | "-inf"}
    {"$complex": [real, imag]}               each a float as above
    {"$bytes": [offset, length]}             a slice of the blob section
    {"$array": [dtype, shape, offset, "C" | "F"]}
    {"$scalar": [dtype, "hex of the value's bytes"]}

A dtype is its ``dtype.str`` (``"<f4"``, ``">i8"``, ``"<M8[ns]"``, ``"<U5"``), or for a
structured dtype an object ``{"names", "formats", "offsets", "itemsize"}`` whose formats
are dtypes in turn (a subarray field is ``[dtype, shape]``).
"""

from __future__ import annotations

import dataclasses
import math
import struct
from typing import Any

import crc32c
import numpy as np
import orjson

from managers.exceptions import ManagerError
from managers.structure import reshape

__all__ = ["FORMAT_VERSION", "SerializationError", "dumps", "dumps_buffers", "loads"]

FORMAT_VERSION = 1

_MAGIC = b"\x89PLC\r\n\x1a\n"
_HEADER = struct.Struct("<8sII")  # magic, format version, checksum
_LENGTHS = struct.Struct("<QQ")  # tree length, blob section length
_HEADER_SIZE = _HEADER.size + _LENGTHS.size
_ALIGN = 16
_ZEROS = bytes(_ALIGN)
_INT64_MIN = -(2**63)
_INT64_MAX = 2**63 - 1
_NONFINITE = {"nan": math.nan, "inf": math.inf, "-inf": -math.inf}


class SerializationError(ManagerError):
    """Data that cannot be decoded: not a payload of this codec, an unknown format
    version, a checksum mismatch (damaged bytes) or a truncated payload."""


def dumps(structure: Any) -> bytes:
    """``structure`` encoded as one ``bytes`` payload.

    Raises:
        TypeError: a leaf cannot be stored, or a dict key is not a ``str`` (the message
            names its path).
    """
    return b"".join(dumps_buffers(structure))


def dumps_buffers(structure: Any) -> list[memoryview]:
    """The payload of :func:`dumps` as a list of buffers, without copying any array.

    The buffers concatenated are exactly ``dumps(structure)``. Arrays that are C- or
    Fortran-contiguous are referenced, not copied, so write the buffers out (e.g. with
    ``os.writev`` or ``file.write`` one by one) before mutating ``structure``: the
    checksum was computed when this function returned.

    Raises:
        TypeError: as :func:`dumps`.
    """
    blobs = _Blobs()
    try:
        tree = _encode(structure, blobs)
    except _Unstorable as error:
        raise TypeError(error.message()) from None
    try:
        tree_bytes = orjson.dumps(tree)
    except orjson.JSONEncodeError as error:
        raise TypeError(f"cannot store the structure: it nests too deeply ({error})") from None
    body = [
        memoryview(_LENGTHS.pack(len(tree_bytes), blobs.size)),
        memoryview(tree_bytes),
        memoryview(_ZEROS)[: -len(tree_bytes) % _ALIGN],
        *blobs.buffers,
    ]
    checksum = 0
    for buffer in body:
        checksum = crc32c.crc32c(buffer, checksum)
    return [memoryview(_HEADER.pack(_MAGIC, FORMAT_VERSION, checksum)), *body]


def loads(data: bytes | bytearray | memoryview | np.ndarray, structure: Any = None) -> Any:
    """The structure encoded in ``data`` (``bytes`` or any buffer), shaped like
    ``structure`` when given.

    When ``data`` is a writable buffer (a ``bytearray``, a uint8 numpy array), the
    arrays returned are views into it, which saves a copy: do not reuse ``data`` then.
    From read-only data (``bytes``) every array is a fresh, writable copy.

    Raises:
        SerializationError: ``data`` is not a payload of this codec, has an unknown
            format version, is truncated or damaged (its checksum does not match).
        ValueError: ``structure`` holds fewer or more leaves than the stored value.
    """
    view = memoryview(data).cast("B")
    tree, blobs = _verified_sections(view)
    try:
        decoded = _decode(orjson.loads(tree), blobs)
    except SerializationError:
        raise
    except (orjson.JSONDecodeError, TypeError, ValueError, KeyError, IndexError) as error:
        raise SerializationError(f"the payload's tree is malformed: {error}") from None
    if structure is None:
        return decoded
    return reshape(structure, decoded)


# Encoding.


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


class _Blobs:
    """The blob section being built: buffers in order and their total size."""

    def __init__(self) -> None:
        self.buffers: list[memoryview] = []
        self.size = 0

    def add(self, buffer: memoryview, align: int) -> int:
        padding = -self.size % align
        if padding:
            self.buffers.append(memoryview(_ZEROS)[:padding])
            self.size += padding
        offset = self.size
        self.buffers.append(buffer)
        self.size += buffer.nbytes
        return offset


def _encode(node: Any, blobs: _Blobs) -> Any:
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
        return _encode_dict(node, blobs)
    if kind is list:
        return _encode_items(node, blobs)
    if kind is np.ndarray:
        return _encode_array(node, blobs)
    if isinstance(node, np.generic):
        return _encode_scalar(node)
    if isinstance(node, tuple):
        return {"$tuple": _encode_items(node, blobs)}
    if isinstance(node, dict):
        return _encode_dict(node, blobs)
    if dataclasses.is_dataclass(node) and not isinstance(node, type):
        fields = {field.name: getattr(node, field.name) for field in dataclasses.fields(node)}
        return _encode_dict(fields, blobs)
    if kind is bytes:
        return {"$bytes": [blobs.add(memoryview(node), 1), len(node)]}
    if kind is complex:
        return {"$complex": [_encode(node.real, blobs), _encode(node.imag, blobs)]}
    return _encode_other(node, blobs)


def _encode_other(node: Any, blobs: _Blobs) -> Any:
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
        return _encode_array(array, blobs)
    raise _Unstorable(
        "leaf",
        f"objects of type {kind.__module__}.{kind.__qualname__} cannot be stored; "
        "leaves are int, float, complex, bool, None, str, bytes, numpy scalars and arrays",
    )


def _encode_dict(items: dict[str, Any], blobs: _Blobs) -> dict[str, Any]:
    encoded = {}
    for key, child in items.items():
        if type(key) is not str:
            raise _Unstorable("dict", f"its keys must be str, found {type(key).__name__} {key!r}")
        if not key.isascii():
            _check_utf8(key, "dict")
        try:
            encoded[f"${key}" if key[:1] == "$" else key] = _encode(child, blobs)
        except _Unstorable as error:
            error.keys.append(key)
            raise
    return encoded


def _encode_items(items: list[Any] | tuple[Any, ...], blobs: _Blobs) -> list[Any]:
    encoded = []
    for index, child in enumerate(items):
        try:
            encoded.append(_encode(child, blobs))
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


def _encode_array(array: np.ndarray, blobs: _Blobs) -> dict[str, list[Any]]:
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
        offset = blobs.add(raw, _ALIGN)
    shape = list(array.shape[::-1] if order == "F" else array.shape)
    return {"$array": [_describe(array.dtype), shape, offset, order]}


def _encode_scalar(scalar: np.generic) -> dict[str, list[Any]]:
    array = np.asarray(scalar)
    if array.dtype.hasobject:
        raise _Unstorable("leaf", f"numpy scalars of dtype {array.dtype} cannot be stored")
    return {"$scalar": [_describe(array.dtype), array.tobytes().hex()]}


def _describe(dtype: np.dtype) -> Any:
    if dtype.fields is not None:
        names = list(dtype.names)
        description: dict[str, Any] = {
            "names": names,
            "formats": [_describe(dtype.fields[name][0]) for name in names],
            "offsets": [dtype.fields[name][1] for name in names],
            "itemsize": dtype.itemsize,
        }
        titles = [dtype.fields[name][2] if len(dtype.fields[name]) > 2 else None for name in names]
        if any(title is not None for title in titles):
            description["titles"] = titles
        return description
    if dtype.subdtype is not None:
        base, shape = dtype.subdtype
        return [_describe(base), list(shape)]
    return dtype.str


# Decoding.


def _verified_sections(view: memoryview) -> tuple[memoryview, _BlobReader]:
    """The tree and the blob section of a payload whose header and checksum are valid."""
    if view.nbytes < len(_MAGIC):
        if _MAGIC.startswith(view.tobytes()):
            raise SerializationError(
                f"the payload is truncated: {view.nbytes} bytes, shorter than its header"
            )
        raise SerializationError("the data is not a programlogic payload (wrong magic bytes)")
    if view[: len(_MAGIC)] != _MAGIC:
        raise SerializationError(
            f"the data is not a programlogic payload: it starts with "
            f"{view[: len(_MAGIC)].tobytes()!r}, not {_MAGIC!r}"
        )
    if view.nbytes < _HEADER_SIZE:
        raise SerializationError(
            f"the payload is truncated: {view.nbytes} bytes, shorter than its "
            f"{_HEADER_SIZE}-byte header"
        )
    _, version, stored_checksum = _HEADER.unpack_from(view)
    if version != FORMAT_VERSION:
        raise SerializationError(
            f"the payload has format version {version}, but this library reads version "
            f"{FORMAT_VERSION}"
        )
    tree_size, blob_size = _LENGTHS.unpack_from(view, _HEADER.size)
    blob_start = _HEADER_SIZE + tree_size + (-tree_size % _ALIGN)
    expected = blob_start + blob_size
    if view.nbytes != expected:
        problem = "truncated" if view.nbytes < expected else "longer than its header says"
        raise SerializationError(
            f"the payload is {problem}: {view.nbytes} bytes, its header says {expected}"
        )
    checksum = crc32c.crc32c(view[_HEADER.size :])
    if checksum != stored_checksum:
        raise SerializationError(
            f"the payload is damaged: its CRC-32C is {checksum:#010x}, "
            f"the stored one {stored_checksum:#010x}"
        )
    tree = view[_HEADER_SIZE : _HEADER_SIZE + tree_size]
    return tree, _BlobReader(view[blob_start:])


class _BlobReader:
    """Slices of the blob section; arrays are views when the section is writable."""

    def __init__(self, section: memoryview) -> None:
        self.section = section

    def slice(self, offset: Any, size: int) -> memoryview:
        if type(offset) is not int or offset < 0 or offset + size > self.section.nbytes:
            raise SerializationError(
                f"the payload's tree points outside its blob section (offset {offset!r}, "
                f"{size} bytes, section of {self.section.nbytes} bytes)"
            )
        return self.section[offset : offset + size]

    def array(self, payload: Any) -> np.ndarray:
        description, shape, offset, order = payload
        dtype = _dtype(description)
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


def _decode(node: Any, blobs: _BlobReader) -> Any:
    kind = type(node)
    if kind is list:
        return [_decode(child, blobs) for child in node]
    if kind is not dict:
        return node
    if len(node) == 1:
        ((key, value),) = node.items()
        if key[:1] == "$" and key[1:2] != "$":
            return _decode_tagged(key, value, blobs)
    decoded = {}
    for key, child in node.items():
        if key[:1] == "$":
            if key[1:2] != "$":
                raise SerializationError(f"the payload's tree holds an unknown key {key!r}")
            key = key[1:]
        decoded[key] = _decode(child, blobs)
    return decoded


def _decode_tagged(tag: str, value: Any, blobs: _BlobReader) -> Any:
    if tag == "$array":
        return blobs.array(value)
    if tag == "$tuple":
        return tuple(_decode(child, blobs) for child in value)
    if tag == "$scalar":
        description, raw_hex = value
        dtype = _dtype(description)
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
        real, imag = (_decode(part, blobs) for part in value)
        if type(real) is not float or type(imag) is not float:
            raise SerializationError(f"the payload's tree holds a malformed complex {value!r}")
        return complex(real, imag)
    raise SerializationError(f"the payload's tree holds an unknown tag {tag!r}")


def _dtype(description: Any) -> np.dtype:
    if type(description) is str:
        dtype = np.dtype(description)
    elif type(description) is list:
        base, shape = description
        dtype = np.dtype((_dtype(base), tuple(shape)))
    elif type(description) is dict:
        fields = dict(description)
        fields["formats"] = [_dtype(item) for item in fields["formats"]]
        dtype = np.dtype(fields)
    else:
        raise SerializationError(f"the payload's tree holds a malformed dtype {description!r}")
    if dtype.hasobject:
        raise SerializationError(f"the payload's tree holds an object dtype {description!r}")
    return dtype
