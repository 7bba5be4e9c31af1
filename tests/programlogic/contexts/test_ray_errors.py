"""Ray's errors reach the users of RayContext only as ours.

Two halves: every exception type Ray defines goes through the one table
(``programlogic.contexts.ray._errors``) to one of ours; and every call of Ray in the
package is made where that table applies: inside a function the session runs for the
package (which hands it the ``ray`` module), or in the session's wait for a result.
A new exception type in Ray, or a call of Ray made around the seam, fails here.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ray = pytest.importorskip("ray")

from programlogic.contexts.ray._errors import translate  # noqa: E402
from programlogic.exceptions import (  # noqa: E402
    ClientError,
    ClusterConnectionError,
    ProgramLogicError,
)

pytestmark = pytest.mark.anyio

PACKAGE = Path(__file__).resolve().parents[3] / "programlogic" / "contexts" / "ray"

SEAM = "_session.py"
"""The module that holds the ``ray`` module and hands it to the functions it runs."""

ACTOR_BODY = "_worker.py"
"""Runs inside the actors: Ray's errors there reach the driver as the unit's error."""


async def test_every_error_of_ray_becomes_ours(ray_errors: list[BaseException]) -> None:
    assert len(ray_errors) > 30  # every type Ray defines
    for error in ray_errors:
        translated = translate(ray, error, "do something", ["a"])
        assert isinstance(translated, ProgramLogicError), type(error)
        assert translated.__cause__ is error or isinstance(error, ray.exceptions.RayTaskError)


async def test_client_work_that_raised_is_a_client_error_naming_the_clients() -> None:
    cause = ValueError("no data")
    translated = translate(ray, ray.exceptions.RayTaskError("run_unit", "tb", cause), "x", ["a"])
    assert isinstance(translated, ClientError)
    assert (translated.client_ids, translated.error) == (("a",), cause)


async def test_a_client_error_raised_on_an_actor_comes_back_as_it_was_raised() -> None:
    raised = ClientError(["c3"], ZeroDivisionError("no examples on c3"))
    error = ray.exceptions.RayTaskError("run_unit", "tb", raised).as_instanceof_cause()
    assert isinstance(error, ClientError)  # Ray's error is also of its cause's kind
    translated = translate(ray, error, "compute a unit of work", ["c3"])
    assert translated is raised
    assert translated.__cause__ is raised.error


async def test_an_unreachable_cluster_is_a_cluster_connection_error() -> None:
    error = ConnectionError("no cluster at 10.0.0.1:6379")
    translated = translate(ray, error, "connect to the Ray cluster at '10.0.0.1:6379'")
    assert isinstance(translated, ClusterConnectionError)
    assert str(translated) == (
        "RayContext could not connect to the Ray cluster at '10.0.0.1:6379': "
        "no cluster at 10.0.0.1:6379"
    )
    assert translated.__cause__ is error


@pytest.mark.parametrize(
    "error", [TypeError("Could not serialize the put value"), ClientError(["a"], ValueError())]
)
async def test_a_value_ray_cannot_serialize_and_our_own_errors_stay_what_they_are(error) -> None:
    assert translate(ray, error, "put a value") is error


def modules() -> list[Path]:
    return sorted(path for path in PACKAGE.glob("*.py") if path.name != ACTOR_BODY)


def is_ray_call(node: ast.AST) -> bool:
    """A call of the ``ray`` module, of an actor's method, or for a result's future."""
    if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Attribute):
        return False
    of_ray = isinstance(node.func.value, ast.Name) and node.func.value.id == "ray"
    return of_ray or node.func.attr in {"remote", "future", "options"}


def calls_outside_the_seam(tree: ast.AST, where: str) -> list[str]:
    """The Ray calls of ``tree`` in no function that is handed the ``ray`` module."""
    found = []

    def visit(node: ast.AST, seam: bool) -> None:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda):
            names = {argument.arg for argument in node.args.args}
            waits = where == SEAM and getattr(node, "name", "") == "wait"
            seam = seam or "ray" in names or waits
        if is_ray_call(node) and not seam:
            found.append(f"{where}:{node.lineno}: {ast.unparse(node)}")
        for child in ast.iter_child_nodes(node):
            visit(child, seam)

    visit(tree, False)
    return found


async def test_every_call_of_ray_goes_through_the_session() -> None:
    outside = []
    for path in modules():
        tree = ast.parse(path.read_text())
        outside += calls_outside_the_seam(tree, path.name)
        if path.name == SEAM:
            continue
        for node in ast.walk(tree):
            imported = isinstance(node, ast.Import) and "ray" in {a.name for a in node.names}
            reads_ray = isinstance(node, ast.Attribute) and node.attr == "ray"
            if imported or reads_ray or (isinstance(node, ast.Name) and node.id == "import_ray"):
                outside.append(f"{path.name}:{node.lineno}: gets the ray module itself")
    assert outside == []
    assert SEAM in {path.name for path in modules()}
