"""Built-in learning processes on Keras and TensorFlow: federated averaging and evaluation.

Needs TensorFlow >= 2.16 with Keras 3 (``pip install 'programlogic[learning]'``).
Client work runs through the current federated context in compiled, vectorized groups.
"""

from programlogic.learning.fed_avg import (
    MAX_CLIENTS_PER_GROUP,
    WeightedFedAvg,
    build_weighted_fed_avg,
    plan_group_size,
)
from programlogic.learning.fed_eval import FederatedEvaluation, build_fed_eval
from programlogic.learning.keras_model import SUPPORTED_METRICS, FunctionalModel, ModelWeights
from programlogic.learning.models import MODELS, build_model, cnn, mlp, softmax_regression
from programlogic.learning.optimizers import SGD, Adam, Optimizer, adam, sgd

__all__ = [
    "MAX_CLIENTS_PER_GROUP",
    "MODELS",
    "SGD",
    "SUPPORTED_METRICS",
    "Adam",
    "FederatedEvaluation",
    "FunctionalModel",
    "ModelWeights",
    "Optimizer",
    "WeightedFedAvg",
    "adam",
    "build_fed_eval",
    "build_model",
    "build_weighted_fed_avg",
    "cnn",
    "mlp",
    "plan_group_size",
    "sgd",
    "softmax_regression",
]
