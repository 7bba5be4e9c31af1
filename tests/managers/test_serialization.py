"""The lossless codec: round trips, templates, refused leaves and damaged payloads."""

from __future__ import annotations

import collections
import dataclasses
import math
import struct
from typing import Any, NamedTuple

import crc32c
import hypothesis.extra.numpy as hnp
import numpy as np
import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from managers.exceptions import ManagerError
from managers.serialization import (
    FORMAT_VERSION,
    HEADER_SIZE,
    MAX_DEPTH,
    MAX_NODES,
    SerializationError,
    dumps,
    dumps_buffers,
    loads,
    payload_size,
)

pytestmark = pytest.mark.anyio

MAGIC = b"\x89PLC\r\n\x1a\n"


class Weights(NamedTuple):
    kernel: Any
    bias: Any


@dataclasses.dataclass
class Optimizer:
    lr: Any
    step: Any


def assert_same(actual: Any, expected: Any, path: str = "") -> None:
    """``actual`` equals ``expected`` exactly: types, dtypes, shapes, key order, the bits
    of floats (nan equals nan, -0.0 differs from 0.0)."""
    assert type(actual) is type(expected), f"{path}: {type(actual)} is not {type(expected)}"
    if isinstance(expected, dict):
        assert list(actual) == list(expected), f"{path}: keys {list(actual)} != {list(expected)}"
        for key in expected:
            assert_same(actual[key], expected[key], f"{path}/{key}")
    elif isinstance(expected, list | tuple):
        assert len(actual) == len(expected), f"{path}: lengths differ"
        for index, (left, right) in enumerate(zip(actual, expected, strict=True)):
            assert_same(left, right, f"{path}/{index}")
    elif isinstance(expected, np.ndarray):
        assert actual.dtype == expected.dtype, f"{path}: dtype {actual.dtype} != {expected.dtype}"
        assert actual.shape == expected.shape, f"{path}: shape {actual.shape} != {expected.shape}"
        if expected.dtype.names is not None:  # compared by field: padding bytes are noise
            for name in expected.dtype.names:
                assert_same(actual[name], expected[name], f"{path}[{name!r}]")
            return
        if expected.dtype.kind in "fcmM":
            assert np.array_equal(actual, expected, equal_nan=True), path
        elif expected.dtype.kind in "biuUS":
            assert np.array_equal(actual, expected), path
        assert np.ascontiguousarray(actual).tobytes() == np.ascontiguousarray(expected).tobytes()
    elif isinstance(expected, np.generic):
        assert actual.dtype == expected.dtype, f"{path}: dtype {actual.dtype} != {expected.dtype}"
        assert np.asarray(actual).tobytes() == np.asarray(expected).tobytes(), path
    elif isinstance(expected, float):
        assert struct.pack("<d", actual) == struct.pack("<d", expected) or (
            math.isnan(actual) and math.isnan(expected)
        ), f"{path}: {actual!r} != {expected!r}"
    elif isinstance(expected, complex):
        assert_same(actual.real, expected.real, f"{path}.real")
        assert_same(actual.imag, expected.imag, f"{path}.imag")
    else:
        assert actual == expected, f"{path}: {actual!r} != {expected!r}"


def round_trip(value: Any, structure: Any = None) -> Any:
    """``value`` through the codec, loaded from bytes and from a writable buffer alike."""
    payload = dumps(value)
    from_bytes = loads(payload, structure)
    from_buffer = loads(bytearray(payload), structure)
    assert_same(from_buffer, from_bytes)
    return from_bytes


# Hypothesis strategies: every kind of leaf, nested in dicts, lists and tuples.

dtypes = st.one_of(
    hnp.boolean_dtypes(),
    hnp.integer_dtypes(endianness="?"),
    hnp.unsigned_integer_dtypes(endianness="?"),
    hnp.floating_dtypes(endianness="?"),
    hnp.complex_number_dtypes(endianness="?"),
    hnp.datetime64_dtypes(endianness="?"),
    hnp.timedelta64_dtypes(endianness="?"),
    hnp.unicode_string_dtypes(endianness="?", min_len=1, max_len=4),
    hnp.byte_string_dtypes(min_len=1, max_len=4),
    hnp.array_dtypes(
        hnp.scalar_dtypes() | hnp.byte_string_dtypes(min_len=1, max_len=3),
        max_size=3,
        allow_subarrays=True,
    ),
)


