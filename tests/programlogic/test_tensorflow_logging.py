"""quiet_tensorflow: TensorFlow's start-up lines kept off standard error, without importing
TensorFlow, and a warning when it comes after TensorFlow's import.

Most tests import a stand-in ``tensorflow`` package that writes to descriptor 2 as
TensorFlow's C++ libraries do, in a fresh interpreter; one imports the real TensorFlow.
"""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys
import textwrap
import types

import pytest

import programlogic

pytestmark = pytest.mark.anyio

ROOT = pathlib.Path(__file__).parent.parent.parent
START_UP_LINES = (
    "absl::InitializeLog()",
    "oneDNN custom operations",
    "cudart_stub.cc",
    "cpu_feature_guard.cc",
    "I0000 ",
    "W0000 ",
    "E0000 ",
)
STAND_IN = """
import os, sys
os.write(2, b"I0000 00:00:1.0 port.cc:153] the C++ side's start-up line\\n")
print("a Python-side line on sys.stderr", file=sys.stderr)
if os.environ.get("STAND_IN_FAILS"):
    raise ImportError("libtensorflow_framework.so.2: cannot open shared object file")
"""


def python(
    code: str, *, path: list[pathlib.Path] = (), **environment: str
) -> subprocess.CompletedProcess[str]:
    env = {key: value for key, value in os.environ.items() if not key.startswith("TF_")}
    env["PYTHONPATH"] = os.pathsep.join(map(str, [*path, ROOT]))
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        timeout=300,
        env={**env, **environment},
    )


@pytest.fixture
def stand_in(tmp_path: pathlib.Path) -> pathlib.Path:
    (tmp_path / "tensorflow").mkdir()
    (tmp_path / "tensorflow" / "__init__.py").write_text(STAND_IN)
    return tmp_path


async def test_it_imports_no_tensorflow_and_sets_the_level_the_environment_leaves_unset():
    code = """
        import os, sys
        import programlogic
        programlogic.quiet_tensorflow()
        print("tensorflow" in sys.modules, os.environ["TF_CPP_MIN_LOG_LEVEL"])
    """
    unset = python(code)
    assert unset.returncode == 0, unset.stderr
    assert unset.stdout.split() == ["False", "3"]
    chosen = python(code, TF_CPP_MIN_LOG_LEVEL="1")
    assert chosen.returncode == 0, chosen.stderr
    assert chosen.stdout.split() == ["False", "1"]


async def test_what_the_import_writes_to_descriptor_2_is_dropped(stand_in):
    quiet = python(
        """
        import os, sys
        import programlogic
        programlogic.quiet_tensorflow()
        import tensorflow
        print(type(tensorflow.__loader__).__name__, type(tensorflow.__spec__.loader).__name__)
        os.write(2, b"written after the import\\n")
        """,
        path=[stand_in],
    )
    assert quiet.returncode == 0, quiet.stderr
    assert quiet.stderr == "written after the import\n"
    assert quiet.stdout.split() == ["SourceFileLoader", "SourceFileLoader"]
    unquiet = python("import tensorflow", path=[stand_in])
    assert "the C++ side's start-up line" in unquiet.stderr


async def test_a_failing_import_shows_what_it_wrote_and_raises(stand_in):
    failed = python(
        "import programlogic; programlogic.quiet_tensorflow(); import tensorflow",
        path=[stand_in],
        STAND_IN_FAILS="1",
    )
    assert failed.returncode == 1
    assert "the C++ side's start-up line" in failed.stderr
    assert "a Python-side line on sys.stderr" in failed.stderr
    last = failed.stderr.strip().splitlines()[-1]
    assert last == "ImportError: libtensorflow_framework.so.2: cannot open shared object file"


async def test_called_twice_the_first_import_is_quiet_once(stand_in):
    quiet = python(
        """
        import sys
        import programlogic
        programlogic.quiet_tensorflow()
        programlogic.quiet_tensorflow()
        import tensorflow
        del sys.modules["tensorflow"]
        import tensorflow
        """,
        path=[stand_in],
    )
    assert quiet.returncode == 0, quiet.stderr
    # the second import (a fresh one: the module was dropped) is not held
    assert quiet.stderr.count("the C++ side's start-up line") == 1


async def test_after_tensorflow_s_import_it_warns_that_it_came_too_late(monkeypatch):
    monkeypatch.setitem(sys.modules, "tensorflow", types.ModuleType("tensorflow"))
    monkeypatch.delenv("TF_CPP_MIN_LOG_LEVEL", raising=False)
    finders = list(sys.meta_path)
    with pytest.warns(UserWarning, match=r"came too late: TensorFlow was already imported") as seen:
        programlogic.quiet_tensorflow()
    assert [warning.filename for warning in seen] == [__file__]  # the caller's line
    assert "TF_CPP_MIN_LOG_LEVEL" not in os.environ
    assert sys.meta_path == finders


async def test_real_tensorflow_and_keras_start_without_their_lines():
    pytest.importorskip("keras")
    quiet = python(
        """
        import sys
        import programlogic
        programlogic.quiet_tensorflow()
        assert "tensorflow" not in sys.modules
        import keras
        import tensorflow as tf
        print(keras.layers.Dense(2)(tf.zeros((1, 3))).shape)
        """
    )
    assert quiet.returncode == 0, quiet.stderr
    assert quiet.stdout.strip() == "(1, 2)"
    assert not [
        line for line in quiet.stderr.splitlines() if any(s in line for s in START_UP_LINES)
    ]
