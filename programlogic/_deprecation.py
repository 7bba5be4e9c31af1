"""Old import paths that keep working: a module ``__getattr__`` that warns and redirects."""

from __future__ import annotations

import importlib
import warnings
from collections.abc import Callable, Mapping
from typing import Any


def moved_names(module: str, moved: Mapping[str, str]) -> Callable[[str], Any]:
    """A ``__getattr__`` for ``module`` that gives each old name's object with a warning.

    ``moved`` maps an old name of ``module`` to the dotted path of the object now
    (``"programlogic.process.as_async"``). Reading an old name emits a
    ``DeprecationWarning`` that names the new path; other missing names raise
    ``AttributeError`` as usual.
    """

    def __getattr__(name: str) -> Any:
        if name not in moved:
            raise AttributeError(f"module {module!r} has no attribute {name!r}")
        path = moved[name]
        warnings.warn(
            f"{module}.{name} is deprecated: use {path}", DeprecationWarning, stacklevel=2
        )
        new_module, _, new_name = path.rpartition(".")
        return getattr(importlib.import_module(new_module), new_name)

    return __getattr__
