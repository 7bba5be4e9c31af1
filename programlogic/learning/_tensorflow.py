"""TensorFlow and Keras 3, imported once, with an error naming the extra when missing."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

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

__all__ = ["call_compiled", "compile_function", "keras", "tf"]

_TRACING = threading.Lock()
"""Held by the one thread of the process that traces a compiled function."""


def compile_function(fn: Callable[..., Any]) -> Any:
    """``fn`` as a TensorFlow function compiled with XLA, traced without AutoGraph.

    The graph code of this package writes its control flow with TensorFlow's own
    operations (``tf.while_loop``, ``tf.where``), so AutoGraph's rewriting of the
    Python source (of Keras' layers too) would only lengthen tracing.
    """
    return tf.function(fn, jit_compile=True, autograph=False)


def call_compiled(function: Any, *args: Any) -> Any:
    """``function(*args)`` for a :func:`compile_function`; it traces one thread at a time.

    Tracing is Python work that holds the GIL nearly throughout. Two threads tracing at
    once pass the GIL back and forth between themselves and starve every other thread
    of the process, an event loop's included, for 100-500 ms at a time; and a thread
    tracing can wait, holding the GIL, on TensorFlow's runtime while another thread
    compiles (stalls of a second measured). So a call that traces, and its first run
    (where XLA compiles), hold a process-wide lock (a thread waiting for it releases
    the GIL); calls of a function already traced for their arguments do not take it
    beyond the look-up.
    """
    with _TRACING:
        traces = function.experimental_get_tracing_count()
        function.get_concrete_function(*args)
        if function.experimental_get_tracing_count() != traces:
            return function(*args)
    return function(*args)
