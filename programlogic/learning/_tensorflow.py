"""TensorFlow and Keras 3, imported once, with an error naming the extra when missing."""

from __future__ import annotations

import contextlib
import ctypes
import threading
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

try:
    import keras
    import tensorflow as tf
except ImportError as error:  # pragma: no cover - depends on the environment
    raise ImportError(
        "programlogic.learning needs TensorFlow and Keras 3: pip install 'programlogic[learning]'"
    ) from error

if int(keras.__version__.split(".")[0]) < 3:  # pragma: no cover - depends on the environment
    raise ImportError(
        f"programlogic.learning needs Keras 3 (TensorFlow >= 2.16), found Keras "
        f"{keras.__version__}: pip install 'programlogic[learning]'"
    )

__all__ = ["GRAPHS", "CompiledFunction", "GraphLock", "keras", "tf"]


class GraphLock:
    """Exclusive while a thread builds TensorFlow graphs, shared while compiled code runs.

    Building graphs (tracing a function, building a Keras model, which traces its
    layers to infer shapes) is Python work that holds the GIL nearly throughout, and
    a thread running a compiled function can wait, holding the GIL, on TensorFlow's
    runtime while another thread compiles one. Either way the other threads of the
    process, an event loop's included, were measured to stall for 100-800 ms when two
    runs started side by side. Under this lock one thread at a time builds and
    compiles, while no other runs compiled code; runs of compiled code share it. A
    thread waiting for it does not hold the GIL. A waiting builder goes before
    threads that ask to share it later, so steady runs never starve a build.

    Check the reason with ``python bench/service_health.py --requests 100``: two runs
    start and train beside an event loop that answers ``/health``; its p99 loop lag
    stays under 50 ms with the lock (gaps of 130-220 ms without it were measured when
    it came in, 2026-12; the README's notes on the service have the figures).
    """

    def __init__(self) -> None:
        self._condition = threading.Condition()
        self._sharing = 0
        self._building = False
        self._builders_waiting = 0

    @contextlib.contextmanager
    def shared(self) -> Iterator[None]:
        """Hold the lock with other threads that run compiled code."""
        with self._condition:
            self._condition.wait_for(lambda: not (self._building or self._builders_waiting))
            self._sharing += 1
        try:
            yield
        finally:
            with self._condition:
                self._sharing -= 1
                if not self._sharing:
                    self._condition.notify_all()

    @contextlib.contextmanager
    def exclusive(self) -> Iterator[None]:
        """Hold the lock alone, to build or compile graphs (not re-entrant)."""
        with self._condition:
            self._builders_waiting += 1
            try:
                self._condition.wait_for(lambda: not (self._building or self._sharing))
            finally:
                self._builders_waiting -= 1
            self._building = True
        try:
            yield
        finally:
            with self._condition:
                self._building = False
                self._condition.notify_all()


GRAPHS = GraphLock()
"""The process's lock around building TensorFlow graphs and running compiled ones."""


class CompiledFunction:
    """``fn`` as a TensorFlow function compiled with XLA, called under :data:`GRAPHS`.

    It traces without AutoGraph: the graph code of this package writes its control
    flow with TensorFlow's own operations (``tf.while_loop``, ``tf.where``), so
    rewriting the Python source (of Keras' layers too) would only lengthen tracing.
    Arguments are NumPy arrays in nested lists, tuples and dicts, each taken as a
    tensor; the result is ``fn``'s, its leaves eager tensors. A call with a structure,
    shapes and dtypes not seen before traces and compiles, holding the lock alone, for
    its first run; other calls share it.
    """

    def __init__(self, fn: Callable[..., Any]) -> None:
        self._fn = fn
        self._traced: dict[tuple[Any, ...], list[_Traced]] = {}

    def __call__(self, *args: Any) -> Any:
        leaves = tf.nest.flatten(args)
        signature = tuple((np.shape(leaf), np.result_type(leaf).str) for leaf in leaves)
        traced = self._find(signature, args)
        if traced is not None:
            with GRAPHS.shared():
                return traced.call(leaves)
        with GRAPHS.exclusive():
            traced = self._find(signature, args)  # another thread may have traced it meanwhile
            if traced is not None:
                return traced.call(leaves)
            traced = _Traced(self._fn, args)
            result = traced.call(leaves)
            self._traced.setdefault(signature, []).append(traced)
            release_freed_memory()
        return result

    @property
    def traced_count(self) -> int:
        """How many argument structures, shapes and dtypes were traced and compiled."""
        return sum(len(traced) for traced in self._traced.values())

    def _find(self, signature: tuple[Any, ...], args: tuple[Any, ...]) -> _Traced | None:
        """The traced function for arguments like ``args`` (of leaves ``signature``), if any."""
        for traced in self._traced.get(signature, ()):
            if traced.fits(args):
                return traced
        return None


class _Traced:
    """``fn`` traced and compiled for arguments of one structure, shapes and dtypes.

    It is called with the arguments' leaves alone: a concrete function of flat
    tensors skips ``tf.function``'s matching of nested arguments, which was measured
    to hold the GIL for some 0.3 ms a call, during which no other worker thread could
    start its own compiled call.
    """

    def __init__(self, fn: Callable[..., Any], args: tuple[Any, ...]) -> None:
        self._inputs = tf.nest.map_structure(lambda _: 0, args)
        outputs: list[Any] = []

        def flat(*tensors: Any) -> list[Any]:
            result = fn(*tf.nest.pack_sequence_as(args, list(tensors)))
            outputs.append(tf.nest.map_structure(lambda _: 0, result))
            return tf.nest.flatten(result)

        compiled = tf.function(flat, jit_compile=True, autograph=False)
        self._concrete = compiled.get_concrete_function(*tf.nest.flatten(args))
        self._outputs = outputs[0]

    def fits(self, args: tuple[Any, ...]) -> bool:
        """Whether ``args`` have the structure this was traced for."""
        try:
            tf.nest.assert_same_structure(self._inputs, args, check_types=True)
        except (TypeError, ValueError):
            return False
        return True

    def call(self, leaves: list[Any]) -> Any:
        """The compiled function on the arguments' ``leaves``, its result packed."""
        result = self._concrete(*[tf.convert_to_tensor(leaf) for leaf in leaves])
        return tf.nest.pack_sequence_as(self._outputs, result)


def _malloc_trim() -> Callable[[int], int] | None:
    try:
        return ctypes.CDLL(None).malloc_trim  # glibc
    except (AttributeError, OSError):  # pragma: no cover - another C library
        return None


_MALLOC_TRIM = _malloc_trim()


def release_freed_memory() -> None:
    """Hand the C heap's free pages back to the system (glibc's ``malloc_trim``).

    Compiling a program with XLA allocates some 100 MB that it frees when done, but
    glibc keeps freed pages for reuse, so the process would hold them for its whole
    life. Trimming after a compile (a few milliseconds) returns them. Elsewhere than
    glibc, nothing.
    """
    if _MALLOC_TRIM is not None:
        _MALLOC_TRIM(0)
