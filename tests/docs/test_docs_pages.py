"""Every code block in the docs and README.md runs, and prints what its page shows.

The rules a page's blocks follow are in ``markdown_blocks``. Blocks that need what the
main test command lacks (TFF, Ray, PostgreSQL, Flower, a kill) run in CI steps of
their own, which name the needs in ``PROGRAMLOGIC_DOCS_NEEDS`` (comma-separated): such a
run runs the pages' blocks for those needs only, leaving the rest to the main command.
"""

import doctest
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.docs.markdown_blocks import Page, PageError, parse_page

pytestmark = pytest.mark.anyio

ROOT = Path(__file__).resolve().parents[2]
PAGES = sorted(
    path
    for path in [ROOT / "README.md", *(ROOT / "docs").rglob("*.md")]
    if "_tools" not in path.relative_to(ROOT).parts
)
_TERMINAL_CHANGING = {"CI", "BUILD_NUMBER", "PYTEST_ADDOPTS"}
AVAILABLE = {need for need in os.environ.get("PROGRAMLOGIC_DOCS_NEEDS", "").split(",") if need}
TIMEOUT_S = 900
CHECKER, OPTIONS = doctest.OutputChecker(), doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE


def _cases() -> list:
    cases = []
    for path in PAGES:
        name = str(path.relative_to(ROOT))
        try:
            page = parse_page(path)
        except PageError as error:
            cases.append(pytest.param(None, None, str(error), id=name))
            continue
        if page.need is None:
            cases.append(pytest.param(page, None, None, id=name))
        cases += [pytest.param(page, need, None, id=f"{name}[{need}]") for need in page.needs()]
    return cases


def _blocks_to_run(page: Page, need: str | None) -> list:
    wanted = {None} | ({need} if need else set())
    return [
        block
        for block in page.blocks
        if block.action != "skip" and (block.need or page.need) in wanted
    ]


def run_page(page: Page, need: str | None, directory: Path) -> list[str]:
    """Run the blocks of ``page`` a run for ``need`` (None: the main test command) runs,
    in ``directory``; what went wrong, one message a block (empty if all ran as shown)."""
    blocks = _blocks_to_run(page, need)
    if not blocks:
        return []
    for name in ("samples", "bench"):
        (directory / name).symlink_to(ROOT / name)
    path = page.path
    shown = str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path)
    (directory / "blocks.json").write_text(
        json.dumps(
            [
                {"language": b.language, "code": b.code, "line": b.line, "action": b.action}
                | {"argument": b.argument, "page": shown}
                for b in blocks
            ]
        )
    )
    # The page shows what a reader's terminal shows. pytest prints whole assertion diffs
    # and summary lines where CI or BUILD_NUMBER is set, and sizes lines to COLUMNS.
    environment = {k: v for k, v in os.environ.items() if k not in _TERMINAL_CHANGING} | {
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
        "TF_CPP_MIN_LOG_LEVEL": "3",
        "COLUMNS": "80",
    }
    runner = str(Path(__file__).with_name("page_runner.py"))
    completed = subprocess.run(
        [sys.executable, runner, "blocks.json", "results.json"],
        cwd=directory,
        env=environment,
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
    )
    results_file = directory / "results.json"
    results = json.loads(results_file.read_text()) if results_file.exists() else []
    if not results or (len(results) < len(blocks) and "error" not in results[-1]):
        ran = len(results)
        return [
            f"{shown}: the page's process ended after {ran} of {len(blocks)} blocks "
            f"(status {completed.returncode}):\n{completed.stderr[-4000:]}"
        ]
    failures = []
    for block, result in zip(blocks, results, strict=False):
        where = f"{shown}:{block.line}"
        if "error" in result:
            failures.append(f"{where} failed:\n{result['error']}\n{completed.stderr[-3000:]}")
        elif block.output is not None and not CHECKER.check_output(
            block.output, result["output"], OPTIONS
        ):
            difference = CHECKER.output_difference(
                doctest.Example("", block.output), result["output"], OPTIONS
            )
            failures.append(f"{where} printed other output than the page shows:\n{difference}")
    return failures


@pytest.mark.parametrize(("page", "need", "broken"), _cases())
async def test_the_page_runs_as_shown(page: Page, need: str | None, broken: str | None, tmp_path):
    if broken:
        pytest.fail(broken)
    if need is not None and need not in AVAILABLE:
        pytest.skip(f"needs {need}: runs where PROGRAMLOGIC_DOCS_NEEDS names it (a CI step)")
    if need is None and AVAILABLE:
        pytest.skip(f"PROGRAMLOGIC_DOCS_NEEDS={','.join(sorted(AVAILABLE))}: needs only")
    failures = run_page(page, need, tmp_path)
    assert not failures, "\n\n".join(failures)
