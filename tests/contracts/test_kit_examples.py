"""The examples that show users how to check their own implementations with the kit pass.

Every python block of README.md that imports from ``programlogic.testing.contracts``
and subclasses a suite is a test file of a user: it runs as one, in a
fresh pytest process, with this checkout first on the import path.
"""

import os
import pathlib
import re
import subprocess
import sys

import pytest

pytestmark = pytest.mark.anyio

ROOT = pathlib.Path(__file__).parent.parent.parent


def kit_examples() -> list[str]:
    text = (ROOT / "README.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", text, flags=re.DOTALL)
    return [block for block in blocks if "from programlogic.testing.contracts import" in block]


def passes_as_a_test_file(example: str, folder: pathlib.Path) -> None:
    """Run ``example`` as a user's test file in a fresh pytest process; assert it passed."""
    (folder / "test_example.py").write_text(example)
    completed = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "test_example.py"],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=folder,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert completed.returncode == 0, completed.stdout + completed.stderr
    assert re.search(r"\b[1-9][0-9]* passed", completed.stdout), completed.stdout
    assert "failed" not in completed.stdout


@pytest.mark.parametrize(
    "suite",
    [
        "ReleaseManager",
        "ProgramStateManager",
        "FederatedDataSource",
        "LearningProcess",
        "StoppingPolicy",
    ],
)
async def test_an_example_subclasses_each_suite_and_passes_it(tmp_path, suite: str) -> None:
    example = next(block for block in kit_examples() if f"({suite}Contract)" in block)
    passes_as_a_test_file(example, tmp_path)


@pytest.mark.parametrize("anyio_backend", ["asyncio"])  # the example runs under both itself
async def test_the_backend_written_with_the_backend_kit_passes_the_context_suite(
    tmp_path,
) -> None:
    [example] = [block for block in kit_examples() if "(FederatedContextContract)" in block]
    assert "(FederatedContext)" in example and "(FederatedContextContract)" in example
    passes_as_a_test_file(example, tmp_path)