@st.composite
def numpy_arrays(draw: st.DrawFn) -> np.ndarray:
    dtype = draw(dtypes)
    shape = draw(hnp.array_shapes(min_dims=0, max_dims=3, min_side=0, max_side=4))
    array = draw(hnp.arrays(dtype, shape))
    layout = draw(st.sampled_from(["c", "fortran", "strided", "reversed"]))
    if layout == "fortran":
        array = np.asfortranarray(array)
    elif layout == "strided" and array.ndim:
        array = np.concatenate([array, array], axis=0)[::2]
    elif layout == "reversed" and array.ndim:
        array = array[::-1]
    return array


numpy_scalars = numpy_arrays().filter(lambda array: array.size > 0).map(lambda a: a.flat[0])

leaves = st.one_of(
    st.integers(),
    st.integers(min_value=-(2**300), max_value=2**300),
    st.sampled_from([2**63 - 1, 2**63, -(2**63), -(2**63) - 1, 2**64]),
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from([math.nan, math.inf, -math.inf, -0.0, 0.0, 5e-324]),
    st.complex_numbers(allow_nan=True, allow_infinity=True),
    st.text(max_size=8),
    st.binary(max_size=8),
    st.booleans(),
    st.none(),
    numpy_arrays(),
    numpy_scalars,
)

keys = st.text(max_size=5) | st.sampled_from(["$", "$$", "$array", "$tuple", "$$int", ""])

structures = st.recursive(
    leaves,
    lambda children: st.one_of(
        st.lists(children, max_size=3),
        st.lists(children, max_size=3).map(tuple),
        st.dictionaries(keys, children, max_size=3),
    ),
    max_leaves=12,
)


@settings(max_examples=100, deadline=None)
@given(structures)
async def test_round_trip_is_lossless(value):
    assert_same(round_trip(value), value)


@settings(max_examples=50, deadline=None)
@given(numpy_arrays())
async def test_array_round_trip_keeps_dtype_shape_and_bits(array):
    loaded = round_trip({"array": array})["array"]
    assert_same(loaded, array)
    assert loaded.flags.writeable


# Round trips of specific values.


@pytest.mark.parametrize(
    "value",
    [
        2**64,
        -(2**200),
        10**5000,  # beyond int("...")'s default digit limit
        math.nan,
        math.inf,
        -math.inf,
        -0.0,
        1.0,
        5e-324,
        complex(math.nan, -math.inf),
        True,
        1,
        None,
        "",
        "text with ünïcode and \x00",
        b"",
        b"\x00\xff bytes",
    ],
    ids=lambda value: f"int-{value.bit_length()}-bits" if type(value) is int else repr(value),
)
async def test_python_leaves_keep_their_value_and_type(value):
    assert_same(round_trip(value), value)


async def test_str_stays_str_and_bytes_stay_bytes():
    loaded = round_trip({"s": "abc", "b": b"abc"})
    assert type(loaded["s"]) is str
    assert type(loaded["b"]) is bytes


async def test_dict_key_order_is_kept_not_sorted():
    value = {"b": 1, "a": {"z": 2, "y": 3, "x": [{"m": 1, "c": 2}]}}
    loaded = round_trip(value)
    assert list(loaded) == ["b", "a"]
    assert list(loaded["a"]) == ["z", "y", "x"]
    assert list(loaded["a"]["x"][0]) == ["m", "c"]


async def test_keys_that_look_like_tags_are_plain_keys():
    value = {"$array": 1, "$tuple": [1], "$$bytes": b"x", "$": None, "": {"$int": "0x1"}}
    assert_same(round_trip(value), value)


