"""CSVFileReleaseManager beyond the shared contract: the file it writes, and resuming it."""

from __future__ import annotations

import csv
import logging
import os
from pathlib import Path
from typing import Any

import anyio
import numpy as np
import pytest

from managers.release.csv_file import CSVFileReleaseManager
from managers.testing import FakeValueReference

pytestmark = pytest.mark.anyio


def rows(path: Path) -> list[list[str]]:
    with open(path, encoding="utf-8", newline="") as file:
        return list(csv.reader(file))


def keys_and_losses(path: Path) -> list[tuple[str, str]]:
    header, *body = rows(path)
    assert header == ["key", "loss"]
    return [(key, loss) for key, loss in body]


async def release_all(path: Path, items: list[tuple[Any, Any]], **options: Any) -> None:
    """Release ``(key, value)`` items with a new manager, as one run of a program."""
    async with CSVFileReleaseManager(path, **options) as manager:
        for key, value in items:
            await manager.release(value, key)


async def test_file_contents(tmp_path):
    path = tmp_path / "metrics.csv"
    async with CSVFileReleaseManager(path) as manager:
        await manager.release({"client_work": {"train": {"loss": 0.5, "accuracy": 0.75}}}, 1)
        await manager.release({"client_work": {"train": {"loss": 0.25, "accuracy": 0.8125}}}, 2)
        await manager.release({"accuracy": 0.9}, "final")
    assert path.read_text(encoding="utf-8") == (
        "key,client_work/train/loss,client_work/train/accuracy,accuracy\n"
        "1,0.5,0.75,\n"
        "2,0.25,0.8125,\n"
        "final,,,0.9\n"
    )


async def test_file_path_and_parent_directories_are_created(tmp_path):
    path = tmp_path / "run" / "metrics" / "train.csv"
    manager = CSVFileReleaseManager(str(path))
    assert manager.file_path == path
    assert not path.parent.exists()  # nothing is written before the first release
    async with manager:
        await manager.release({"loss": 1.0}, 0)
    assert path.read_text(encoding="utf-8") == "key,loss\n0,1.0\n"


async def test_key_fieldname_names_the_first_column(tmp_path):
    path = tmp_path / "metrics.csv"
    await release_all(path, [(1, {"loss": 0.5})], key_fieldname="round")
    assert rows(path) == [["round", "loss"], ["1", "0.5"]]


@pytest.mark.parametrize(
    ("key_fieldname", "error", "found"),
    [("", ValueError, "''"), (3, TypeError, "int 3"), (None, TypeError, "NoneType None")],
)
async def test_invalid_key_fieldname(tmp_path, key_fieldname, error, found):
    with pytest.raises(error, match=rf"^key_fieldname must be a non-empty str, got {found}$"):
        CSVFileReleaseManager(tmp_path / "m.csv", key_fieldname=key_fieldname)


async def test_numbers_are_written_losslessly(tmp_path):
    path = tmp_path / "metrics.csv"
    value = {
        "float": 0.1,
        "small": 1e-05,
        "third": 1 / 3,
        "float32": np.float32(0.1),
        "float64": np.float64(2.5),
        "int64": np.int64(-7),
        "big": 2**70,
        "zero_d": np.array(0.125),
        "true": True,
        "numpy_false": np.bool_(False),
        "nan": float("nan"),
        "inf": float("-inf"),
        "text": 'a, "quoted"\nline',
        "none": None,
    }
    await release_all(path, [(1, value)])
    header, row = rows(path)
    cells = dict(zip(header, row, strict=True))
    assert cells == {
        "key": "1",
        "float": "0.1",
        "small": "1e-05",
        "third": "0.3333333333333333",
        "float32": "0.10000000149011612",
        "float64": "2.5",
        "int64": "-7",
        "big": "1180591620717411303424",
        "zero_d": "0.125",
        "true": "True",
        "numpy_false": "False",
        "nan": "nan",
        "inf": "-inf",
        "text": 'a, "quoted"\nline',
    }
    assert float(cells["third"]) == 1 / 3
    assert np.float32(float(cells["float32"])) == np.float32(0.1)


async def test_root_leaf_goes_in_the_column_named_empty(tmp_path):
    path = tmp_path / "metrics.csv"
    await release_all(path, [(1, 0.5), (2, 0.25)])
    assert rows(path) == [["key", ""], ["1", "0.5"], ["2", "0.25"]]


