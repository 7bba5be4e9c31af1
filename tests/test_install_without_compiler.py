"""An install on a machine without a C compiler: it succeeds, and the library says what
it lacks and trains with the traced client update."""

import os
import shutil
import subprocess
import sys
import textwrap

import pytest

pytestmark = pytest.mark.anyio

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SOURCES = ("programlogic", "managers", "setup.py", "pyproject.toml", "MANIFEST.in", "README.md")

USE = textwrap.dedent(
    """
    import functools, logging, sys
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(message)s")
    import programlogic
    from programlogic.learning import build_weighted_fed_avg, softmax_regression
    assert programlogic.__file__.startswith(sys.argv[1]), programlogic.__file__
    model = functools.partial(softmax_regression, (8,), 3)
    print("active", build_weighted_fed_avg(model).active_client_update)
    try:
        build_weighted_fed_avg(model, client_update="portable")
    except ValueError as error:
        print("refused", error)
    """
)


async def test_an_install_without_a_c_compiler_traces_and_says_why(tmp_path) -> None:
    source, target = tmp_path / "source", tmp_path / "installed"
    source.mkdir()
    for name in SOURCES:
        copy = shutil.copytree if os.path.isdir(os.path.join(ROOT, name)) else shutil.copy
        copy(os.path.join(ROOT, name), source / name)
    for built in [*source.rglob("*.so"), *source.rglob("__pycache__")]:
        shutil.rmtree(built) if built.is_dir() else built.unlink()
    install = [sys.executable, "-m", "pip", "install", "-v", "--no-deps", "--no-build-isolation"]
    install += ["--no-cache-dir", "--target", str(target), str(source)]
    env = {**os.environ, "CC": "false"}  # a compiler command that always fails

    done = subprocess.run(install, env=env, capture_output=True, text=True, timeout=600)

    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    for module in ("_softmax_kernel", "_softmax_kernel_baseline"):
        assert f'building extension "programlogic.learning.client_update.{module}" failed' in (
            done.stdout + done.stderr
        )
    assert not list(target.rglob("*.so"))
    env = {**os.environ, "PYTHONPATH": str(target), "TF_CPP_MIN_LOG_LEVEL": "3"}
    used = subprocess.run(
        [sys.executable, "-c", USE, str(target)],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        cwd=tmp_path,
    )
    assert used.returncode == 0, used.stderr[-3000:]
    assert "active traced" in used.stdout
    assert "WARNING client_update='auto' trains this softmax regression with the slower" in (
        used.stderr
    )
    assert "_softmax_kernel is not installed" in used.stderr
    assert "refused client_update='portable'" in used.stdout
    assert "_softmax_kernel_baseline is not installed" in used.stdout
