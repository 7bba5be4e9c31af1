"""Built-in learning processes on Keras and TensorFlow: federated averaging (weighted,
unweighted, FedProx), federated SGD and evaluation, with pluggable model aggregators.

Needs TensorFlow >= 2.16 with Keras 3 (``pip install 'programlogic[learning]'``).
Client work runs through the current federated context in compiled, vectorized groups.
"""

from programlogic.learning.aggregators import (
    Aggregate,
    ClientTransform,
    ModelAggregator,
    mean,
    unweighted_mean,
)
from programlogic.learning.client_update import CLIENT_UPDATES
from programlogic.learning.fed_avg import (
    WeightedFedAvg,
    build_unweighted_fed_avg,
    build_weighted_fed_avg,
)
from programlogic.learning.fed_eval import FederatedEvaluation, build_fed_eval
from programlogic.learning.fed_prox import (
    FedProx,
    build_unweighted_fed_prox,
    build_weighted_fed_prox,
)
from programlogic.learning.fed_sgd import FedSGD, build_fed_sgd
from programlogic.learning.keras_model import FunctionalModel, ModelWeights
from programlogic.learning.keras_release import KerasModelReleaseManager
from programlogic.learning.metrics import SummableMetric
from programlogic.learning.models import MODELS, build_model, cnn, mlp, softmax_regression
from programlogic.learning.optimizers import (
    SGD,
    Adagrad,
    Adam,
    Optimizer,
    RMSprop,
    Yogi,
    adagrad,
    adam,
    as_optimizer,
    rmsprop,
    sgd,
    yogi,
)
from programlogic.learning.privacy import AdaptiveClipping, DPMean, adaptive_clipping, dp_mean
from programlogic.learning.robust import clipping, median, trimmed_mean

__all__ = [
    "CLIENT_UPDATES",
    "MODELS",
    "SGD",
    "Adagrad",
    "Adam",
    "AdaptiveClipping",
    "Aggregate",
    "ClientTransform",
    "DPMean",
    "FedProx",
    "FedSGD",
    "FederatedEvaluation",
    "FunctionalModel",
    "KerasModelReleaseManager",
    "ModelAggregator",
    "ModelWeights",
    "Optimizer",
    "RMSprop",
    "SummableMetric",
    "WeightedFedAvg",
    "Yogi",
    "adagrad",
    "adam",
    "adaptive_clipping",
    "as_optimizer",
    "build_fed_eval",
    "build_fed_sgd",
    "build_model",
    "build_unweighted_fed_avg",
    "build_unweighted_fed_prox",
    "build_weighted_fed_avg",
    "build_weighted_fed_prox",
    "clipping",
    "cnn",
    "dp_mean",
    "mean",
    "median",
    "mlp",
    "rmsprop",
    "sgd",
    "softmax_regression",
    "trimmed_mean",
    "unweighted_mean",
    "yogi",
]
