"""TensorFlow and Keras 3, imported once, with an error naming the extra when missing."""

from __future__ import annotations

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

__all__ = ["keras", "tf"]
