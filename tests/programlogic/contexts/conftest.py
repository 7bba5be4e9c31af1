"""Fixtures of the backends' tests."""

from __future__ import annotations

import inspect

import pytest


def _make(kind: type[BaseException]) -> BaseException:
    """An instance of ``kind``, its required arguments filled in."""
    arguments: list[object] = []
    for name, parameter in inspect.signature(kind.__init__).parameters.items():
        if name in {"self", "args", "kwargs"} or parameter.default is not inspect.Parameter.empty:
            continue
        if name == "cause":
            arguments.append(ValueError("injected"))
        elif "Optional" in str(parameter.annotation):
            arguments.append(None)
        else:
            arguments.append("injected")
    return kind(*arguments)


class _RayException:
    """Stands for the remote exception a CrossLanguageError wraps."""

    language = 0
    formatted_exception_string = "injected"


@pytest.fixture
def ray_errors() -> list[BaseException]:
    """An instance of every exception type Ray defines (``ray.exceptions.RayError``'s kin)."""
    ray = pytest.importorskip("ray")
    errors: list[BaseException] = []
    for value in vars(ray.exceptions).values():
        if not (inspect.isclass(value) and issubclass(value, ray.exceptions.RayError)):
            continue
        if value is ray.exceptions.CrossLanguageError:
            errors.append(value(_RayException()))
        else:
            errors.append(_make(value))
    return errors
