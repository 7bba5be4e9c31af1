"""The contract kit fails a broken part for each promise, and passes the correct ones.

Each broken part of ``broken_parts.py`` breaks one promise of its base (the event loop
stays free; a cancelled call returns within the grace and changes nothing later;
retention is what the manager declares; a prepared write is made by its batch and
not before). Its suite runs in a fresh pytest process, as
a user's test file would, and every test named after the broken promise must fail
under asyncio and trio, saying why; the correct parts beside them pass the same tests.
"""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys
import xml.etree.ElementTree as ElementTree

import pytest

pytestmark = pytest.mark.anyio

ROOT = pathlib.Path(__file__).parent.parent.parent
PARTS = pathlib.Path(__file__).with_name("broken_parts.py").relative_to(ROOT)

RELEASE_CANCELLED = [
    "test_a_cancelled_release_leaves_the_whole_value_or_none_of_it",
    "test_a_release_cancelled_in_flight_returns_within_the_grace_and_changes_nothing_later",
]
SAVE_CANCELLED = [
    "test_a_cancelled_save_leaves_the_whole_version_or_none_of_it",
    "test_a_save_cancelled_in_flight_returns_within_the_grace_and_changes_nothing_later",
]
RETENTION = [
    "test_retention_keeps_exactly_the_versions_it_declares",
    "test_versions_are_listed_ascending",
]

BROKEN = {
    # part: (tests that must fail, what each failure says)
    "TestBlockingReleaseManager": (["test_a_release_is_held_under_its_key"], "event loop"),
    "TestShieldedReleaseManager": (RELEASE_CANCELLED, "ignored the cancellation"),
    "TestAbandoningReleaseManager": (RELEASE_CANCELLED[1:], "changed after a cancelled"),
    "TestBlockingSaveStateManager": (["test_a_saved_state_loads_back_equal"], "event loop"),
    "TestBlockingLoadStateManager": (["test_a_saved_state_loads_back_equal"], "event loop"),
    "TestShieldedSaveStateManager": (SAVE_CANCELLED, "ignored the cancellation"),
    "TestAbandoningSaveStateManager": (SAVE_CANCELLED[1:], "changed after a cancelled"),
    "TestIgnoresKeepTotalStateManager": (RETENTION, "must list"),
    "TestDeletesTheVersionJustSavedStateManager": (
        ["test_the_version_just_saved_is_never_removed"],
        "is not listed right after its save",
    ),
    "TestDeletesUndeclaredStateManager": (RETENTION, "must list"),
    "TestEagerPreparingReleaseManager": (
        ["test_a_prepared_release_writes_nothing_before_its_flush"],
        "wrote its value before the batch made its write",
    ),
    "TestForgetfulPreparingStateManager": (
        ["test_a_prepared_save_is_made_by_the_flush_as_save_makes_it"],
        "assert 1 in",
    ),
}

CORRECT = {
    "TestLatestReleaseManager": [
        "test_a_release_is_held_under_its_key",
        *RELEASE_CANCELLED,
    ],
    "TestMemoryProgramStateManager": [
        "test_a_saved_state_loads_back_equal",
        *SAVE_CANCELLED,
        *RETENTION,
        "test_the_version_just_saved_is_never_removed",
    ],
    "TestKeepingTwoStateManager": [*RETENTION, "test_the_version_just_saved_is_never_removed"],
    "TestPreparingReleaseManager": [
        "test_a_prepared_release_writes_nothing_before_its_flush",
        "test_a_prepared_release_is_written_by_the_flush_as_release_writes_it",
        "test_a_dropped_prepared_release_leaves_the_other_keys_and_the_manager_goes_on",
    ],
    "TestFileProgramStateManager": [
        "test_a_prepared_save_is_made_by_the_flush_as_save_makes_it",
        "test_a_dropped_prepared_save_is_never_saved_and_the_version_can_be_saved",
        "test_a_failed_prepared_save_raises_at_the_flush_and_saves_nothing",
    ],
}


def run_parts(tests: dict[str, list[str]], report: pathlib.Path) -> dict[str, str | None]:
    """Run ``tests`` of the classes of ``broken_parts.py`` in a fresh pytest process;
    ``{"Class::test[backend]": failure text, or None when it passed}``."""
    node_ids = [f"{PARTS}::{part}::{test}" for part, names in tests.items() for test in names]
    options = ["-q", "-p", "no:cacheprovider", f"--junitxml={report}"]
    completed = subprocess.run(
        [sys.executable, "-m", "pytest", *options, *node_ids],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert report.exists(), completed.stdout + completed.stderr
    outcomes: dict[str, str | None] = {}
    for case in ElementTree.parse(report).iter("testcase"):
        part = case.get("classname", "").rsplit(".", 1)[-1]
        failed = [*case.iter("failure"), *case.iter("error")]
        skipped = list(case.iter("skipped"))
        assert not skipped, f"{part}::{case.get('name')} was skipped"
        text = "".join(f"{item.get('message', '')}\n{item.text or ''}" for item in failed)
        outcomes[f"{part}::{case.get('name')}"] = text if failed else None
    return outcomes


@pytest.mark.parametrize("anyio_backend", ["asyncio"])  # the parts run under both themselves
async def test_the_kit_fails_each_broken_part_for_its_promise_and_passes_the_correct_ones(
    tmp_path: pathlib.Path,
) -> None:
    tests = {part: names for part, (names, _) in BROKEN.items()} | CORRECT
    outcomes = run_parts(tests, tmp_path / "report.xml")
    for part, (names, reason) in BROKEN.items():
        for name in names:
            for backend in ("asyncio", "trio"):
                failure = outcomes[f"{part}::{name}[{backend}]"]
                assert failure is not None, f"the kit passed {part}::{name}[{backend}]"
                assert reason in failure, f"{part}::{name}[{backend}] failed otherwise:\n{failure}"
    for part, names in CORRECT.items():
        for name in names:
            for backend in ("asyncio", "trio"):
                failure = outcomes[f"{part}::{name}[{backend}]"]
                assert failure is None, f"the kit failed {part}::{name}[{backend}]:\n{failure}"
