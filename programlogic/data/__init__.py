"""Federated data sources and seeded, resumable client sampling.

- :mod:`programlogic.data.protocols`: what a data source is (:class:`ClientHandle`,
  :class:`FederatedDataSource`, :class:`FederatedDataSourceIterator`);
- :mod:`programlogic.data.sampling`: how a round picks its clients (:class:`Sampling`,
  :class:`ClientSampler`);
- :mod:`programlogic.data.memory`: sources over client handles and in-memory tables
  (:class:`HandleDataSource`, :class:`InMemoryDataSource`, :class:`ClientTable`).

Every name is importable from here (``check_distinct_client_ids`` too, though
programs rarely need it and the package does not export it).
"""

from programlogic.data.memory import (
    ClientTable,
    HandleDataSource,
    InMemoryDataSource,
    TableBackedLoader,
    TableLoader,
)
from programlogic.data.protocols import (
    AllClientsDataSource,
    ClientHandle,
    FederatedDataSource,
    FederatedDataSourceIterator,
)
from programlogic.data.protocols import (
    check_distinct_client_ids as check_distinct_client_ids,
)
from programlogic.data.sampling import ClientSampler, Sampling

__all__ = [
    "AllClientsDataSource",
    "ClientHandle",
    "ClientSampler",
    "ClientTable",
    "FederatedDataSource",
    "FederatedDataSourceIterator",
    "HandleDataSource",
    "InMemoryDataSource",
    "Sampling",
    "TableBackedLoader",
    "TableLoader",
]
