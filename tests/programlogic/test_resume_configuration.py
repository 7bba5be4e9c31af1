"""A resume is refused when the run's state or configuration is not the saved run's.

The saved train state's structure (paths, shapes, dtypes) must be the process's; the
configuration a process and a data source describe (``describe_configuration()``) is
kept in every checkpoint and compared, unless the caller lets it change on purpose.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from managers import FileProgramStateManager, MemoryProgramStateManager, MemoryReleaseManager
from programlogic import Checkpoint, LocalContext, ResumeError, train_model
from programlogic.testing import FakeDataSource, FakeLearningProcess

pytestmark = pytest.mark.anyio

ROUNDS = 3


class Run:
    """The state and releases of one program, kept across its reruns."""

    def __init__(self) -> None:
        self.state = MemoryProgramStateManager()
        self.models = MemoryReleaseManager()

    async def train(self, **overrides: Any):
        arguments: dict[str, Any] = {
            "train_process": FakeLearningProcess(),
            "train_data_source": FakeDataSource(10),
            "train_per_round_clients": 3,
            "train_total_rounds": ROUNDS,
            "program_state_manager": self.state,
            "model_output_manager": self.models,
            "seed": 11,
        }
        arguments.update(overrides)
        async with LocalContext():
            return await train_model(**arguments)

    async def latest(self) -> Checkpoint:
        saved, version = await self.state.load_latest()
        return Checkpoint.from_saved(saved, version)


class Undescribed:
    """A learning process that does not describe its configuration (as the TFF adapter's)."""

    def __init__(self, learning_rate: float) -> None:
        self.inner = FakeLearningProcess(learning_rate=learning_rate)

    async def initialize(self) -> Any:
        return await self.inner.initialize()

    async def next(self, state: Any, clients: Any) -> Any:
        return await self.inner.next(state, clients)

    async def get_model_weights(self, state: Any) -> Any:
        return await self.inner.get_model_weights(state)

    async def set_model_weights(self, state: Any, weights: Any) -> Any:
        return await self.inner.set_model_weights(state, weights)


class WithMomentum(FakeLearningProcess):
    """A process whose state holds one more array than the fake's."""

    async def initialize(self) -> dict[str, Any]:
        return {**await super().initialize(), "momentum": np.zeros(self.dim)}


class Layered(FakeLearningProcess):
    """A process whose state holds a list of ``layers`` arrays besides the fake's."""

    def __init__(self, layers: int) -> None:
        super().__init__()
        self.layers = layers

    async def initialize(self) -> dict[str, Any]:
        return {**await super().initialize(), "layers": [np.zeros(2)] * self.layers}

    async def next(self, state: dict[str, Any], clients: Any) -> Any:
        own = {"weights": state["weights"], "rounds": state["rounds"]}
        output = await super().next(own, clients)
        return type(output)({**output.state, "layers": state["layers"]}, output.metrics)


def escaped(text: str) -> str:
    return re.escape(text)


async def test_resuming_with_another_state_shape_is_refused_naming_the_path_and_shapes() -> None:
    # It used to fail in the first round, with NumPy's "operands could not be broadcast".
    run = Run()
    await run.train()
    with pytest.raises(ResumeError) as caught:
        await run.train(train_process=FakeLearningProcess(dim=3), train_total_rounds=5)
    message = str(caught.value)
    assert "round 3" in message
    assert "weights: shape (2,) float64 (this run: shape (3,) float64)" in message
    assert await run.state.get_versions() == [0, 1, 2, 3]


async def test_resuming_with_another_state_structure_is_refused_naming_the_path() -> None:
    run = Run()
    await run.train()
    with pytest.raises(ResumeError, match=escaped("momentum: nothing (this run: shape (2,)")):
        await run.train(train_process=WithMomentum(), train_total_rounds=5)


@pytest.mark.parametrize("state", ["memory", "file"])
async def test_resuming_a_state_with_more_arrays_in_a_list_is_refused_naming_the_path(
    state: str, tmp_path: Path
) -> None:
    # It used to fail in the state manager's load: "unflatten needs 3 leaves".
    run = Run()
    if state == "file":
        run.state = FileProgramStateManager(tmp_path / "state")
    async with run.state:
        await run.train(train_process=Layered(2))
        with pytest.raises(ResumeError, match=escaped("layers/2: nothing (this run: shape (2,)")):
            await run.train(train_process=Layered(3), train_total_rounds=5)
        with pytest.raises(ResumeError, match=escaped("layers/1: shape (2,) float64 (this run")):
            await run.train(train_process=Layered(1), train_total_rounds=5)


async def test_letting_the_configuration_change_does_not_let_the_state_change() -> None:
    run = Run()
    await run.train()
    with pytest.raises(ResumeError, match=escaped("weights: shape (2,) float64")):
        await run.train(
            train_process=FakeLearningProcess(dim=3),
            train_total_rounds=5,
            resume_with_changed_configuration=True,
        )
    with pytest.raises(ResumeError, match=escaped("seed=11 (this run: 12)")):
        await run.train(seed=12, train_total_rounds=5, resume_with_changed_configuration=True)


async def test_every_checkpoint_holds_the_configuration_as_json() -> None:
    run = Run()
    await run.train()
    configuration = (await run.latest()).configuration
    assert configuration["process"] == {"dim": 2, "learning_rate": 0.5}
    assert set(configuration["data"]) == {"client_data_shapes_sha256"}
    assert json.loads(json.dumps(configuration)) == configuration


async def test_resuming_with_another_learning_rate_is_refused_naming_it() -> None:
    run = Run()
    await run.train()
    with pytest.raises(ResumeError) as caught:
        await run.train(train_process=FakeLearningProcess(learning_rate=0.25), train_total_rounds=5)
    message = str(caught.value)
    assert "process/learning_rate=0.5 (this run: 0.25)" in message
    assert "resume_with_changed_configuration=True" in message


async def test_resuming_with_other_client_data_is_refused() -> None:
    run = Run()
    await run.train()
    with pytest.raises(ResumeError, match="data/client_data_shapes_sha256="):
        await run.train(
            train_data_source=FakeDataSource(10, examples_per_client=6), train_total_rounds=5
        )


async def test_a_changed_configuration_continues_on_purpose_and_is_saved() -> None:
    run = Run()
    await run.train()
    lowered = FakeLearningProcess(learning_rate=0.25)
    result = await run.train(
        train_process=lowered, train_total_rounds=5, resume_with_changed_configuration=True
    )
    assert result.resumed_from == ROUNDS and result.round_num == 5
    assert (await run.latest()).configuration["process"]["learning_rate"] == 0.25
    # The new configuration is the run's now: the same one resumes, the old one is refused.
    result = await run.train(train_process=lowered, train_total_rounds=6)
    assert result.resumed_from == 5
    with pytest.raises(ResumeError, match=escaped("learning_rate=0.25 (this run: 0.5)")):
        await run.train(train_total_rounds=7)


async def test_the_same_configuration_resumes_to_the_uninterrupted_end() -> None:
    reference = Run()
    await reference.train(train_total_rounds=5)
    run = Run()
    await run.train()
    result = await run.train(train_total_rounds=5)
    assert result.resumed_from == ROUNDS
    np.testing.assert_array_equal(
        run.models.values()["final_training_checkpoint_round_5"],
        reference.models.values()["final_training_checkpoint_round_5"],
    )


async def test_a_process_that_does_not_describe_itself_is_not_compared() -> None:
    run = Run()
    await run.train(train_process=Undescribed(0.5))
    assert (await run.latest()).configuration["process"] is None
    result = await run.train(train_process=Undescribed(0.25), train_total_rounds=5)
    assert result.resumed_from == ROUNDS


async def test_a_checkpoint_without_a_configuration_resumes_and_then_holds_one() -> None:
    # Checkpoints written before the configuration was recorded (format version 1 too).
    run = Run()
    await run.train()
    old = MemoryProgramStateManager()
    saved, version = await run.state.load_latest()
    await old.save({key: value for key, value in saved.items() if key != "configuration"}, version)
    run.state = old
    assert (await run.latest()).configuration is None
    result = await run.train(
        train_process=FakeLearningProcess(learning_rate=0.25), train_total_rounds=4
    )
    assert result.resumed_from == ROUNDS
    assert (await run.latest()).configuration["process"]["learning_rate"] == 0.25


class BadlyDescribed(FakeLearningProcess):
    def __init__(self, description: Any) -> None:
        super().__init__()
        self.description = description

    def describe_configuration(self) -> Any:
        return self.description


@pytest.mark.parametrize(
    ("description", "error", "message"),
    [
        ("lr=0.5", TypeError, "must return a dict or None, got str"),
        ({"rate": np.float32(0.5)}, TypeError, "must return a JSON-able dict"),
        ({1: 0.5}, TypeError, "must return a JSON-able dict"),
    ],
)
async def test_a_description_that_is_not_a_json_dict_is_a_type_error(
    description: Any, error: type[Exception], message: str
) -> None:
    with pytest.raises(error, match=r"train_process\.describe_configuration\(\) " + message):
        await Run().train(train_process=BadlyDescribed(description))


async def test_the_argument_must_be_a_bool() -> None:
    with pytest.raises(TypeError, match="resume_with_changed_configuration must be a bool"):
        await Run().train(resume_with_changed_configuration=1)
