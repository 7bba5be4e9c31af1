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

Limits: a structure nests at most :data:`MAX_DEPTH` (100) levels deep and holds at most
:data:`MAX_NODES` (1,000,000) values, an array counting as one. Both :func:`dumps` and
:func:`loads` enforce them, raising :class:`SerializationError` (naming the path on
``dumps``): a crafted payload, its checksum valid, can neither exhaust the stack
(``RecursionError``) nor make ``loads`` build an unbounded number of objects.

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

import struct
from typing import Any

import crc32c
import numpy as np
import orjson

from managers._serialization_tree import ALIGN, MAX_DEPTH, MAX_NODES, ZEROS, decode, encode
from managers.exceptions import NewerFormatError, SerializationError
from managers.structure import reshape

__all__ = [
    "FORMAT_VERSION",
    "HEADER_SIZE",
    "MAX_DEPTH",
    "MAX_NODES",
    "NewerFormatError",
    "SerializationError",
    "dumps",
    "dumps_buffers",
    "loads",
    "payload_size",
]

FORMAT_VERSION = 1
"""The version of the format this module writes, in every payload's header."""

_MAGIC = b"\x89PLC\r\n\x1a\n"
_HEADER = struct.Struct("<8sII")  # magic, format version, checksum
_LENGTHS = struct.Struct("<QQ")  # tree length, blob section length

HEADER_SIZE = _HEADER.size + _LENGTHS.size
"""The size of a payload's header, which :func:`payload_size` reads."""


def dumps(structure: Any) -> bytes:
    """``structure`` encoded as one ``bytes`` payload.

    Raises:
        TypeError: a leaf cannot be stored, or a dict key is not a ``str`` (the message
            names its path).
        SerializationError: the structure is beyond :data:`MAX_DEPTH` or
            :data:`MAX_NODES` (the message names the path where).
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
    tree, blobs = encode(structure)
    tree_bytes = orjson.dumps(tree)  # MAX_DEPTH keeps the tree within orjson's nesting limit
    body = [
        memoryview(_LENGTHS.pack(len(tree_bytes), blobs.size)),
        memoryview(tree_bytes),
        memoryview(ZEROS)[: -len(tree_bytes) % ALIGN],
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
            format version, is truncated or damaged (its checksum does not match), or
            holds a structure beyond :data:`MAX_DEPTH` or :data:`MAX_NODES`; its subclass
            :class:`NewerFormatError` when ``data`` is in a newer format version.
        ValueError: ``structure`` holds fewer or more leaves than the stored value.
    """
    view = memoryview(data).cast("B")
    tree, section = _verified_sections(view)
    try:
        decoded = decode(orjson.loads(tree), section)
    except SerializationError:
        raise
    except (orjson.JSONDecodeError, TypeError, ValueError, KeyError, IndexError) as error:
        raise SerializationError(f"the payload's tree is malformed: {error}") from None
    if structure is None:
        return decoded
    return reshape(structure, decoded)


def payload_size(header: bytes | bytearray | memoryview) -> int:
    """The size in bytes of the payload that starts with ``header``, its first
    :data:`HEADER_SIZE` bytes: read a file's header, and its size tells whether the rest
    can be its payload before a buffer for it is allocated.

    Raises:
        NewerFormatError: the payload is in a format version newer than
            :data:`FORMAT_VERSION` (a SerializationError too).
        SerializationError: ``header`` is not the start of a payload of this codec (its
            magic bytes), is shorter than :data:`HEADER_SIZE` bytes, or has an unknown
            format version.
    """
    view = memoryview(header).cast("B")
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
    if view.nbytes < HEADER_SIZE:
        raise SerializationError(
            f"the payload is truncated: {view.nbytes} bytes, shorter than its "
            f"{HEADER_SIZE}-byte header"
        )
    _, version, _ = _HEADER.unpack_from(view)
    if version > FORMAT_VERSION:
        raise NewerFormatError(
            f"the payload has format version {version}, newer than the format version "
            f"{FORMAT_VERSION} this library reads: a newer programlogic wrote it, and reads it",
            version,
            FORMAT_VERSION,
        )
    if version != FORMAT_VERSION:
        raise SerializationError(
            f"the payload has format version {version}, but this library reads version "
            f"{FORMAT_VERSION}"
        )
    tree_size, blob_size = _LENGTHS.unpack_from(view, _HEADER.size)
    return _blob_start(tree_size) + blob_size


def _blob_start(tree_size: int) -> int:
    return HEADER_SIZE + tree_size + (-tree_size % ALIGN)


def _verified_sections(view: memoryview) -> tuple[memoryview, memoryview]:
    """The tree and the blob section of a payload whose header and checksum are valid."""
    expected = payload_size(view[:HEADER_SIZE])
    if view.nbytes != expected:
        problem = "truncated" if view.nbytes < expected else "longer than its header says"
        raise SerializationError(
            f"the payload is {problem}: {view.nbytes} bytes, its header says {expected}"
        )
    _, _, stored_checksum = _HEADER.unpack_from(view)
    checksum = crc32c.crc32c(view[_HEADER.size :])
    if checksum != stored_checksum:
        raise SerializationError(
            f"the payload is damaged: its CRC-32C is {checksum:#010x}, "
            f"the stored one {stored_checksum:#010x}"
        )
    tree_size, _ = _LENGTHS.unpack_from(view, _HEADER.size)
    return view[HEADER_SIZE : HEADER_SIZE + tree_size], view[_blob_start(tree_size) :]
