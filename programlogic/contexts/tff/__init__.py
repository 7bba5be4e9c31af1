"""The TensorFlow Federated backend: TFF's runtime as a federated context, TFF learning
processes as programlogic learning processes.

Needs TensorFlow Federated 0.87 (Python 3.11, TensorFlow 2.14); ``scripts/install_tff.sh``
builds such an environment with this project in it. Importing this package imports
TensorFlow Federated; ``import programlogic`` never does.

Also TFF's data sources and release managers as ours and ours as TFF's (``data``,
``release``), for programs that move from ``tff.program`` piece by piece.
"""

from programlogic.contexts.tff.context import TFFContext
from programlogic.contexts.tff.data import (
    FederatedDataSourceForTFF,
    TFFDataSource,
    client_dataset_type,
)
from programlogic.contexts.tff.process import TFFLearningProcess, build_tff_evaluation
from programlogic.contexts.tff.release import (
    ReleaseManagerForTFF,
    TFFReleaseManager,
    from_tff_structure,
    to_tff_structure,
)
from programlogic.contexts.tff.structures import from_plain, to_plain

__all__ = [
    "FederatedDataSourceForTFF",
    "ReleaseManagerForTFF",
    "TFFContext",
    "TFFDataSource",
    "TFFLearningProcess",
    "TFFReleaseManager",
    "build_tff_evaluation",
    "client_dataset_type",
    "from_plain",
    "from_tff_structure",
    "to_plain",
    "to_tff_structure",
]