@pytest.mark.parametrize(
    "scalar",
    [
        np.float32(1.5),
        np.float16(-0.0),
        np.float64(math.nan),
        np.longdouble(1) / 3,
        np.int8(-5),
        np.uint64(2**64 - 1),
        np.bool_(True),
        np.complex64(1 - 2j),
        np.datetime64("2024-02-29T12:00", "m"),
        np.timedelta64(7, "D"),
        np.datetime64("NaT"),
        np.str_("hé"),
        np.bytes_(b"\x01\x02"),
        np.zeros(1, dtype=[("a", "<i4"), ("b", ">f8", (2,))])[0],
    ],
    ids=lambda scalar: type(scalar).__name__ + "-" + str(scalar.dtype),
)
async def test_numpy_scalars_keep_their_type(scalar):
    loaded = round_trip({"x": scalar})["x"]
    assert type(loaded) is type(scalar)
    assert_same(loaded, scalar)


@pytest.mark.parametrize(
    "array",
    [
        np.array(3.5),
        np.array(7, dtype=">i8"),
        np.zeros((0,), np.float32),
        np.zeros((3, 0, 2), np.int16),
        np.array([True, False]),
        np.array([1 + 2j, math.nan], dtype=np.complex128),
        np.array(["a", "ünï", ""]),
        np.array([b"a", b"\x00b"]),
        np.array(["2024-01-01", "NaT"], dtype="datetime64[ns]"),
        np.array([1, -1], dtype="timedelta64[s]"),
        np.arange(12, dtype=">f4").reshape(3, 4),
        np.arange(12, dtype=np.float64).reshape(3, 4).T,
        np.arange(24, dtype=np.int32).reshape(2, 3, 4)[:, ::2, 1:],
        np.zeros(2, dtype=[("x", "<f8"), ("label", "S3"), ("grid", "<i2", (2, 2))]),
        np.zeros(2, dtype=np.dtype({"names": ["a"], "formats": ["<i4"], "itemsize": 16})),
    ],
    ids=lambda array: f"{array.dtype}-{array.shape}",
)
async def test_arrays_keep_dtype_shape_and_values(array):
    assert_same(round_trip({"a": array})["a"], array)


async def test_fortran_arrays_stay_fortran_ordered():
    array = np.asfortranarray(np.arange(6.0).reshape(2, 3))
    loaded = round_trip(array)
    assert loaded.flags.f_contiguous and not loaded.flags.c_contiguous
    assert_same(loaded, array)


async def test_objects_with_array_interface_are_stored_as_arrays():
    class Tensor:
        def __array__(self, dtype=None, copy=None):
            return np.arange(3, dtype=np.int16)

    assert_same(round_trip({"t": Tensor()})["t"], np.arange(3, dtype=np.int16))


async def test_loaded_arrays_are_writable_and_independent():
    payload = dumps({"a": np.arange(3.0), "b": np.arange(3.0)})
    for data in (payload, bytearray(payload)):
        loaded = loads(data)
        loaded["a"][0] = 100.0
        assert loaded["b"][0] == 0.0
    assert loads(payload)["a"][0] == 0.0


# Containers without and with a template.


async def test_without_template_namedtuples_become_tuples_and_dataclasses_dicts():
    value = {
        "weights": Weights(kernel=np.ones(2), bias=0.5),
        "optimizer": Optimizer(lr=0.1, step=3),
        "ordered": collections.OrderedDict(b=1, a=2),
    }
    loaded = round_trip(value)
    assert type(loaded["weights"]) is tuple
    assert_same(loaded["weights"], (np.ones(2), 0.5))
    assert_same(loaded["optimizer"], {"lr": 0.1, "step": 3})
    assert_same(loaded["ordered"], {"b": 1, "a": 2})


