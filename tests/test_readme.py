"""The code in README.md works as written."""

import inspect
import pathlib
import re
import subprocess
import sys

import pytest

from managers import FileProgramStateManager

pytestmark = pytest.mark.anyio

README = pathlib.Path(__file__).parent.parent / "README.md"


def python_blocks() -> list[str]:
    return re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.DOTALL)


async def test_the_program_example_trains_and_prints_its_last_metrics() -> None:
    program = next(block for block in python_blocks() if "anyio.run(main)" in block)
    completed = subprocess.run(
        [sys.executable, "-c", program], capture_output=True, text=True, timeout=120
    )
    assert completed.returncode == 0, completed.stderr
    assert completed.stdout.startswith("completed {'client_work': {'train': {'loss':")


async def test_the_testing_example_passes() -> None:
    example = next(block for block in python_blocks() if "SimulatedCrash" in block)
    namespace: dict[str, object] = {}
    exec(compile(example, str(README), "exec"), namespace)
    await namespace["test_my_program_resumes_after_a_crash"]()


@pytest.mark.parametrize(
    "name",
    [
        "test_my_program_survives_a_round_with_dropped_clients",
        "test_my_training_resumes_after_the_cluster_is_lost",
    ],
)
async def test_the_fault_examples_pass(name, tmp_path) -> None:
    example = next(block for block in python_blocks() if f"def {name}(" in block)
    namespace: dict[str, object] = {}
    exec(compile(example, str(README), "exec"), namespace)
    test = namespace[name]
    await (test(tmp_path) if "tmp_path" in inspect.signature(test).parameters else test())


async def test_the_quick_start_has_exactly_two_commands() -> None:
    quick_start = README.read_text().split("## Quick start", 1)[1].split("\n## ", 1)[0]
    commands = re.findall(r"```bash\n(.*?)```", quick_start, flags=re.DOTALL)
    assert len(commands) == 2
    assert "samples/main_job.py" in commands[0]
    assert commands[1].strip().endswith("-m pytest")
    assert commands[1].strip() in (README.parent / ".ci" / "run").read_text()


async def test_the_fed_avg_example_trains_on_digits_and_evaluates_held_out_writers() -> None:
    program = next(block for block in python_blocks() if "build_weighted_fed_avg" in block)
    completed = subprocess.run(
        [sys.executable, "-c", program], capture_output=True, text=True, timeout=300
    )
    assert completed.returncode == 0, completed.stderr
    accuracy = float(completed.stdout.removeprefix("held-out accuracy "))
    assert 0.8 < accuracy <= 1.0


@pytest.mark.parametrize("where", ["script", "notebook"])
async def test_the_run_example_trains_from_a_script_and_inside_a_running_loop(tmp_path, where):
    example = next(block for block in python_blocks() if "programlogic.run(train(" in block)
    code = example
    if where == "notebook":  # the cell's code runs while the kernel's loop is running
        code = (
            "import asyncio\n"
            f"async def cell():\n    exec(compile({example!r}, 'cell', 'exec'), {{}})\n"
            "asyncio.new_event_loop().run_until_complete(cell())\n"
        )
    completed = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=tmp_path
    )
    assert completed.returncode == 0, completed.stderr
    async with FileProgramStateManager(tmp_path / "runs" / "notebook") as state:
        assert max(await state.get_versions()) == 100
