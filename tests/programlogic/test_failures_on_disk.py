"""Failures with state on disk reach the caller as raised, run after run.

A disk that stops taking bytes mid-run: train_model fails with the OSError alone.

The file size limit of the process (``RLIMIT_FSIZE``, with ``SIGXFSZ`` ignored) makes
every write past its first bytes fail with ``EFBIG``, as a full disk fails with
``ENOSPC``: a real error of the operating system, from the real file managers. It is
set by the process in the middle of a round, while the previous round's save may be
writing, so the runs are repeated to meet both orders of that race. The error used to
reach the caller as ``ExceptionGroup[BrokenResourceError, OSError]``.

An exception group the learning process raises itself reaches the caller whole, also
while a file state manager is saving the previous round.
"""

from __future__ import annotations

import contextlib
import errno
import resource
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from managers import CSVFileReleaseManager, MemoryProgramStateManager, MemoryReleaseManager
from managers.state.file import FileProgramStateManager
from programlogic import LocalContext, train_model
from programlogic.testing import FakeDataSource, FakeLearningProcess

pytestmark = pytest.mark.anyio

REPEATS = 20
FULL_FROM_ROUND = 3


class FillsTheDisk(FakeLearningProcess):
    """A process that, computing round ``FULL_FROM_ROUND``, lets files take no more bytes."""

    async def next(self, state: Any, clients: Any) -> Any:
        if state["rounds"] + 1 == FULL_FROM_ROUND:
            _, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
            resource.setrlimit(resource.RLIMIT_FSIZE, (1, hard))
        return await super().next(state, clients)


@contextlib.contextmanager
def file_size_limit_restored() -> Iterator[None]:
    """Ignore SIGXFSZ (a write past the limit fails instead) and restore the limit after."""
    limits = resource.getrlimit(resource.RLIMIT_FSIZE)
    handler = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, limits)
        signal.signal(signal.SIGXFSZ, handler)


@pytest.mark.parametrize("failing", ["save", "metrics release"])
async def test_a_full_disk_fails_train_model_with_the_os_error_alone(
    tmp_path: Path, failing: str
) -> None:
    for attempt in range(REPEATS):
        root = tmp_path / str(attempt)
        if failing == "save":
            state: Any = FileProgramStateManager(root / "state")
            metrics: Any = MemoryReleaseManager()
        else:
            state = MemoryProgramStateManager()
            metrics = CSVFileReleaseManager(root / "metrics.csv")
        with file_size_limit_restored(), pytest.raises(OSError) as caught:
            async with LocalContext(max_workers=2), state, metrics:
                await train_model(
                    train_process=FillsTheDisk(),
                    train_data_source=FakeDataSource(6),
                    train_per_round_clients=2,
                    train_total_rounds=6,
                    program_state_manager=state,
                    model_output_manager=MemoryReleaseManager(),
                    train_metrics_manager=metrics,
                )
        assert type(caught.value) is OSError, repr(caught.value)
        assert caught.value.errno == errno.EFBIG
        if failing == "save":
            async with FileProgramStateManager(root / "state") as again:  # not locked
                assert max(await again.get_versions()) < FULL_FROM_ROUND


class Diverging(FakeLearningProcess):
    """A process that raises its own exception group computing round ``FULL_FROM_ROUND``."""

    def __init__(self, error: BaseExceptionGroup) -> None:
        super().__init__()
        self.error = error

    async def next(self, state: Any, clients: Any) -> Any:
        if state["rounds"] + 1 == FULL_FROM_ROUND:
            raise self.error
        return await super().next(state, clients)


async def test_with_state_on_disk_a_process_exception_group_reaches_the_caller_whole(
    tmp_path: Path,
) -> None:
    for attempt in range(REPEATS):
        error = ExceptionGroup("clients diverged", [ArithmeticError("client_1")])
        with pytest.raises(ExceptionGroup) as caught:
            async with (
                LocalContext(max_workers=2),
                FileProgramStateManager(tmp_path / str(attempt)) as state,
            ):
                await train_model(
                    train_process=Diverging(error),
                    train_data_source=FakeDataSource(6),
                    train_per_round_clients=2,
                    train_total_rounds=6,
                    program_state_manager=state,
                    model_output_manager=MemoryReleaseManager(),
                    train_metrics_manager=MemoryReleaseManager(),
                )
        assert caught.value is error
