"""Runs one page's blocks in this process: ``python page_runner.py BLOCKS.json RESULT.json``.

BLOCKS.json: a list of ``{"language", "code", "line", "action", "argument", "page"}``
to run in order in the working directory. RESULT.json gets one ``{"line", "output"}``
per block run, and ``{"line", "error"}`` for the block that failed, after which
nothing more runs.
"""

import contextlib
import json
import os
import subprocess
import sys
import tempfile
import traceback
from pathlib import Path


def run_block(block: dict, namespace: dict, index: int) -> str:
    where = f"{block['page']}:{block['line']}"
    if block["action"] == "file":
        path = Path(block["argument"])
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(block["code"])
        return ""
    if block["action"] == "pytest":
        test_file = Path(f"test_docs_block_{index}.py")
        test_file.write_text(block["code"])
        command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(test_file)]
        return _shell(command, where)
    if block["language"] == "bash":
        return _shell(["bash", "-euo", "pipefail", "-c", block["code"]], where)
    with _stdout_captured() as captured:
        exec(compile(block["code"], where, "exec"), namespace)
    try:
        return captured.read_text()
    finally:
        captured.unlink()


@contextlib.contextmanager
def _stdout_captured():
    """File descriptor 1 into a file while the block runs, so that what its subprocesses
    and extension modules print counts too (TFF hands its worker process that descriptor)."""
    descriptor, name = tempfile.mkstemp(prefix="docs-block-", suffix=".out")
    os.close(descriptor)
    captured = Path(name)
    sys.stdout.flush()
    saved = os.dup(1)
    with captured.open("wb") as file:
        os.dup2(file.fileno(), 1)
    try:
        yield captured
    finally:
        sys.stdout.flush()
        os.dup2(saved, 1)
        os.close(saved)


def _shell(command: list[str], where: str) -> str:
    completed = subprocess.run(command, capture_output=True, text=True)
    if completed.returncode != 0:
        raise RuntimeError(
            f"{where} exited with status {completed.returncode}\n"
            f"stdout:\n{completed.stdout}\nstderr:\n{completed.stderr}"
        )
    return completed.stdout


def main() -> None:
    blocks_file, result_file = sys.argv[1:]
    blocks = json.loads(Path(blocks_file).read_text())
    sys.path[0] = os.getcwd()  # as `python` started in the page's directory: its files import
    namespace = {"__name__": "__main__"}
    results = []
    for index, block in enumerate(blocks):
        try:
            results.append({"line": block["line"], "output": run_block(block, namespace, index)})
        except BaseException:
            results.append({"line": block["line"], "error": traceback.format_exc()})
            break
        finally:
            Path(result_file).write_text(json.dumps(results))
    sys.stdout.flush()
    os._exit(0)  # a block's leftover threads or atexit hooks do not decide the result


if __name__ == "__main__":
    main()
