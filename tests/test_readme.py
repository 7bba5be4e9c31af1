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


async def test_the_client_transform_example_releases_its_counts() -> None:
    import functools

    import numpy as np

    from programlogic import ClientHandle, LocalContext
    from programlogic.datasets import ClientArrays, Preprocessing
    from programlogic.learning import build_weighted_fed_avg, softmax_regression

    example = next(block for block in python_blocks() if "class SignOnly(" in block)
    namespace: dict[str, object] = {"__name__": "readme_sign_only"}
    exec(compile(example, str(README), "exec"), namespace)
    process = build_weighted_fed_avg(
        functools.partial(softmax_regression, (3,), 2),
        preprocess=Preprocessing(epochs=1, batch_size=2, shuffle_buffer=0),
        model_aggregator=namespace["SignOnly"](),
    )
    rng = np.random.default_rng(0)
    clients = [
        ClientHandle(
            f"c{index}",
            functools.partial(
                lambda data: data,
                ClientArrays(rng.random((4, 3), dtype=np.float32), np.array([0, 1, 0, 1])),
            ),
        )
        for index in range(3)
    ]
    state = process.initialize()
    async with LocalContext(max_workers=2):
        output = await process.next(state, clients)
    # Every client moves every weight (3x2 kernel and 2 biases) by its sign: the update
    # is the mean of +-1 entries, and each client counts 8 nonzero signs.
    assert output.metrics["aggregator"] == {"nonzero_signs": 24.0}
    kernel = output.state["model"]["trainable"][0]
    assert np.all(np.abs(kernel) <= 1.0) and np.any(kernel != 0)


async def test_the_privacy_examples_run_and_print_the_documented_figures() -> None:
    program = next(block for block in python_blocks() if "rounds_within_budget()" in block)
    completed = subprocess.run(
        [sys.executable, "-c", program], capture_output=True, text=True, timeout=300
    )
    assert completed.returncode == 0, completed.stderr
    assert completed.stdout.split() == ["3.954", "511"]
    setup = next(block for block in python_blocks() if "dp_mean(mechanism, clip=0.1" in block)
    namespace: dict[str, object] = {}
    exec(compile(setup, str(README), "exec"), namespace)
    assert namespace["process"].describe_configuration()["model_aggregator"]["clip"] == 0.1


async def test_the_tuning_example_runs_a_pruned_study(tmp_path: pathlib.Path) -> None:
    example = next(block for block in python_blocks() if "from programlogic.tuning" in block)
    completed = subprocess.run(
        [sys.executable, "-c", example], capture_output=True, text=True, timeout=120, cwd=tmp_path
    )
    assert completed.returncode == 0, completed.stderr
    lines = completed.stdout.splitlines()
    states = [line.split()[1] for line in lines[:8]]
    assert "pruned" in states and "complete" in states
    assert lines[8].startswith("best ")
    assert (tmp_path / "runs" / "tuning_example" / "study.db").exists()


async def test_the_batched_sink_example_writes_every_round_once_train_model_returns(
    tmp_path: pathlib.Path,
) -> None:
    from managers import WriteBatch
    from programlogic import LocalContext, train_model
    from programlogic.testing import FakeDataSource, FakeLearningProcess

    example = next(block for block in python_blocks() if "class LinesReleaseManager" in block)
    namespace: dict[str, object] = {}
    exec(compile(example, str(README), "exec"), namespace)
    path = tmp_path / "metrics.txt"
    sink = namespace["LinesReleaseManager"](path)
    await sink.release(0.25, "direct")
    assert path.read_text() == "direct 0.25\n"  # written when release returns
    path.unlink()
    batch = WriteBatch()
    batch.add(await sink.prepare_release(0.5, "probe"))
    assert not path.exists()  # prepared, not written
    await batch.flush()
    assert path.read_text() == "probe 0.5\n"
    path.unlink()
    async with LocalContext(), FileProgramStateManager(tmp_path / "state") as state:
        await train_model(
            train_process=FakeLearningProcess(),
            train_data_source=FakeDataSource(10),
            train_per_round_clients=3,
            train_total_rounds=7,
            program_state_manager=state,
            model_output_manager=namespace["LinesReleaseManager"](tmp_path / "model.txt"),
            train_metrics_manager=sink,
            checkpoint_every=3,
        )
    keys = [line.split(" ", 1)[0] for line in path.read_text().splitlines()]
    assert keys == [str(round_num) for round_num in range(1, 8)]
