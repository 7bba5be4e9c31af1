"""The main job's start: TensorFlow imported quietly, and without what Keras imports for
integrations the job does not use.

TensorFlow's shared libraries write start-up lines to file descriptor 2 as they load
("WARNING: All log messages before absl::InitializeLog() is called...", oneDNN's and
CUDA's notes, CPU feature notes), whatever ``TF_CPP_MIN_LOG_LEVEL`` says: they log before
absl reads its settings. :func:`import_tensorflow` points descriptor 2 at a temporary
file while TensorFlow and Keras import, and writes what they printed to the terminal
only when ``verbose`` or when the import fails.

Importing TensorFlow imports Keras, and Keras imports Matplotlib (for its image
galleries) and scikit-learn (for its scikit-learn wrappers) when they are installed:
about 85 MB and half a second. ``without`` names such modules: they cannot be imported
while TensorFlow imports (Keras then leaves those integrations out), and can be later.
"""

from __future__ import annotations

import os
import sys
import tempfile
from collections.abc import Iterable, Sequence
from importlib.machinery import ModuleSpec
from types import ModuleType

__all__ = ["KERAS_INTEGRATIONS", "import_tensorflow"]

KERAS_INTEGRATIONS = ("matplotlib", "sklearn")
"""What Keras imports for features the main job does not use."""


class _Absent:
    """A meta path finder for which the modules it names are not installed."""

    def __init__(self, names: Iterable[str]) -> None:
        self._names = frozenset(names)

    def find_spec(
        self, name: str, path: Sequence[str] | None = None, target: ModuleType | None = None
    ) -> ModuleSpec | None:
        if name.partition(".")[0] in self._names:
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None


def import_tensorflow(*, verbose: bool = False, without: Iterable[str] = ()) -> None:
    """Import TensorFlow and Keras, their start-up lines shown only when ``verbose`` or
    when the import fails; the top-level modules ``without`` names unimportable meanwhile.

    Does nothing once TensorFlow is imported. ``TF_CPP_MIN_LOG_LEVEL`` is set to 3
    unless ``verbose`` or already set.
    """
    if "tensorflow" in sys.modules:
        return
    if not verbose:
        os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    absent = _Absent(without)
    sys.meta_path.insert(0, absent)
    try:
        if verbose:
            _import()
        else:
            _import_quietly()
    finally:
        sys.meta_path.remove(absent)


def _import() -> None:
    import keras  # noqa: F401 - imported for its side effect
    import tensorflow  # noqa: F401


def _import_quietly() -> None:
    """:func:`_import` with descriptor 2 on a temporary file, replayed if it fails."""
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as captured:
        os.dup2(captured.fileno(), 2)
        try:
            _import()
        except BaseException:
            _restore(saved)
            captured.seek(0)
            sys.stderr.write(captured.read().decode(errors="replace"))
            sys.stderr.flush()
            raise
        _restore(saved)


def _restore(saved: int) -> None:
    sys.stderr.flush()
    os.dup2(saved, 2)
    os.close(saved)
