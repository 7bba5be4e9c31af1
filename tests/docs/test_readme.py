"""README.md stays a short front page: two quick-start commands, nothing dated."""

import re
from pathlib import Path

import pytest

pytestmark = pytest.mark.anyio

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text()


async def test_the_quick_start_has_exactly_the_two_commands():
    quick_start = README.split("## Quick start", 1)[1].split("\n## ", 1)[0]
    commands = re.findall(r"```bash\n(.*?)```", quick_start, flags=re.DOTALL)
    assert len(commands) == 2
    assert commands[0].strip().endswith("samples/main_job.py")
    assert commands[1].strip().endswith("-m pytest")
    assert commands[1].strip() in (ROOT / ".ci" / "run").read_text()


async def test_the_readme_is_short_and_holds_no_dates_issues_hashes_or_outside_paths():
    assert len(README.splitlines()) < 250
    assert not re.findall(r"\b20\d\d-\d\d-\d\d\b", README)  # dated measurements
    assert not re.findall(r"\bissue \d+|#\d+\b", README)
    assert not re.findall(r"\b[0-9a-f]{7,40}\b", README)  # commit hashes
    assert "../" not in README


async def test_every_link_of_the_readme_into_the_repository_exists():
    for target in re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", README):
        if not target.startswith(("http://", "https://")):
            assert (ROOT / target).exists(), target
