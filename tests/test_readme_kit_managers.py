"""The README's examples of the contract kit pass as written.

The blocks are taken from README.md, or, until the README has them, from the text
proposed for it in docs/readme/.
"""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.anyio

ROOT = Path(__file__).parent.parent


def kit_example(suite: str) -> str:
    """The first Python block of the README (or a proposed section) subclassing ``suite``."""
    for source in [ROOT / "README.md", *sorted((ROOT / "docs" / "readme").glob("*.md"))]:
        for block in re.findall(r"```python\n(.*?)```", source.read_text(), flags=re.DOTALL):
            if f"({suite})" in block:
                return block
    raise LookupError(f"no example subclasses {suite}")


@pytest.mark.parametrize("suite", ["ReleaseManagerContract", "ProgramStateManagerContract"])
async def test_a_kit_example_passes_the_suite(tmp_path: Path, suite: str) -> None:
    (tmp_path / "test_example.py").write_text(kit_example(suite))
    environment = {**os.environ, "PYTHONPATH": str(ROOT)}
    completed = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-W", "error"],
        cwd=tmp_path,
        env=environment,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert completed.returncode == 0, completed.stdout + completed.stderr
    assert re.search(r"\b[1-9][0-9]* passed", completed.stdout), completed.stdout
