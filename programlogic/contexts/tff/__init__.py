"""The TensorFlow Federated backend: TFF's runtime as a federated context, TFF learning
processes as programlogic learning processes.

Needs TensorFlow Federated 0.87 (Python 3.11, TensorFlow 2.14); ``scripts/install_tff.sh``
builds such an environment with this project in it. Importing this package imports
TensorFlow Federated; ``import programlogic`` never does.

Also TFF's data sources and release managers as ours and ours as TFF's (``data``,
``release``), for programs that move from ``tff.program`` piece by piece.

Names say the direction an adapter crosses the boundary, after the concept it is:

- ``<Concept>FromTFF``: a TFF object used by programlogic, which takes one of TFF's and
  is one of ours (:class:`FederatedDataSourceFromTFF`, :class:`ReleaseManagerFromTFF`);
- ``<Concept>ForTFF``: one of ours used by TFF code, which takes one of ours and is one
  of TFF's (:class:`FederatedDataSourceForTFF`, :class:`ReleaseManagerForTFF`).

The ``TFF`` prefix of :class:`TFFContext` and :class:`TFFLearningProcess` names the
backend, as in ``LocalContext`` and ``RayContext``: they are this backend, not adapters
(a ``TFFLearningProcess`` runs only inside a ``TFFContext``).
"""

from programlogic.contexts.tff.context import TFFContext
from programlogic.contexts.tff.data import (
    FederatedDataSourceForTFF,
    FederatedDataSourceFromTFF,
    client_dataset_type,
)
from programlogic.contexts.tff.process import TFFLearningProcess, build_tff_evaluation
from programlogic.contexts.tff.release import (
    ReleaseManagerForTFF,
    ReleaseManagerFromTFF,
    from_tff_structure,
    to_tff_structure,
)
from programlogic.contexts.tff.structures import from_plain, to_plain

__all__ = [
    "FederatedDataSourceForTFF",
    "FederatedDataSourceFromTFF",
    "ReleaseManagerForTFF",
    "ReleaseManagerFromTFF",
    "TFFContext",
    "TFFLearningProcess",
    "build_tff_evaluation",
    "client_dataset_type",
    "from_plain",
    "from_tff_structure",
    "to_plain",
    "to_tff_structure",
]
