"""Optional dependencies, imported on first use."""

from __future__ import annotations

import importlib
from types import ModuleType


def require(module: str, package: str, needed_by: str, extra: str = "learning") -> ModuleType:
    """Import ``module``; when missing, an ImportError that names the ``extra`` to install."""
    try:
        return importlib.import_module(module)
    except ImportError as error:
        raise ImportError(
            f"{needed_by} needs {package}, which is not installed: "
            f"pip install 'programlogic[{extra}]'"
        ) from error
