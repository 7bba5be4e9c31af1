"""JSONLinesReleaseManager beyond the shared contract: the file it writes, and resuming it."""

from __future__ import annotations

import dataclasses
import logging
import os
from pathlib import Path
from typing import Any, NamedTuple

import anyio
import numpy as np
import orjson
import pytest

from managers.release.jsonl import JSONLinesReleaseManager

pytestmark = pytest.mark.anyio


def records(path: Path) -> list[Any]:
    return [orjson.loads(line) for line in path.read_bytes().splitlines()]


def keys_and_values(path: Path) -> list[tuple[Any, Any]]:
    return [(record["key"], record["value"]) for record in records(path)]


async def release_all(path: Path, items: list[tuple[Any, Any]]) -> None:
    """Release ``(key, value)`` items with a new manager, as one run of a program."""
    async with JSONLinesReleaseManager(path) as manager:
        for key, value in items:
            await manager.release(value, key)


class Metrics(NamedTuple):
    loss: Any
    accuracy: Any


@dataclasses.dataclass
class Summary:
    rounds: int
    best: Metrics


class Tensor:
    """Something with ``__array__``, as TF and JAX tensors are."""

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        return np.array([[1, 2], [3, 4]], dtype=np.int32)


async def test_file_contents(tmp_path):
    path = tmp_path / "metrics.jsonl"
    async with JSONLinesReleaseManager(path) as manager:
        assert manager.file_path == path
        await manager.release({"train": {"loss": 0.5}, "weights": np.array([1.0, 2.0])}, 1)
        await manager.release("done", "status")
    assert path.read_bytes() == (
        b'{"key":1,"value":{"train":{"loss":0.5},"weights":[1.0,2.0]}}\n'
        b'{"key":"status","value":"done"}\n'
    )


async def test_parent_directories_are_created(tmp_path):
    path = tmp_path / "run" / "eval" / "metrics.jsonl"
    await release_all(path, [(0, 1)])
    assert path.read_bytes() == b'{"key":0,"value":1}\n'


async def test_structure_is_kept(tmp_path):
    path = tmp_path / "metrics.jsonl"
    value = {
        "metrics": Metrics(loss=0.5, accuracy=np.float32(0.25)),
        "summary": Summary(rounds=3, best=Metrics(0.1, 0.9)),
        "pair": (1, "two"),
        "nested": [{"a": None}, [True, False]],
    }
    await release_all(path, [(1, value)])
    assert records(path) == [
        {
            "key": 1,
            "value": {
                "metrics": [0.5, 0.25],
                "summary": {"rounds": 3, "best": [0.1, 0.9]},
                "pair": [1, "two"],
                "nested": [{"a": None}, [True, False]],
            },
        }
    ]


async def test_numpy_values(tmp_path):
    path = tmp_path / "metrics.jsonl"
    value = {
        "float32": np.float32(0.1),
        "int64": np.int64(-7),
        "bool": np.bool_(True),
        "matrix": np.arange(6, dtype=np.int16).reshape(2, 3),
        "strided": np.arange(6.0)[::2],
        "zero_d": np.array(2.5),
        "tensor": Tensor(),
    }
    await release_all(path, [(1, value)])
    assert path.read_bytes() == (
        b'{"key":1,"value":{"float32":0.1,"int64":-7,"bool":true,"matrix":[[0,1,2],[3,4,5]],'
        b'"strided":[0.0,2.0,4.0],"zero_d":2.5,"tensor":[[1,2],[3,4]]}}\n'
    )


async def test_nan_and_infinities_become_null(tmp_path):
    path = tmp_path / "metrics.jsonl"
    await release_all(path, [(1, {"nan": float("nan"), "inf": np.float32("inf")})])
    assert records(path) == [{"key": 1, "value": {"nan": None, "inf": None}}]


@pytest.mark.parametrize(
    ("leaf", "type_name"),
    [(b"raw", "bytes"), (1 + 2j, "complex"), (2**70, "int"), (np.array([1j]), "ndarray")],
    ids=["bytes", "complex", "big-int", "complex-array"],
)
async def test_unwritable_leaf_raises_type_error_naming_the_path(tmp_path, leaf, type_name):
    path = tmp_path / "metrics.jsonl"
    async with JSONLinesReleaseManager(path) as manager:
        await manager.release({"loss": 1.0}, 1)
        with pytest.raises(TypeError, match=rf"leaf at path 'model/extra', a {type_name}, cannot"):
            await manager.release({"loss": 2.0, "model": {"extra": leaf}}, 2)
    assert keys_and_values(path) == [(1, {"loss": 1.0})]


