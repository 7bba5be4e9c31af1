"""The mark of tests that need ``programlogic.learning``, which needs Keras 3 (the learning
extra): the TFF environment's run of the core tests has TensorFlow 2.14's Keras 2."""

from __future__ import annotations

import importlib.metadata

import pytest

__all__ = ["NEEDS_LEARNING"]


def _keras_3_installed() -> bool:
    try:
        return int(importlib.metadata.version("keras").split(".")[0]) >= 3
    except importlib.metadata.PackageNotFoundError:
        return False


NEEDS_LEARNING = pytest.mark.skipif(
    not _keras_3_installed(), reason="programlogic.learning needs Keras 3 (the learning extra)"
)