async def test_template_gives_namedtuple_dataclass_and_tuple_types():
    value = {
        "weights": Weights(kernel=[np.float32(1), np.float32(2)], bias=np.zeros(3)),
        "optimizer": Optimizer(lr=0.1, step=np.int64(3)),
        "pair": (1, (2, "three")),
    }
    template = {
        "weights": Weights(kernel=[0, 0], bias=None),
        "optimizer": Optimizer(lr=0.0, step=0),
        "pair": (0, (0, "")),
    }
    loaded = round_trip(value, template)
    assert_same(loaded, value)
    assert type(loaded["weights"]) is Weights
    assert type(loaded["optimizer"]) is Optimizer
    assert template["optimizer"] == Optimizer(lr=0.0, step=0)


async def test_template_at_the_root():
    assert_same(round_trip([1.0, 2.0], Weights(0, 0)), Weights(1.0, 2.0))
    assert_same(round_trip({"lr": 0.5, "step": 2}, Optimizer(0, 0)), Optimizer(0.5, 2))
    assert_same(round_trip([1, [2, 3]], (0, (0, 0))), (1, (2, 3)))


async def test_template_dict_subclasses_give_their_type():
    template = collections.defaultdict(list, a=0, b=0)
    loaded = round_trip({"a": 1, "b": 2}, template)
    assert type(loaded) is collections.defaultdict
    assert loaded.default_factory is list
    assert loaded == {"a": 1, "b": 2}


async def test_none_in_template_keeps_the_subtree_as_decoded():
    value = {"model": Weights(1, 2), "optimizer": {"lr": 0.1, "step": 4}}
    loaded = round_trip(value, {"model": None, "optimizer": Optimizer(0, 0)})
    assert_same(loaded, {"model": (1, 2), "optimizer": Optimizer(0.1, 4)})


async def test_template_with_other_leaf_count_raises_value_error():
    with pytest.raises(ValueError, match="leaves"):
        loads(dumps([1, 2, 3]), (0, 0))


# Values that cannot be stored.


class Opaque:
    pass


@pytest.mark.parametrize(
    ("value", "message"),
    [
        (
            {"optimizer": {"step": np.array([1, "a"], dtype=object)}},
            "cannot store leaf at 'optimizer/step': numpy arrays whose dtype holds Python objects",
        ),
        ({"optimizer": {"step": Opaque()}}, "cannot store leaf at 'optimizer/step': .*Opaque"),
        ([1, (2, {"x": Opaque()})], "cannot store leaf at '1/1/x'"),
        (Optimizer(lr=0.1, step=Opaque()), "cannot store leaf at 'step'"),
        (Opaque(), "cannot store leaf at the root"),
        ({"s": np.zeros(2, dtype=[("o", object)])}, "cannot store leaf at 's'"),
        ({"m": np.ma.masked_array([1, 2], mask=[0, 1])}, "at 'm': numpy array subclasses"),
        ({"b": bytearray(b"x")}, "at 'b': objects of type builtins.bytearray"),
        ({"e": type("MyStr", (str,), {})("x")}, "at 'e': subclasses of built-in types"),
        ({"u": "\ud800"}, "cannot store leaf at 'u': .* UTF-8"),
        ({"a": {1: "one"}}, "cannot store dict at 'a': its keys must be str, found int 1"),
        ({"\udc00": 1}, "cannot store dict at the root: .* UTF-8"),
    ],
    ids=[
        "object-array",
        "object",
        "nested-object",
        "dataclass-field",
        "root",
        "structured-object",
        "masked-array",
        "bytearray",
        "str-subclass",
        "surrogate",
        "int-key",
        "surrogate-key",
    ],
)
async def test_unstorable_values_raise_type_error_naming_the_path(value, message):
    with pytest.raises(TypeError, match=message):
        dumps(value)


def nested(kind: Any, depth: int) -> Any:
    """``depth`` containers of ``kind`` (list, tuple or dict), one in another."""
    value = kind()
    for _ in range(depth - 1):
        value = {"k": value} if kind is dict else kind([value])
    return value


@pytest.mark.parametrize("kind", [list, tuple, dict])
async def test_a_structure_as_deep_as_the_limit_round_trips(kind):
    value = nested(kind, MAX_DEPTH)
    assert loads(dumps(value)) == value


