"""Importing the packages imports none of the heavy optional dependencies: each is
imported where a feature that needs it is first used."""

import subprocess
import sys

import pytest

pytestmark = pytest.mark.anyio

OPTIONAL = ("matplotlib", "tensorboard", "tensorboardX", "ray", "optuna", "tensorflow", "sklearn")


@pytest.mark.parametrize(
    "statement",
    [
        "import programlogic",
        "import managers",
        "import managers.release, managers.state",
        "from managers import TensorBoardReleaseManager; TensorBoardReleaseManager('runs/x')",
    ],
)
async def test_importing_imports_no_optional_dependency(statement: str) -> None:
    code = (
        f"import sys; {statement}; "
        f"print(sorted({{m.split('.')[0] for m in sys.modules}} & set({OPTIONAL!r})))"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"
