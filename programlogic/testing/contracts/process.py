"""The contract of :class:`~programlogic.process.LearningProcess`, as tests a process runs.

Subclass :class:`LearningProcessContract` in a test file, name the subclass ``Test...``
and override its ``process`` and ``clients`` fixtures (and ``make_context`` if the
process needs another context than :class:`~programlogic.contexts.local.LocalContext`)::

    import pytest

    from programlogic import InMemoryDataSource
    from programlogic.testing.contracts import LearningProcessContract

    class TestMyProcess(LearningProcessContract):
        @pytest.fixture
        def process(self):
            return MyProcess(learning_rate=0.1)

        @pytest.fixture
        def clients(self):
            return InMemoryDataSource(my_client_data()).all_clients()

A process that describes its configuration (``describe_configuration()``) is also
checked for a JSON-able description, the same for a process built again with the same
arguments (override ``make_process``) and another for another hyperparameter (override
``other_process``); each check is skipped when its fixture is not given.

The suite calls the process as ``train_model`` does: each method may be sync or async,
a sync one runs through the current context (:func:`~programlogic.process.as_async`).
States and weights are compared leaf by leaf, bit for bit, with
:meth:`LearningProcessContract.assert_same`; override it for a process that is
deterministic only up to a tolerance.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from managers.serialization import dumps
from managers.state.base import ProgramStateManager
from managers.state.file import FileProgramStateManager
from managers.state.memory import MemoryProgramStateManager
from managers.structure import flatten, structure_misfit
from programlogic.context import FederatedContext
from programlogic.contexts.local import LocalContext
from programlogic.data import ClientHandle
from programlogic.process import LearningProcess, LearningProcessOutput, as_async
from programlogic.testing.contracts._base import Contract

__all__ = ["LearningProcessContract"]


class LearningProcessContract(Contract):
    """The promises every :class:`~programlogic.process.LearningProcess` keeps.

    Override ``process`` (the process under test) and ``clients`` (the client handles
    of one round, at least one); override ``make_context`` for a process that runs in
    a particular context. Every round of the suite runs on the same ``clients``.

    Every test runs beside the loop watchdog of
    :class:`~programlogic.testing.contracts.Contract`: a process's work runs off the
    event loop, and the suite fails a test during which the loop stalled longer than
    :attr:`loop_stall_limit`.
    """

    loop_stall_limit: float | None = 1.0
    """The longest the event loop may stall while a test runs, in seconds. Longer than
    the other suites' bound: a process's work traces and compiles graphs in worker
    threads, in Python that holds the GIL, and on a loaded machine the loop waits for it
    a few tenths of a second; a round computed on the loop itself still fails."""

    @pytest.fixture
    def process(self) -> LearningProcess:
        """The learning process under test (override this fixture)."""
        pytest.fail(f"{type(self).__name__} must override the process fixture")

    @pytest.fixture
    def clients(self) -> Sequence[ClientHandle]:
        """The client handles of a round (override this fixture)."""
        pytest.fail(f"{type(self).__name__} must override the clients fixture")

    @pytest.fixture
    def make_process(self) -> Callable[[], LearningProcess] | None:
        """A callable building the process again with the same arguments (optional)."""
        return None

    @pytest.fixture
    def other_process(self) -> LearningProcess | None:
        """The process built with one hyperparameter changed (optional)."""
        return None

    @pytest.fixture
    def make_context(self) -> Callable[[], FederatedContext]:
        """A callable building the context the process runs in (a LocalContext of 2 workers)."""
        return lambda: LocalContext(max_workers=2)

    @pytest.fixture
    async def context(
        self, make_context: Callable[[], FederatedContext]
    ) -> AsyncIterator[FederatedContext]:
        """The entered context of the test."""
        async with make_context() as context:
            yield context

    @pytest.fixture(params=["memory", "file"])
    async def state_manager(
        self, request: pytest.FixtureRequest, tmp_path: Path
    ) -> AsyncIterator[ProgramStateManager]:
        """The program-state managers a resume goes through: in memory and on files."""
        manager: ProgramStateManager
        if request.param == "memory":
            manager = MemoryProgramStateManager()
        else:
            manager = FileProgramStateManager(tmp_path / "state")
        async with manager:
            yield manager

    def assert_same(self, actual: Any, expected: Any) -> None:
        """Fail unless two states, weights or metrics hold equal leaves under equal paths."""
        actual_leaves, expected_leaves = flatten(actual), flatten(expected)
        assert [p for p, _ in actual_leaves] == [p for p, _ in expected_leaves]
        for (path, a), (_, e) in zip(actual_leaves, expected_leaves, strict=True):
            a_array, e_array = np.asarray(a), np.asarray(e)
            assert (a_array.dtype, a_array.shape) == (e_array.dtype, e_array.shape), path
            if a_array.dtype.kind in "fc":
                np.testing.assert_array_equal(a_array, e_array, err_msg=path)
            else:
                assert a_array.tolist() == e_array.tolist(), path

    # Rounds.

    async def test_next_returns_a_new_state_and_metrics_as_a_structure(
        self,
        process: LearningProcess,
        clients: Sequence[ClientHandle],
        context: FederatedContext,
    ) -> None:
        state = await as_async(process.initialize)()
        output = await as_async(process.next)(state, clients)
        assert isinstance(output, LearningProcessOutput)
        paths = [path for path, _ in flatten(output.metrics)]
        assert paths, "next returned no metrics"
        assert all(isinstance(path, str) and path for path in paths)
        dumps(output.metrics)  # train_model saves a round's metrics with its checkpoint
        assert flatten(output.state), "next returned an empty state"

    async def test_next_keeps_the_structure_of_the_initial_state(
        self,
        process: LearningProcess,
        clients: Sequence[ClientHandle],
        context: FederatedContext,
    ) -> None:
        # train_model refuses to resume a saved state of another structure than the
        # initial state's: a state whose paths, shapes or dtypes drift could not resume.
        initial = await as_async(process.initialize)()
        state = (await as_async(process.next)(initial, clients)).state
        misfit = structure_misfit(state, initial)
        assert misfit is None, (
            "the state after a round must keep the paths, shapes and dtypes of the "
            f"initial state; at {misfit.replace('this run', 'initial state')}"
        )

    async def test_next_does_not_change_the_state_it_was_given(
        self,
        process: LearningProcess,
        clients: Sequence[ClientHandle],
        context: FederatedContext,
    ) -> None:
        state = await as_async(process.initialize)()
        before = dumps(state)
        await as_async(process.next)(state, clients)
        assert dumps(state) == before

    async def test_next_is_deterministic_for_the_same_state_and_clients(
        self,
        process: LearningProcess,
        clients: Sequence[ClientHandle],
        context: FederatedContext,
    ) -> None:
        state = await as_async(process.initialize)()
        first = await as_async(process.next)(state, clients)
        second = await as_async(process.next)(state, clients)
        self.assert_same(second.state, first.state)
        self.assert_same(second.metrics, first.metrics)

    # Weights.

    async def test_set_model_weights_then_get_model_weights_round_trips(
        self,
        process: LearningProcess,
        clients: Sequence[ClientHandle],
        context: FederatedContext,
    ) -> None:
        get_weights = as_async(process.get_model_weights)
        set_weights = as_async(process.set_model_weights)
        initial = await as_async(process.initialize)()
        trained = (await as_async(process.next)(initial, clients)).state
        weights = await get_weights(trained)
        self.assert_same(await get_weights(await set_weights(trained, weights)), weights)
        moved = await set_weights(initial, weights)
        self.assert_same(await get_weights(moved), weights)

    # Resuming.

    async def test_a_state_saved_and_loaded_back_resumes_to_the_same_round(
        self,
        process: LearningProcess,
        clients: Sequence[ClientHandle],
        context: FederatedContext,
        state_manager: ProgramStateManager,
    ) -> None:
        next_round = as_async(process.next)
        initial = await as_async(process.initialize)()
        first = await next_round(initial, clients)
        second = await next_round(first.state, clients)
        await state_manager.save({"train_state": initial}, 0)
        await state_manager.save({"train_state": first.state}, 1)
        loaded, version = await state_manager.load_latest({"train_state": initial})
        assert version == 1
        self.assert_same(loaded["train_state"], first.state)
        resumed = await next_round(loaded["train_state"], clients)
        self.assert_same(resumed.state, second.state)
        self.assert_same(resumed.metrics, second.metrics)

    # Describing the configuration.

    async def test_a_configuration_description_is_a_json_dict_the_same_each_time(
        self, process: LearningProcess
    ) -> None:
        description = _description(process)
        assert isinstance(description, dict), (
            f"describe_configuration() must return a dict or None, got {description!r}"
        )
        assert json.loads(json.dumps(description, allow_nan=False)) == description, (
            "describe_configuration() must return JSON: str keys; dicts, lists, str, int, "
            f"float, bool and None values; got {description!r}"
        )
        assert _description(process) == description

    async def test_a_process_built_again_describes_the_same_configuration(
        self,
        process: LearningProcess,
        make_process: Callable[[], LearningProcess] | None,
    ) -> None:
        if make_process is None:
            pytest.skip(f"{type(self).__name__} does not override make_process")
        assert _description(make_process()) == _description(process), (
            "a process built with the same arguments must describe the same configuration "
            "(no object ids, generated names or text that changes between builds)"
        )

    async def test_another_hyperparameter_describes_another_configuration(
        self, process: LearningProcess, other_process: LearningProcess | None
    ) -> None:
        if other_process is None:
            pytest.skip(f"{type(self).__name__} does not override other_process")
        description = _description(process)
        assert _description(other_process) != description, (
            "a process built with another hyperparameter describes the same configuration: "
            f"{description!r}"
        )


def _description(process: LearningProcess) -> Any:
    """What ``process`` describes of its configuration; skips a process that does not."""
    describe = getattr(process, "describe_configuration", None)
    description = None if describe is None else describe()
    if description is None:
        pytest.skip(f"{type(process).__name__} does not describe its configuration")
    return description
