"""TFF tests (asyncio only); TensorFlow and TFF are imported once, their import warnings ignored."""

import os
import warnings

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    import tensorflow  # noqa: F401
    import tensorflow_federated  # noqa: F401