@pytest.mark.parametrize(("kind", "path"), [(list, "0/0/0"), (tuple, "0/0/0"), (dict, "k/k/k")])
async def test_a_structure_deeper_than_the_limit_raises_naming_the_path(kind, path):
    value = {"model": nested(kind, MAX_DEPTH)}  # the root dict is one level more
    with pytest.raises(SerializationError, match=f"^cannot store the structure at 'model/{path}"):
        dumps(value)
    with pytest.raises(SerializationError, match=f"nests deeper than {MAX_DEPTH} levels"):
        dumps(nested(kind, 300))


async def test_a_structured_dtype_counts_its_nesting():
    dtype = np.dtype("<f4")
    for _ in range(MAX_DEPTH):
        dtype = np.dtype([("f", dtype)])
    with pytest.raises(SerializationError, match="nests deeper"):
        dumps({"a": np.zeros(2, dtype)})


async def test_as_many_values_as_the_limit_round_trip_one_more_raises():
    values = [0] * (MAX_NODES - 1)  # and the list itself
    assert loads(dumps(values)) == values
    with pytest.raises(SerializationError, match=rf"at 'history/\d+': .*more than {MAX_NODES:,}"):
        dumps({"history": [0] * MAX_NODES})


# Payloads that cannot be read back.


PAYLOAD = dumps({"weights": np.arange(8, dtype=np.float32), "round": 3, "name": "x"})


async def test_serialization_error_is_a_manager_error():
    assert issubclass(SerializationError, ManagerError)


async def test_payload_starts_with_magic_and_format_version():
    assert PAYLOAD.startswith(MAGIC)
    assert struct.unpack_from("<I", PAYLOAD, 8) == (FORMAT_VERSION,)


async def test_dumps_buffers_concatenate_to_dumps_and_share_array_memory():
    weights = np.arange(1000, dtype=np.float32)
    buffers = dumps_buffers({"weights": weights})
    assert b"".join(buffers) == dumps({"weights": weights})
    assert any(np.shares_memory(np.frombuffer(buffer, np.uint8), weights) for buffer in buffers)


@pytest.mark.parametrize("size", [0, 3, 8, 12, 31, 32, 40, len(PAYLOAD) - 1])
async def test_truncated_payload_raises_serialization_error(size):
    with pytest.raises(SerializationError, match="truncated"):
        loads(PAYLOAD[:size])


async def test_trailing_bytes_raise_serialization_error():
    with pytest.raises(SerializationError, match="longer than its header says"):
        loads(PAYLOAD + b"\x00")


async def test_every_flipped_byte_raises_serialization_error():
    for position in range(len(PAYLOAD)):
        damaged = bytearray(PAYLOAD)
        damaged[position] ^= 0x40
        with pytest.raises(SerializationError):
            loads(bytes(damaged))


async def test_flipped_array_byte_is_reported_as_a_checksum_mismatch():
    damaged = bytearray(PAYLOAD)
    damaged[-5] ^= 0x01
    with pytest.raises(SerializationError, match="damaged: its CRC-32C"):
        loads(bytes(damaged))


@pytest.mark.parametrize(
    "data", [b"", b"PK\x03\x04" + bytes(40), b"\x93NUMPY" + bytes(40), b'{"json": 1}']
)
async def test_wrong_magic_raises_serialization_error(data):
    with pytest.raises(SerializationError, match=r"not a programlogic payload|truncated"):
        loads(data)


async def test_unknown_format_version_raises_serialization_error():
    newer = bytearray(PAYLOAD)
    struct.pack_into("<I", newer, 8, FORMAT_VERSION + 1)
    with pytest.raises(SerializationError, match=f"format version {FORMAT_VERSION + 1}"):
        loads(bytes(newer))


def forge(tree: Any, blobs: bytes = b"") -> bytes:
    """A payload with a valid checksum around any tree: what a hostile file could hold."""
    tree_bytes = orjson.dumps(tree)
    body = struct.pack("<QQ", len(tree_bytes), len(blobs)) + tree_bytes
    body += bytes(-len(tree_bytes) % 16) + blobs
    return struct.pack("<8sII", MAGIC, FORMAT_VERSION, crc32c.crc32c(body)) + body


