import inspect
import subprocess
import sys

import pytest

import programlogic.datasets

pytestmark = pytest.mark.anyio


async def test_all_is_sorted_and_every_public_name_is_documented() -> None:
    names = programlogic.datasets.__all__
    assert names == sorted(names)
    for name in names:
        value = getattr(programlogic.datasets, name)
        if inspect.isclass(value) or inspect.isfunction(value):
            assert inspect.getdoc(value), f"{name} has no docstring"


async def test_importing_and_loading_never_imports_tensorflow_or_scikit_learn() -> None:
    code = (
        "import sys, programlogic.datasets as d; d.load_digits_writers(); "
        "print(sorted(m for m in sys.modules if m.split('.')[0] in "
        "('tensorflow', 'keras', 'sklearn', 'scipy')))"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"
