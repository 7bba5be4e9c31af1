import asyncio
import signal
import subprocess
import sys
import textwrap
import threading
import time

import anyio
import anyio.to_thread
import pytest

import programlogic
from managers import FileProgramStateManager

pytestmark = pytest.mark.anyio


async def _answer(thread_names: list[str]) -> int:
    await anyio.sleep(0.01)
    thread_names.append(threading.current_thread().name)
    return 42


@pytest.mark.parametrize("backend", ["asyncio", "trio"])
async def test_runs_a_program_from_plain_sync_code(backend):
    threads: list[str] = []

    def sync_code() -> tuple[int, str]:
        return programlogic.run(_answer(threads), backend=backend), threading.current_thread().name

    result, caller = await anyio.to_thread.run_sync(sync_code)
    assert result == 42
    assert threads == [caller]  # no loop ran in the caller's thread: the program ran there


@pytest.mark.parametrize("backend", ["asyncio", "trio"])
async def test_runs_a_program_where_an_event_loop_is_already_running(backend):
    # A thread whose event loop runs a "cell" that calls run() synchronously, as Jupyter does.
    threads: list[str] = []

    async def notebook_cell() -> tuple[int, str]:
        return programlogic.run(_answer(threads), backend=backend), threading.current_thread().name

    result, cell_thread = await anyio.to_thread.run_sync(asyncio.run, notebook_cell())
    assert result == 42
    assert len(threads) == 1 and threads[0] != cell_thread


async def test_exceptions_of_the_program_propagate():
    async def failing() -> None:
        raise LookupError("no such client")

    def sync_code() -> None:
        programlogic.run(failing())

    with pytest.raises(LookupError, match="no such client"):
        await anyio.to_thread.run_sync(sync_code)

    async def notebook_cell() -> None:
        programlogic.run(failing())

    with pytest.raises(LookupError, match="no such client"):
        await anyio.to_thread.run_sync(asyncio.run, notebook_cell())


async def test_a_coroutine_function_instead_of_a_coroutine_is_a_type_error():
    with pytest.raises(TypeError, match=r"got function \(call it: pass main\(\), not main\)"):
        programlogic.run(_answer)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="program must be a coroutine, got int"):
        programlogic.run(3)  # type: ignore[arg-type]


async def test_an_unknown_backend_is_a_value_error_and_the_coroutine_is_closed():
    program = _answer([])
    with pytest.raises(ValueError, match="backend must be one of 'asyncio', 'trio', got 'curio'"):
        programlogic.run(program, backend="curio")  # type: ignore[arg-type]
    assert program.cr_frame is None  # closed: no "never awaited" warning later


# A training program run the way a notebook runs it: run() called from code that an
# already running event loop executes, in the main thread, where Ctrl-C lands.
_INTERRUPTED_PROGRAM = textwrap.dedent(
    """
    import asyncio, signal, sys

    import programlogic
    from managers import FileProgramStateManager, MemoryReleaseManager
    from programlogic import LocalContext, train_model
    from programlogic.testing import FakeDataSource, FakeLearningProcess

    signal.signal(signal.SIGINT, signal.default_int_handler)
    root, mode, rounds = sys.argv[1], sys.argv[2], int(sys.argv[3])

    class Progress(MemoryReleaseManager):
        async def release(self, value, key):
            await super().release(value, key)
            print(key, flush=True)

    async def train():
        async with (
            LocalContext(max_workers=1),
            FileProgramStateManager(root, keep_total=2) as state,
        ):
            result = await train_model(
                train_process=FakeLearningProcess(),
                train_data_source=FakeDataSource(),
                train_per_round_clients=3,
                train_total_rounds=rounds,
                program_state_manager=state,
                model_output_manager=MemoryReleaseManager(),
                train_metrics_manager=Progress(),
                seed=1,
            )
        return result.round_num

    async def notebook_cell():
        return programlogic.run(train())

    try:
        if mode == "notebook":  # like Jupyter's kernel: a loop with no SIGINT handler of its own
            done = asyncio.new_event_loop().run_until_complete(notebook_cell())
        elif mode == "asyncio.run":  # its loop cancels its main task on SIGINT instead
            done = asyncio.run(notebook_cell())
        else:
            done = programlogic.run(train())
    except KeyboardInterrupt:
        print("interrupted", flush=True)
        sys.exit(3)
    print("finished", done, flush=True)
    """
)


@pytest.fixture
def anyio_backend():
    return "asyncio"  # the test drives a subprocess; one backend suffices


@pytest.mark.parametrize("mode", ["notebook", "asyncio.run", "script"])
async def test_ctrl_c_cancels_the_program_and_leaves_a_loadable_checkpoint(tmp_path, mode):
    root = tmp_path / "state"
    command = [sys.executable, "-c", _INTERRUPTED_PROGRAM, str(root), mode]
    running = subprocess.Popen(
        [*command, "100000"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        assert running.stdout is not None
        lines = []
        deadline = time.monotonic() + 60  # a hang guard: success does not depend on it
        while len(lines) < 5:  # rounds are released: the program is well under way
            assert time.monotonic() < deadline, running.stderr.read() if running.stderr else ""
            lines.append(running.stdout.readline().strip())
        running.send_signal(signal.SIGINT)
        out, err = running.communicate(timeout=60)
    finally:
        running.kill()
    assert running.returncode == 3, err
    assert out.strip().splitlines()[-1] == "interrupted"

    async with FileProgramStateManager(root) as state:
        checkpoint, stopped_at = await state.load_latest()
    assert checkpoint["train_state"]["rounds"] == stopped_at >= 5
    resumed = subprocess.run(
        [*command, str(stopped_at + 2)], capture_output=True, text=True, timeout=120
    )
    assert resumed.returncode == 0, resumed.stderr
    # A resumed program releases its checkpoint's round again, then goes on after it.
    released = [str(round_num) for round_num in range(stopped_at, stopped_at + 3)]
    assert resumed.stdout.split() == [*released, "finished", str(stopped_at + 2)]