async def test_forge_builds_what_dumps_builds():
    assert forge({"a": [1, "x"]}) == dumps({"a": [1, "x"]})


@pytest.mark.parametrize(
    ("tree", "blobs", "message"),
    [
        ({"$array": ["|O", [1], 0, "C"]}, bytes(8), "object dtype"),
        ({"$array": [[["x", "|O"]], [1], 0, "C"]}, bytes(8), "malformed|object"),
        ({"$scalar": ["|O", "00" * 8]}, b"", "object dtype"),
        ({"$array": ["<f8", [4], 0, "C"]}, bytes(8), "outside its blob section"),
        ({"$array": ["<f8", [-1], 0, "C"]}, bytes(8), "malformed array"),
        ({"$array": ["<f8", [1], 0, "X"]}, bytes(8), "malformed array"),
        ({"$array": ["not a dtype", [1], 0, "C"]}, bytes(8), "malformed"),
        ({"$bytes": [4, 10]}, bytes(8), "outside its blob section"),
        ({"$pickle": "gASVAAAAAAAAAAA="}, b"", "unknown tag '\\$pickle'"),
        ({"$int": "not hex"}, b"", "malformed"),
        ({"$float": "1.5"}, b"", "malformed"),
        ({"$complex": ["a", 1.0]}, b"", "malformed complex"),
        ({"a": 1, "$b": 2}, b"", "unknown key '\\$b'"),
    ],
    ids=[
        "object-array",
        "object-field",
        "object-scalar",
        "array-overflow",
        "negative-shape",
        "bad-order",
        "bad-dtype",
        "bytes-overflow",
        "unknown-tag",
        "bad-int",
        "bad-float",
        "bad-complex",
        "single-dollar-key",
    ],
)
async def test_malformed_trees_raise_serialization_error(tree, blobs, message):
    with pytest.raises(SerializationError, match=message):
        loads(forge(tree, blobs))


@pytest.mark.parametrize(
    "tree",
    [
        b"[" * 900 + b"]" * 900,
        b'{"$tuple": [' * 500 + b"]}" * 500,
        b'{"k": ' * 900 + b"1" + b"}" * 900,
        b'{"$array": [' * 1
        + b'{"names": ["f"], "formats": [' * 300
        + b'"<f4"'
        + b"]}" * 300
        + b', [1], 0, "C"]}',
    ],
    ids=["lists", "tuples", "dicts", "dtype"],
)
async def test_a_crafted_tree_deeper_than_the_limit_raises_serialization_error(tree):
    """A payload with a valid checksum may hold a tree nested as deep as JSON allows."""
    with pytest.raises(SerializationError, match=f"nests deeper than {MAX_DEPTH} levels"):
        loads(forge_bytes(tree))


async def test_a_crafted_tree_with_too_many_values_raises_serialization_error():
    with pytest.raises(SerializationError, match=f"more than {MAX_NODES:,} values"):
        loads(forge_bytes(b"[" + b"0," * MAX_NODES + b"0]"))


def forge_bytes(tree_bytes: bytes) -> bytes:
    """A payload with a valid checksum around tree bytes that orjson need not write."""
    body = struct.pack("<QQ", len(tree_bytes), 0) + tree_bytes + bytes(-len(tree_bytes) % 16)
    return struct.pack("<8sII", MAGIC, FORMAT_VERSION, crc32c.crc32c(body)) + body


async def test_payload_size_reads_the_size_from_the_header_alone():
    payload = dumps({"weights": np.arange(100.0)})
    assert payload_size(payload[:HEADER_SIZE]) == len(payload)
    with pytest.raises(SerializationError, match="not a programlogic payload"):
        payload_size(b"x" * HEADER_SIZE)
    with pytest.raises(SerializationError, match="truncated"):
        payload_size(payload[: HEADER_SIZE - 1])
