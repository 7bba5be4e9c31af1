"""Released model weights written as Keras models a user can ship: ``.keras`` and SavedModel."""

from __future__ import annotations

import logging
import os
import re
import secrets
import shutil
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import anyio
import anyio.to_thread
import numpy as np

from managers.files import fsync_directory
from managers.release.base import ReleaseKey, ReleaseManager, check_key
from managers.validation import check_callable, check_path, describe
from managers.values import materialize
from programlogic.learning._tensorflow import GRAPHS, keras, tf

__all__ = ["FORMATS", "SERVING_INPUT", "KerasModelReleaseManager", "model_version"]

logger = logging.getLogger(__name__)

FORMATS = ("keras", "saved_model")
"""The formats :class:`KerasModelReleaseManager` writes: a ``.keras`` file, a SavedModel."""

SERVING_INPUT = "inputs"
"""The name of the ``serving_default`` signature's input, for a model of one input."""

_FINAL_KEY = re.compile(r"final_training_checkpoint_round_([0-9]+)")
_NAME = re.compile(r"[A-Za-z0-9_-][A-Za-z0-9_.-]*")
_TEMPORARY = re.compile(r"\.(new|old)-([0-9]+)-[0-9a-f]+")


def model_version(key: ReleaseKey) -> int:
    """The SavedModel version a release key is written under.

    An int key (a round) >= 0 is its own version; ``final_model_key(r)`` (the final
    model ``train_model`` releases) is version ``r``. Any other key is refused:
    ``TypeError`` for a str, ``ValueError`` for a negative int.
    """
    check_key(key)
    if isinstance(key, str):
        match = _FINAL_KEY.fullmatch(key)
        if match is None:
            raise TypeError(
                "a Keras model is released under an int key (a round) or "
                f"final_model_key(round), got {key!r}"
            )
        return int(match.group(1))
    if key < 0:
        raise ValueError(f"a Keras model's key must be a round >= 0, got {key!r}")
    return key


class KerasModelReleaseManager(ReleaseManager):
    """Writes released model weights as a Keras model: a ``.keras`` file and a SavedModel.

    A released value is model weights as ``get_model_weights`` of the built-in processes
    returns them (``{"trainable": [...], "non_trainable": [...]}``), a list of arrays in
    ``model.weights`` order, or ``{"weights": ..., "metrics": ...}`` as an
    :class:`~programlogic.EvaluationManager` releases an evaluated model (its weights
    are written). ``model_fn()`` builds the model (the one the process trains; called
    once, on first release); the weights are set on it and it is written, for the key's
    version ``v`` (:func:`model_version`: a round, or ``r`` for ``final_model_key(r)``),
    to ``{root}/{name}/{v}/``:

    - ``"keras"`` in ``formats``: ``{name}.keras``, for ``keras.saving.load_model``;
    - ``"saved_model"``: a TensorFlow SavedModel (``saved_model.pb``, ``variables/``)
      with a ``serving_default`` signature, for ``tf.saved_model.load`` and TensorFlow
      Serving, whose model base path is ``{root}/{name}`` (it serves the highest
      version). A model of one input takes it as ``inputs`` (a batch) and returns
      ``{"output_0": outputs}``.

    A key's directory is written whole beside it and renamed into place, so both formats
    of a version always belong to the same release; releasing a key again replaces it
    (the old directory is moved aside first, then removed). A crash leaves the old
    directory or the new one: the next manager over ``root`` puts back one moved aside
    and removes unfinished ones on its first release. ``final_model_key(r)`` and the
    int key ``r`` share version ``r``: both are round ``r``'s model. Writing builds
    TensorFlow graphs in a worker thread, holding the graph lock (compiled client work
    waits meanwhile).
    """

    def __init__(
        self,
        root: str | os.PathLike[str],
        model_fn: Callable[[], Any],
        *,
        formats: Sequence[str] = FORMATS,
        name: str = "model",
    ) -> None:
        self._root = check_path("root", root)
        self._model_fn = check_callable("model_fn", model_fn)
        if isinstance(formats, str) or not isinstance(formats, Sequence):
            raise TypeError(f"formats must be a sequence of format names, got {describe(formats)}")
        unknown = [each for each in formats if each not in FORMATS]
        if unknown or not formats or len(set(formats)) != len(formats):
            raise ValueError(
                f"formats must name some of {', '.join(map(repr, FORMATS))} once each, "
                f"got {tuple(formats)!r}"
            )
        if not isinstance(name, str):
            raise TypeError(f"name must be a str, got {describe(name)}")
        if not _NAME.fullmatch(name):
            raise ValueError(
                f"name must be a plain file name (letters, digits, '_', '.', '-'), got {name!r}"
            )
        self._formats = tuple(formats)
        self._name = name
        self._model: Any = None
        self._recovered = False
        self._lock: anyio.Lock | None = None

    @property
    def base_path(self) -> Path:
        """``{root}/{name}``: the versions' directory (TensorFlow Serving's model base path)."""
        return self._root / self._name

    def version_path(self, key: ReleaseKey) -> Path:
        """The directory of the version ``key`` is written to (a SavedModel's path)."""
        return self.base_path / str(model_version(key))

    def keras_path(self, key: ReleaseKey) -> Path:
        """The ``.keras`` file of ``key``."""
        return self.version_path(key) / f"{self._name}.keras"

    async def release(self, value: Any, key: ReleaseKey) -> None:
        version = model_version(key)
        if self._lock is None:
            self._lock = anyio.Lock()
        async with self._lock:  # releases are written in call order: the last call wins
            plain = await materialize(value)
            await anyio.to_thread.run_sync(self._write, version, plain)

    def _write(self, version: int, value: Any) -> None:
        """Write ``value``'s model as ``version``; runs in a worker thread."""
        base = self.base_path
        if not self._recovered:
            _recover(base)
            self._recovered = True
        with GRAPHS.exclusive():
            if self._model is None:
                model = self._model_fn()
                if not isinstance(model, keras.Model):
                    raise TypeError(f"model_fn must return a keras.Model, got {describe(model)}")
                self._model = model
            _set_weights(self._model, value)
            new = base / f".new-{version}-{secrets.token_hex(4)}"
            try:
                new.mkdir(parents=True)
                if "saved_model" in self._formats:
                    self._model.export(
                        str(new),
                        format="tf_saved_model",
                        verbose=False,
                        input_signature=_input_signature(self._model),
                    )
                if "keras" in self._formats:
                    self._model.save(new / f"{self._name}.keras")
                _fsync_tree(new)
                _swap(new, base / str(version))
            except BaseException:
                shutil.rmtree(new, ignore_errors=True)
                raise


