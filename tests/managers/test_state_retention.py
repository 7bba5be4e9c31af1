"""Retention: which versions a program-state manager keeps, as it declares them."""

from __future__ import annotations

from pathlib import Path

import pytest

from managers import FileProgramStateManager, MemoryProgramStateManager, Retention
from programlogic.testing import CrashingStateManager
from programlogic.testing.contracts.state._support import kept_versions

pytestmark = pytest.mark.anyio

NEVER_SAVED = 2**62


async def test_the_library_managers_declare_their_retention(tmp_path: Path) -> None:
    assert MemoryProgramStateManager().retention is None
    assert MemoryProgramStateManager(keep_total=3).retention == Retention(3)
    assert FileProgramStateManager(tmp_path).retention == Retention(5, keep_first=True)
    assert FileProgramStateManager(tmp_path, keep_total=None).retention is None
    manager = FileProgramStateManager(tmp_path, keep_total=2, keep_first=False, keep_every=10)
    assert manager.retention == Retention(2, keep_first=False, keep_every=10)
    crashing = CrashingStateManager(manager, crash_on_version=NEVER_SAVED)
    assert crashing.retention == manager.retention


@pytest.mark.parametrize(
    ("retention", "saved", "kept"),
    [
        (Retention(3, keep_first=True), range(10), [0, 7, 8, 9]),
        (Retention(3), range(10), [7, 8, 9]),
        (Retention(1), range(10), [9]),
        (Retention(2, keep_every=4), range(10), [0, 4, 8, 9]),
        (Retention(2, keep_first=True, keep_every=3), range(1, 11), [1, 3, 6, 9, 10]),
        (Retention(2, keep_every=5), [2, 5, 7, 11, 12], [5, 11, 12]),
    ],
)
async def test_a_retention_keeps_the_newest_the_first_and_every_nth(
    retention: Retention, saved: range | list[int], kept: list[int]
) -> None:
    assert retention.keeps(list(saved)) == kept


@pytest.mark.parametrize(
    ("arguments", "error", "message"),
    [
        ({"keep_total": 0}, ValueError, "keep_total must be an int >= 1, got 0"),
        ({"keep_total": None}, TypeError, "keep_total must be an int >= 1, got NoneType None"),
        ({"keep_total": 2, "keep_first": 1}, TypeError, "keep_first must be a bool"),
        ({"keep_total": 2, "keep_every": 0}, ValueError, "keep_every must be an int >= 1"),
    ],
)
async def test_a_wrong_retention_argument_raises_naming_it(
    arguments: dict, error: type[Exception], message: str
) -> None:
    with pytest.raises(error, match=f"^{message}"):
        Retention(**arguments)


async def test_kept_versions_applies_retention_after_each_save_on_top_of_those_listed() -> None:
    assert kept_versions(None, [3, 4], [1]) == [1, 3, 4]
    assert kept_versions(Retention(2), [5, 6, 7], [1]) == [6, 7]
    # The first is the lowest listed when the save happens, whoever saved it.
    assert kept_versions(Retention(1, keep_first=True), [5, 6], [2]) == [2, 6]
    assert kept_versions(Retention(1, keep_first=True), range(5)) == [0, 4]