async def test_int_and_str_keys_stay_distinct_across_a_restart(tmp_path):
    path = tmp_path / "metrics.jsonl"
    await release_all(path, [(7, "int"), ("7", "str")])
    await release_all(path, [("7", "str!"), (7, "int!")])
    assert path.read_bytes() == b'{"key":7,"value":"int!"}\n{"key":"7","value":"str!"}\n'


async def test_new_key_is_appended_without_rewriting(tmp_path):
    path = tmp_path / "metrics.jsonl"
    async with JSONLinesReleaseManager(path) as manager:
        await manager.release({"loss": 1.0}, 1)
        inode = path.stat().st_ino
        before = path.read_bytes()
        for key in (2, 3):
            await manager.release({"loss": float(key)}, key)
            assert path.stat().st_ino == inode
        after = path.read_bytes()
    assert after == before + b'{"key":2,"value":{"loss":2.0}}\n{"key":3,"value":{"loss":3.0}}\n'


async def test_re_release_with_a_changed_value_rewrites_atomically(tmp_path):
    path = tmp_path / "metrics.jsonl"
    async with JSONLinesReleaseManager(path) as manager:
        for key in (1, 2, 3):
            await manager.release({"loss": float(key)}, key)
        inode = path.stat().st_ino
        await manager.release({"loss": 2.5}, 2)
        assert path.stat().st_ino != inode
        await manager.release({"loss": 4.0}, 4)
    assert keys_and_values(path) == [
        (1, {"loss": 1.0}),
        (2, {"loss": 2.5}),
        (3, {"loss": 3.0}),
        (4, {"loss": 4.0}),
    ]
    assert os.listdir(tmp_path) == ["metrics.jsonl"]


async def test_re_release_with_the_same_value_writes_nothing(tmp_path):
    path = tmp_path / "metrics.jsonl"
    async with JSONLinesReleaseManager(path) as manager:
        await manager.release({"loss": 1.0, "weights": np.ones(2)}, 1)
        os.utime(path, ns=(1_000_000_000, 1_000_000_000))
        inode = path.stat().st_ino
        await manager.release({"loss": 1.0, "weights": np.ones(2)}, 1)
        assert path.stat().st_mtime_ns == 1_000_000_000
        assert path.stat().st_ino == inode


async def test_resume_continues_the_same_file(tmp_path):
    path = tmp_path / "metrics.jsonl"
    await release_all(path, [(key, {"loss": float(key)}) for key in range(1, 11)])
    await release_all(path, [(key, {"loss": key * 10.0}) for key in range(6, 13)])
    assert keys_and_values(path) == [(key, {"loss": float(key)}) for key in range(1, 6)] + [
        (key, {"loss": key * 10.0}) for key in range(6, 13)
    ]


async def test_resume_with_keys_out_of_order_and_re_released(tmp_path):
    path = tmp_path / "metrics.jsonl"
    await release_all(path, [(key, f"a{key}") for key in (3, 1, 2, 5, 4)] + [(1, "b1"), (5, "b5")])
    assert keys_and_values(path) == [(3, "a3"), (1, "b1"), (2, "a2"), (5, "b5"), (4, "a4")]
    await release_all(path, [(7, "c7"), (2, "c2"), (6, "c6"), (7, "d7"), ("final", "e")])
    await release_all(path, [(6, "f6"), (3, "a3")])
    assert keys_and_values(path) == [
        (3, "a3"),
        (1, "b1"),
        (2, "c2"),
        (5, "b5"),
        (4, "a4"),
        (7, "d7"),
        (6, "f6"),
        ("final", "e"),
    ]


async def test_resume_appends_to_the_existing_file_without_rewriting(tmp_path):
    path = tmp_path / "metrics.jsonl"
    await release_all(path, [(1, 1.0), (2, 2.0)])
    inode = path.stat().st_ino
    await release_all(path, [(3, 3.0), (2, 2.0)])
    assert path.stat().st_ino == inode
    assert keys_and_values(path) == [(1, 1.0), (2, 2.0), (3, 3.0)]