def _input_signature(model: Any) -> list[Any] | None:
    """A model of one input serves it as ``inputs``; Keras names the others' inputs."""
    inputs = getattr(model, "inputs", None)
    if not inputs or len(inputs) != 1:
        return None
    shape = (None, *inputs[0].shape[1:])
    return [tf.TensorSpec(shape, inputs[0].dtype, name=SERVING_INPUT)]


def _set_weights(model: Any, value: Any) -> None:
    """Set ``value`` (ModelWeights, a list of arrays, or an evaluated model) on ``model``."""
    if isinstance(value, dict) and set(value) == {"weights", "metrics"}:
        value = value["weights"]
    if isinstance(value, dict) and set(value) == {"trainable", "non_trainable"}:
        parts = [
            ("trainable", list(value["trainable"]), model.trainable_variables),
            ("non_trainable", list(value["non_trainable"]), model.non_trainable_variables),
        ]
    elif isinstance(value, list | tuple):
        parts = [("weights", list(value), model.weights)]
    else:
        raise TypeError(
            "model weights must be {'trainable': [...], 'non_trainable': [...]}, a list "
            f"of arrays or {{'weights': ..., 'metrics': ...}}, got {describe(value)}"
        )
    for part, arrays, variables in parts:
        if len(arrays) != len(variables):
            raise ValueError(
                f"model weights {part!r} holds {len(arrays)} arrays, the model has {len(variables)}"
            )
        for index, (array, variable) in enumerate(zip(arrays, variables, strict=True)):
            if np.shape(array) != tuple(variable.shape):
                raise ValueError(
                    f"model weights {part}[{index}] ({variable.path}) has shape "
                    f"{np.shape(array)}, the model expects {tuple(variable.shape)}"
                )
    for _, arrays, variables in parts:
        for array, variable in zip(arrays, variables, strict=True):
            variable.assign(np.asarray(array, dtype=variable.dtype))


def _swap(new: Path, target: Path) -> None:
    """Put the directory ``new`` in place of ``target``, moving an old one aside first."""
    old = None
    if target.exists():
        old = target.with_name(f".old-{target.name}-{secrets.token_hex(4)}")
        os.rename(target, old)
    try:
        os.rename(new, target)
    except BaseException:
        if old is not None:
            os.rename(old, target)
        raise
    fsync_directory(target.parent)
    if old is not None:
        shutil.rmtree(old)


def _recover(base: Path) -> None:
    """Put back versions moved aside by a crashed replacement; drop unfinished ones."""
    if not base.is_dir():
        return
    for entry in sorted(base.iterdir()):
        match = _TEMPORARY.fullmatch(entry.name)
        if match is None:
            continue
        target = base / match.group(2)
        if match.group(1) == "old" and not target.exists():
            logger.warning("putting back %s, moved aside by a replacement that crashed", target)
            os.rename(entry, target)
        else:
            shutil.rmtree(entry)
    fsync_directory(base)


def _fsync_tree(directory: Path) -> None:
    """Make the files under ``directory``, and their entries, durable."""
    for parent, _, files in os.walk(directory):
        for file in files:
            descriptor = os.open(Path(parent, file), os.O_RDONLY)
            try:
                os.fsync(descriptor)
            finally:
                os.close(descriptor)
        fsync_directory(Path(parent))
