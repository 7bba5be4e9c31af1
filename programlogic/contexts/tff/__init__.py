"""Run TensorFlow Federated's learning processes, data sources and release managers here."""

from programlogic.contexts.tff.data import (
    FederatedDataSourceForTFF,
    TFFDataSource,
    client_dataset_type,
)
from programlogic.contexts.tff.release import (
    ReleaseManagerForTFF,
    TFFReleaseManager,
    from_tff_structure,
    to_tff_structure,
)

__all__ = [
    "FederatedDataSourceForTFF",
    "ReleaseManagerForTFF",
    "TFFDataSource",
    "TFFReleaseManager",
    "client_dataset_type",
    "from_tff_structure",
    "to_tff_structure",
]