async def test_invalid_line_raises_value_error_naming_it(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_bytes(b'{"key":1,"value":1}\nnot json\n')
    async with JSONLinesReleaseManager(path) as manager:
        with pytest.raises(ValueError, match=r"line 2 of .* is not JSON"):
            await manager.release(2, 2)
    assert path.read_bytes() == b'{"key":1,"value":1}\nnot json\n'


@pytest.mark.parametrize(
    "line",
    [b"[1, 2]", b'{"key": 1}', b'{"key": true, "value": 1}', b'{"key": 1.5, "value": 1}'],
    ids=["array", "no-value", "bool-key", "float-key"],
)
async def test_line_that_is_not_a_release_raises_value_error(tmp_path, line):
    path = tmp_path / "metrics.jsonl"
    path.write_bytes(line + b"\n")
    async with JSONLinesReleaseManager(path) as manager:
        with pytest.raises(ValueError, match=r'line 1 of .* is not an object with "key"'):
            await manager.release(2, 2)


async def test_unfinished_last_line_is_dropped_with_a_warning(tmp_path, caplog):
    path = tmp_path / "metrics.jsonl"
    path.write_bytes(b'{"key":1,"value":1}\n{"key":2,"val')
    with caplog.at_level(logging.WARNING, logger="managers.release.jsonl"):
        await release_all(path, [(3, 3)])
    assert "dropping the unfinished last line" in caplog.text
    assert path.read_bytes() == b'{"key":1,"value":1}\n{"key":3,"value":3}\n'


async def test_complete_last_line_without_line_end_is_kept(tmp_path, caplog):
    path = tmp_path / "metrics.jsonl"
    path.write_bytes(b'{"key":1,"value":1}\n{"key": 2, "value": 2}')
    with caplog.at_level(logging.WARNING, logger="managers.release.jsonl"):
        await release_all(path, [(3, 3)])
    assert caplog.text == ""
    assert (
        path.read_bytes() == b'{"key":1,"value":1}\n{"key": 2, "value": 2}\n{"key":3,"value":3}\n'
    )


async def test_file_read_with_a_key_twice_is_rewritten_by_an_unchanged_release(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_bytes(b'{"key":1,"value":1}\n{"key":1,"value":2}\n')
    await release_all(path, [(1, 2)])
    assert path.read_bytes() == b'{"key":1,"value":2}\n'


async def test_key_found_twice_in_the_file_keeps_its_last_line(tmp_path, caplog):
    path = tmp_path / "metrics.jsonl"
    path.write_bytes(b'{"key":1,"value":1}\n{"key":2,"value":2}\n\n{"key":1,"value":1.5}\n')
    with caplog.at_level(logging.WARNING, logger="managers.release.jsonl"):
        await release_all(path, [(3, 3)])
    assert "holds key 1 more than once" in caplog.text
    assert keys_and_values(path) == [(1, 1.5), (2, 2), (3, 3)]


async def test_aclose_lets_a_later_release_read_the_file_again(tmp_path):
    path = tmp_path / "metrics.jsonl"
    manager = JSONLinesReleaseManager(path)
    await manager.release(1, 1)
    await manager.aclose()
    with open(path, "ab") as file:
        file.write(b'{"key":2,"value":2}\n')
    await manager.release(3, 3)
    await manager.aclose()
    await manager.aclose()
    assert keys_and_values(path) == [(1, 1), (2, 2), (3, 3)]


async def test_concurrent_releases_and_re_releases(tmp_path):
    path = tmp_path / "metrics.jsonl"
    async with JSONLinesReleaseManager(path) as manager:
        async with anyio.create_task_group() as group:
            for key in range(40):
                group.start_soon(manager.release, {"loss": float(key)}, key % 20)
    held = dict(keys_and_values(path))
    assert len(records(path)) == 20
    assert sorted(held) == list(range(20))
    # Which of a key's two releases is called last depends on the scheduler (trio's varies).
    for key, value in held.items():
        assert value in ({"loss": float(key)}, {"loss": float(key + 20)})
