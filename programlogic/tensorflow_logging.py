"""Quieting TensorFlow's start-up lines in programs that import it.

Importing TensorFlow writes lines to standard error from its C++ libraries (absl's
"All log messages before absl::InitializeLog()", oneDNN's, CUDA's and the CPU feature
notes). Some are written before absl reads any setting, so no environment variable
hides them: :func:`quiet_tensorflow` hides those by holding file descriptor 2 while
TensorFlow is imported. Nothing here imports TensorFlow.
"""

from __future__ import annotations

import contextlib
import importlib.abc
import importlib.machinery
import importlib.util
import os
import sys
import tempfile
import threading
import types
import warnings
from collections.abc import Iterator, Sequence
from typing import Any

__all__ = ["quiet_tensorflow"]

_TENSORFLOW = "tensorflow"
_LEVEL = "TF_CPP_MIN_LOG_LEVEL"
_FATAL_ONLY = "3"


def quiet_tensorflow() -> None:
    """Keep TensorFlow's start-up lines off standard error; call it before TensorFlow is
    imported (by ``import tensorflow``, ``import keras`` or ``programlogic.learning``).

    It sets ``TF_CPP_MIN_LOG_LEVEL`` to ``3`` unless the environment sets it (TensorFlow's
    C++ code then logs only fatal errors, its own errors included) and arranges that the
    first import of TensorFlow runs with file descriptor 2 on a temporary file: what the
    import writes there is dropped, or written to standard error if the import raises.
    Whatever else reaches descriptor 2 during that import (other threads' writes, Python
    warnings shown then) is held the same way; exceptions propagate as usual. Calling it
    again before the import changes nothing.

    When TensorFlow was imported before the call, the lines are already written and
    TensorFlow has read its settings: it changes nothing and warns (``UserWarning``)
    that it came too late.
    """
    if _TENSORFLOW in sys.modules:
        warnings.warn(
            "quiet_tensorflow() came too late: TensorFlow was already imported, so its "
            "start-up lines are written and its log level is read; call it before "
            "importing tensorflow, keras or programlogic.learning",
            stacklevel=2,
        )
        return
    os.environ.setdefault(_LEVEL, _FATAL_ONLY)
    if not any(isinstance(finder, _QuietImport) for finder in sys.meta_path):
        sys.meta_path.insert(0, _QuietImport())


class _QuietImport(importlib.abc.MetaPathFinder):
    """Finds TensorFlow once, with a loader that holds descriptor 2 while it runs."""

    def __init__(self) -> None:
        self._finding = threading.local()

    def find_spec(
        self,
        fullname: str,
        path: Sequence[str] | None,
        target: types.ModuleType | None = None,
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname != _TENSORFLOW or getattr(self._finding, "active", False):
            return None
        self._finding.active = True
        try:
            spec = importlib.util.find_spec(fullname)
        finally:
            self._finding.active = False
        with contextlib.suppress(ValueError):  # one import only
            sys.meta_path.remove(self)
        if spec is None or spec.loader is None:
            return spec
        spec.loader = _QuietLoader(spec.loader)
        return spec


class _QuietLoader(importlib.abc.Loader):
    """The loader it wraps, run with descriptor 2 held; afterwards the module names the
    wrapped loader, as if it had been imported without this one."""

    def __init__(self, loader: Any) -> None:
        self._loader = loader

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType | None:
        return self._loader.create_module(spec)

    def exec_module(self, module: types.ModuleType) -> None:
        module.__loader__ = self._loader
        if module.__spec__ is not None:
            module.__spec__.loader = self._loader
        with _descriptor_2_held():
            self._loader.exec_module(module)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._loader, name)


@contextlib.contextmanager
def _descriptor_2_held() -> Iterator[None]:
    """File descriptor 2 on a temporary file while the block runs; what was written there
    goes to standard error only if the block raises."""
    sys.stderr.flush()
    saved = os.dup(2)
    failed = True
    with tempfile.TemporaryFile() as held:
        os.dup2(held.fileno(), 2)
        try:
            yield
            failed = False
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            if failed:
                held.seek(0)
                sys.stderr.write(held.read().decode(errors="replace"))
                sys.stderr.flush()