async def test_str_keys_are_told_from_int_keys(tmp_path):
    path = tmp_path / "metrics.csv"
    items = [(7, "int"), ("7", "str"), ("'quoted", "mark"), ("-3", "negative"), ("07", "zero")]
    await release_all(path, items)
    assert [row[0] for row in rows(path)] == ["key", "7", "'7", "''quoted", "'-3", "07"]
    # A restarted program tells them apart too: each re-release replaces its own row.
    await release_all(path, [(key, f"{value}!") for key, value in items])
    assert rows(path)[1:] == [
        ["7", "int!"],
        ["'7", "str!"],
        ["''quoted", "mark!"],
        ["'-3", "negative!"],
        ["07", "zero!"],
    ]


async def test_arrays_raise_type_error_naming_the_path(tmp_path):
    path = tmp_path / "metrics.csv"
    async with CSVFileReleaseManager(path) as manager:
        await manager.release({"loss": 1.0}, 1)
        with pytest.raises(TypeError, match=r"path 'model/weights' is an array of shape \(2, 3\)"):
            await manager.release({"loss": 0.5, "model": {"weights": np.zeros((2, 3))}}, 2)
    assert rows(path) == [["key", "loss"], ["1", "1.0"]]


@pytest.mark.parametrize(
    ("leaf", "type_name"),
    [(b"raw", "bytes"), (1 + 2j, "complex"), (object(), "object"), (np.complex64(1), "complex64")],
    ids=["bytes", "complex", "object", "numpy-complex"],
)
async def test_other_leaves_raise_type_error_naming_the_path(tmp_path, leaf, type_name):
    path = tmp_path / "metrics.csv"
    async with CSVFileReleaseManager(path) as manager:
        with pytest.raises(TypeError, match=rf"leaf at path 'extra' is a {type_name}$"):
            await manager.release({"loss": 1.0, "extra": leaf}, 1)
    assert not path.exists()


async def test_path_equal_to_key_fieldname_raises(tmp_path):
    async with CSVFileReleaseManager(tmp_path / "m.csv", key_fieldname="round") as manager:
        with pytest.raises(ValueError, match=r"leaf at path 'round', which is the key_fieldname"):
            await manager.release({"round": 3, "loss": 1.0}, 3)


async def test_two_leaves_with_one_path_raise(tmp_path):
    async with CSVFileReleaseManager(tmp_path / "m.csv") as manager:
        with pytest.raises(
            ValueError, match=r"two leaves of the released value have the path 'a/b'"
        ):
            await manager.release({"a/b": 1, "a": {"b": 2}}, 1)


async def test_new_columns_extend_the_header_and_old_rows_get_empty_cells(tmp_path):
    path = tmp_path / "metrics.csv"
    await release_all(
        path,
        [
            (1, {"train": {"loss": 0.5}}),
            (2, {"train": {"loss": 0.4, "accuracy": 0.8}}),
            (3, {"eval": {"loss": 0.6}}),
        ],
    )
    assert rows(path) == [
        ["key", "train/loss", "train/accuracy", "eval/loss"],
        ["1", "0.5", "", ""],
        ["2", "0.4", "0.8", ""],
        ["3", "", "", "0.6"],
    ]


async def test_new_key_is_appended_without_rewriting(tmp_path):
    path = tmp_path / "metrics.csv"
    async with CSVFileReleaseManager(path) as manager:
        await manager.release({"loss": 1.0, "accuracy": 0.5}, 1)
        inode = path.stat().st_ino
        before = path.read_bytes()
        for key in range(2, 6):
            await manager.release({"loss": 1.0 / key}, key)  # known columns only
            assert path.stat().st_ino == inode
        after = path.read_bytes()
    assert after.startswith(before)
    assert after[len(before) :] == b"2,0.5,\n3,0.3333333333333333,\n4,0.25,\n5,0.2,\n"


async def test_re_release_with_a_changed_row_rewrites_atomically(tmp_path):
    path = tmp_path / "metrics.csv"
    async with CSVFileReleaseManager(path) as manager:
        for key in (1, 2, 3):
            await manager.release({"loss": float(key)}, key)
        inode = path.stat().st_ino
        await manager.release({"loss": 2.5}, 2)
        assert path.stat().st_ino != inode  # a new file was renamed over the old one
        await manager.release({"loss": 4.0}, 4)  # appends go to the new file
    assert keys_and_losses(path) == [("1", "1.0"), ("2", "2.5"), ("3", "3.0"), ("4", "4.0")]
    assert os.listdir(tmp_path) == ["metrics.csv"]  # no temporary file is left


