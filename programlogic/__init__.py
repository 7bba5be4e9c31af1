"""programlogic: the program logic of federated learning, on asyncio and trio.

``train_model`` drives a learning process round by round inside a federated context,
checkpoints it with a program-state manager and publishes metrics and models with
release managers (:mod:`managers`, also importable as ``programlogic.managers``).
``run`` starts a program from synchronous code, notebooks included;
``quiet_tensorflow`` keeps TensorFlow's start-up lines off a program's terminal.
"""

from programlogic.context import (
    DroppedClients,
    FederatedContext,
    check_in_federated_context,
    count_dropped_clients,
    get_context,
    report_dropped_clients,
)
from programlogic.contexts.local import LocalContext
from programlogic.data import (
    AllClientsDataSource,
    ClientHandle,
    ClientSampler,
    ClientTable,
    FederatedDataSource,
    FederatedDataSourceIterator,
    HandleDataSource,
    InMemoryDataSource,
    Sampling,
    TableBackedLoader,
    TableLoader,
)
from programlogic.evaluation import EvaluationManager, evaluate_once
from programlogic.exceptions import (
    CheckpointFormatError,
    ClientError,
    ClusterConnectionError,
    NoFederatedContextError,
    NotEnoughClientsError,
    PrivacyLedgerError,
    PrivacySpentError,
    ProgramLogicError,
    ResumeError,
)
from programlogic.file_run import FileRun, FileRunEvaluation
from programlogic.process import LearningProcess, LearningProcessOutput
from programlogic.runner import run
from programlogic.stopping import (
    AnyOf,
    MetricStoppingPolicy,
    PatienceStopping,
    SpeechTrainerStopping,
    StoppingPolicy,
    StopReason,
)
from programlogic.tasks import TaskTracker, TrackedTask
from programlogic.tensorflow_logging import quiet_tensorflow
from programlogic.training import (
    Checkpoint,
    EvaluationManagerProtocol,
    TrainingResult,
    final_model_key,
    train_model,
)

__all__ = [
    "AllClientsDataSource",
    "AnyOf",
    "Checkpoint",
    "CheckpointFormatError",
    "ClientError",
    "ClientHandle",
    "ClientSampler",
    "ClientTable",
    "ClusterConnectionError",
    "DroppedClients",
    "EvaluationManager",
    "EvaluationManagerProtocol",
    "FederatedContext",
    "FederatedDataSource",
    "FederatedDataSourceIterator",
    "FileRun",
    "FileRunEvaluation",
    "HandleDataSource",
    "InMemoryDataSource",
    "LearningProcess",
    "LearningProcessOutput",
    "LocalContext",
    "MetricStoppingPolicy",
    "NoFederatedContextError",
    "NotEnoughClientsError",
    "PatienceStopping",
    "PrivacyLedgerError",
    "PrivacySpentError",
    "ProgramLogicError",
    "ResumeError",
    "Sampling",
    "SpeechTrainerStopping",
    "StopReason",
    "StoppingPolicy",
    "TableBackedLoader",
    "TableLoader",
    "TaskTracker",
    "TrackedTask",
    "TrainingResult",
    "check_in_federated_context",
    "count_dropped_clients",
    "evaluate_once",
    "final_model_key",
    "get_context",
    "quiet_tensorflow",
    "report_dropped_clients",
    "run",
    "train_model",
]
