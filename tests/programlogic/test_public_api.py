import importlib
import inspect
import subprocess
import sys

import pytest

import managers
import programlogic
import programlogic.privacy as privacy
import programlogic.testing
from tests.programlogic.needs_learning import NEEDS_LEARNING

pytestmark = pytest.mark.anyio


@pytest.mark.parametrize(
    "module",
    [programlogic, managers, programlogic.testing, programlogic.tasks, programlogic.contexts],
)
async def test_all_is_sorted_and_every_name_resolves(module) -> None:
    assert module.__all__ == sorted(module.__all__)
    for name in module.__all__:
        assert getattr(module, name) is not None


async def test_the_top_level_exports_what_users_need() -> None:
    needed = {
        "FederatedContext",
        "LocalContext",
        "get_context",
        "check_in_federated_context",
        "LearningProcess",
        "LearningProcessOutput",
        "FederatedDataSource",
        "InMemoryDataSource",
        "ClientHandle",
        "train_model",
        "ClusterConnectionError",
        "NotEnoughClientsError",
        "count_dropped_clients",
    }
    assert needed <= set(programlogic.__all__)


async def test_every_public_class_and_function_of_the_package_is_exported() -> None:
    modules = [
        programlogic.training.checkpoint,
        programlogic.context,
        programlogic.contexts.local,
        programlogic.data,
        programlogic.evaluation,
        programlogic.exceptions,
        programlogic.process,
        programlogic.runner,
        programlogic.stopping,
        programlogic.tensorflow_logging,
        programlogic.training,
    ]
    for module in modules:
        for name in module.__all__:
            assert name in programlogic.__all__ or not (
                inspect.isclass(getattr(module, name)) or inspect.isfunction(getattr(module, name))
            ), f"{module.__name__}.{name} is not exported by programlogic"


async def test_every_public_name_has_a_docstring() -> None:
    for module in (programlogic, managers, programlogic.testing, programlogic.tasks, privacy):
        for name in module.__all__:
            value = getattr(module, name)
            if inspect.isclass(value) or inspect.isfunction(value):
                assert inspect.getdoc(value), f"{module.__name__}.{name} has no docstring"


async def test_the_ray_context_is_public_in_its_own_module() -> None:
    ray_module = pytest.importorskip("programlogic.contexts.ray")
    assert ray_module.__all__ == ["RayContext"]
    assert inspect.getdoc(ray_module.RayContext)
    assert issubclass(ray_module.RayContext, programlogic.FederatedContext)


async def test_importing_programlogic_never_imports_the_optional_tff_backend() -> None:
    # programlogic.contexts.tff needs TensorFlow Federated (tests_tff/ tests it in its
    # own environment); the core must not import it, in a fresh interpreter.
    code = (
        "import sys, programlogic, programlogic.contexts;"
        "print(sorted(m for m in sys.modules if m.startswith("
        "('programlogic.contexts.tff', 'tensorflow_federated'))))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


@pytest.mark.parametrize(
    ("module", "former", "path"),
    [
        ("programlogic", "Clock", "managers.clock.Clock"),
        ("programlogic", "SystemClock", "managers.clock.SystemClock"),
        ("programlogic", "as_async", "programlogic.process.as_async"),
        ("programlogic", "evaluation_seed", "programlogic.evaluation.evaluation_seed"),
        (
            "programlogic.datasets",
            "HDF5ClientLoader",
            "programlogic.datasets.emnist.HDF5ClientLoader",
        ),
        ("programlogic.datasets", "writer_forms", "programlogic.datasets.digits.writer_forms"),
        pytest.param(
            "programlogic.learning",
            "MAX_CLIENTS_PER_GROUP",
            "programlogic.learning.fed_avg.MAX_CLIENTS_PER_GROUP",
            marks=NEEDS_LEARNING,
        ),
        pytest.param(
            "programlogic.learning",
            "plan_group_size",
            "programlogic.learning.fed_avg.plan_group_size",
            marks=NEEDS_LEARNING,
        ),
        pytest.param(
            "programlogic.learning",
            "SUPPORTED_METRICS",
            "programlogic.learning.keras_model.SUPPORTED_METRICS",
            marks=NEEDS_LEARNING,
        ),
    ],
)
async def test_a_name_lives_in_its_one_place_only(module: str, former: str, path: str) -> None:
    old_module = importlib.import_module(module)
    new_module, _, name = path.rpartition(".")
    assert getattr(importlib.import_module(new_module), name) is not None
    assert not hasattr(old_module, former), f"{module}.{former} is a second name of {path}"
    assert former not in old_module.__all__


async def test_the_deprecated_clock_module_is_gone() -> None:
    with pytest.raises(ModuleNotFoundError):
        importlib.import_module("programlogic.clock")


async def test_clocks_are_exported_by_managers_only() -> None:
    import programlogic.managers

    assert {"Clock", "SystemClock"} <= set(managers.__all__)
    assert programlogic.managers.Clock is managers.clock.Clock
    assert not {"Clock", "SystemClock"} & set(programlogic.__all__)


async def test_task_groups_live_in_managers_taskgroups_only() -> None:
    import managers.taskgroups

    assert {"task_group", "collapse"} <= set(managers.taskgroups.__all__)
    assert not {"task_group", "collapse"} & set(programlogic.tasks.__all__)