async def test_re_release_with_the_same_row_writes_nothing(tmp_path):
    path = tmp_path / "metrics.csv"
    async with CSVFileReleaseManager(path) as manager:
        await manager.release({"loss": 1.0, "count": 3}, 1)
        await manager.release({"loss": 2.0, "count": 4}, 2)
        os.utime(path, ns=(1_000_000_000, 1_000_000_000))
        inode = path.stat().st_ino
        await manager.release({"loss": 1.0, "count": np.int64(3)}, 1)
        assert path.stat().st_mtime_ns == 1_000_000_000
        assert path.stat().st_ino == inode


async def test_re_release_with_fewer_paths_empties_their_cells(tmp_path):
    path = tmp_path / "metrics.csv"
    await release_all(path, [(1, {"loss": 1.0, "accuracy": 0.5}), (1, {"loss": 0.9})])
    assert rows(path) == [["key", "loss", "accuracy"], ["1", "0.9", ""]]


async def test_none_leaf_is_an_empty_cell(tmp_path):
    path = tmp_path / "metrics.csv"
    await release_all(
        path, [(1, {"loss": 1.0, "accuracy": 0.5}), (2, {"loss": None, "accuracy": 1})]
    )
    assert rows(path) == [["key", "loss", "accuracy"], ["1", "1.0", "0.5"], ["2", "", "1"]]


async def test_resume_continues_the_same_file(tmp_path):
    path = tmp_path / "metrics.csv"
    await release_all(path, [(key, {"loss": float(key)}) for key in range(1, 11)])
    # The program restarts from its round-5 checkpoint and releases rounds 6 to 12 again.
    await release_all(path, [(key, {"loss": key * 10.0}) for key in range(6, 13)])
    assert keys_and_losses(path) == [(str(key), f"{float(key)}") for key in range(1, 6)] + [
        (str(key), f"{key * 10.0}") for key in range(6, 13)
    ]


async def test_resume_with_keys_out_of_order_and_re_released(tmp_path):
    path = tmp_path / "metrics.csv"
    await release_all(
        path,
        [(key, {"loss": f"a{key}"}) for key in (3, 1, 2, 5, 4)]
        + [
            (1, {"loss": "b1"}),
            (5, {"loss": "b5"}),
        ],
    )
    assert keys_and_losses(path) == [
        ("3", "a3"),
        ("1", "b1"),
        ("2", "a2"),
        ("5", "b5"),
        ("4", "a4"),
    ]
    await release_all(
        path,
        [(key, {"loss": f"c{key}"}) for key in (7, 2, 6, 7)]
        + [
            (2, {"loss": "d2"}),
            ("final", {"loss": "e"}),
        ],
    )
    await release_all(path, [(6, {"loss": "f6"}), (3, {"loss": "a3"})])
    assert keys_and_losses(path) == [
        ("3", "a3"),
        ("1", "b1"),
        ("2", "d2"),
        ("5", "b5"),
        ("4", "a4"),
        ("7", "c7"),
        ("6", "f6"),
        ("final", "e"),
    ]


async def test_resume_keeps_the_header_and_extends_it(tmp_path):
    path = tmp_path / "metrics.csv"
    await release_all(path, [(1, {"loss": 1.0, "accuracy": 0.5})])
    await release_all(path, [(2, {"accuracy": 0.6}), (3, {"loss": 0.8, "auc": 0.7})])
    assert rows(path) == [
        ["key", "loss", "accuracy", "auc"],
        ["1", "1.0", "0.5", ""],
        ["2", "", "0.6", ""],
        ["3", "0.8", "", "0.7"],
    ]


async def test_resume_appends_to_the_existing_file_without_rewriting(tmp_path):
    path = tmp_path / "metrics.csv"
    await release_all(path, [(key, {"loss": float(key)}) for key in (1, 2)])
    inode = path.stat().st_ino
    await release_all(path, [(3, {"loss": 3.0}), (2, {"loss": 2.0})])  # new key; unchanged row
    assert path.stat().st_ino == inode
    assert path.read_text(encoding="utf-8") == "key,loss\n1,1.0\n2,2.0\n3,3.0\n"


async def test_resume_of_a_file_with_crlf_line_ends(tmp_path):
    path = tmp_path / "metrics.csv"
    path.write_bytes(b"key,loss\r\n1,1.0\r\n2,2.0\r\n")  # as csv.writer's default writes
    await release_all(path, [(3, {"loss": 3.0}), (1, {"loss": 1.0})])
    assert keys_and_losses(path) == [("1", "1.0"), ("2", "2.0"), ("3", "3.0")]


