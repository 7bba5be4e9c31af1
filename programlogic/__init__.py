"""programlogic: the program logic of federated learning, on asyncio and trio.

``train_model`` drives a learning process round by round inside a federated context,
checkpoints it with a program-state manager and publishes metrics and models with
release managers (:mod:`managers`, also importable as ``programlogic.managers``).
"""

from programlogic.clock import Clock, SystemClock
from programlogic.context import FederatedContext, check_in_federated_context, get_context
from programlogic.contexts.local import LocalContext
from programlogic.data import (
    ClientHandle,
    ClientSampler,
    FederatedDataSource,
    FederatedDataSourceIterator,
    InMemoryDataSource,
    Sampling,
)
from programlogic.exceptions import (
    ClientError,
    NoFederatedContextError,
    ProgramLogicError,
    ResumeError,
)
from programlogic.process import LearningProcess, LearningProcessOutput
from programlogic.tasks import TaskTracker, TrackedTask
from programlogic.training import (
    EvaluationManagerProtocol,
    StopReason,
    TrainingResult,
    final_model_key,
    train_model,
)

__all__ = [
    "ClientError",
    "ClientHandle",
    "ClientSampler",
    "Clock",
    "EvaluationManagerProtocol",
    "FederatedContext",
    "FederatedDataSource",
    "FederatedDataSourceIterator",
    "InMemoryDataSource",
    "LearningProcess",
    "LearningProcessOutput",
    "LocalContext",
    "NoFederatedContextError",
    "ProgramLogicError",
    "ResumeError",
    "Sampling",
    "StopReason",
    "SystemClock",
    "TaskTracker",
    "TrackedTask",
    "TrainingResult",
    "check_in_federated_context",
    "final_model_key",
    "get_context",
    "train_model",
]