async def test_existing_file_with_another_first_column_raises(tmp_path):
    path = tmp_path / "metrics.csv"
    path.write_text("round,loss\n1,1.0\n", encoding="utf-8")
    async with CSVFileReleaseManager(path) as manager:
        with pytest.raises(
            ValueError, match=r"first column of .* is 'round', not key_fieldname 'key'"
        ):
            await manager.release({"loss": 2.0}, 2)
    assert path.read_text(encoding="utf-8") == "round,loss\n1,1.0\n"


async def test_existing_row_longer_than_its_header_raises(tmp_path):
    path = tmp_path / "metrics.csv"
    path.write_text("key,loss\n1,1.0\n2,2.0,extra\n", encoding="utf-8")
    async with CSVFileReleaseManager(path) as manager:
        with pytest.raises(ValueError, match=r"row 3 of .* has 3 cells, more than the 2 columns"):
            await manager.release({"loss": 3.0}, 3)


async def test_unfinished_last_line_is_dropped_with_a_warning(tmp_path, caplog):
    path = tmp_path / "metrics.csv"
    path.write_text("key,loss\n1,1.0\n2,0.12", encoding="utf-8")  # a crash cut round 2 short
    with caplog.at_level(logging.WARNING, logger="managers.release.csv_file"):
        await release_all(path, [(3, {"loss": 3.0})])
    assert "dropping the unfinished last line" in caplog.text
    assert path.read_text(encoding="utf-8") == "key,loss\n1,1.0\n3,3.0\n"


async def test_file_read_with_an_unfinished_line_is_rewritten_by_an_unchanged_release(tmp_path):
    path = tmp_path / "metrics.csv"
    path.write_text("key,loss\n1,1.0\n2,0.1", encoding="utf-8")
    await release_all(path, [(1, {"loss": 1.0})])
    assert path.read_text(encoding="utf-8") == "key,loss\n1,1.0\n"


async def test_key_found_twice_in_the_file_keeps_its_last_row(tmp_path, caplog):
    path = tmp_path / "metrics.csv"
    path.write_text("key,loss\n1,1.0\n2,2.0\n1,1.5\n", encoding="utf-8")
    with caplog.at_level(logging.WARNING, logger="managers.release.csv_file"):
        await release_all(path, [(3, {"loss": 3.0})])
    assert "holds key 1 more than once" in caplog.text
    assert keys_and_losses(path) == [("1", "1.5"), ("2", "2.0"), ("3", "3.0")]


async def test_empty_existing_file_gets_a_header(tmp_path):
    path = tmp_path / "metrics.csv"
    path.touch()
    await release_all(path, [(1, {"loss": 1.0})])
    assert path.read_text(encoding="utf-8") == "key,loss\n1,1.0\n"


async def test_aclose_lets_a_later_release_read_the_file_again(tmp_path):
    path = tmp_path / "metrics.csv"
    manager = CSVFileReleaseManager(path)
    await manager.release({"loss": 1.0}, 1)
    await manager.aclose()
    with open(path, "a", encoding="utf-8") as file:
        file.write("2,2.0\n")  # written by someone else while the manager was closed
    await manager.release({"loss": 3.0}, 3)
    await manager.aclose()
    await manager.aclose()  # closing twice is harmless
    assert keys_and_losses(path) == [("1", "1.0"), ("2", "2.0"), ("3", "3.0")]


async def test_concurrent_releases_with_new_columns(tmp_path):
    path = tmp_path / "metrics.csv"

    async with CSVFileReleaseManager(path) as manager:
        async with anyio.create_task_group() as group:
            for key in range(30):
                value = {
                    "loss": FakeValueReference(float(key), delay=key % 4),
                    f"metric_{key % 6}": key,
                }
                group.start_soon(manager.release, value, key)
    header, *body = rows(path)
    assert header[:1] == ["key"] and sorted(header[1:]) == sorted(
        ["loss", *(f"metric_{index}" for index in range(6))]
    )
    by_key = {int(row[0]): dict(zip(header, row, strict=True)) for row in body}
    assert sorted(by_key) == list(range(30))
    for key, cells in by_key.items():
        assert cells["loss"] == f"{float(key)}"
        assert cells[f"metric_{key % 6}"] == str(key)
        assert sum(1 for cell in cells.values() if cell) == 3


async def test_failed_release_leaves_the_file_as_it_was(tmp_path):
    path = tmp_path / "metrics.csv"

    async with CSVFileReleaseManager(path) as manager:
        await manager.release({"loss": 1.0}, 1)
        with pytest.raises(OSError, match="no value"):
            await manager.release(
                {"loss": FakeValueReference(error=OSError("no value")), "new_column": 1}, 1
            )
    assert path.read_text(encoding="utf-8") == "key,loss\n1,1.0\n"
