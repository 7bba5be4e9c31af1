"""programlogic on Flower's deployment engine: a federated context whose client work runs
on SuperNodes, the ClientApp they run, and an in-process federation for tests.

Needs Flower (``pip install 'programlogic[flower]'``, the release it is tested with).

- :class:`FlowerContext`: made in a ``ServerApp``'s main from its ``grid``; client work
  goes to the nodes as messages, server steps run in the ServerApp.
- :func:`make_client_app`: the ``ClientApp`` the SuperNodes run, with the node's data
  hook ``load(node_config, split)``.
- :func:`node_data_source`: the declared clients as a data source whose data is on the
  nodes (:class:`NodeData`).
- :class:`InProcessFederation`: Flower's in-memory Grid and link state with a thread
  per node, for tests.
- :mod:`programlogic.contexts.flower.wire`: what the messages carry, and what a node
  refuses to run.
"""

from programlogic.contexts.flower.client import make_client_app
from programlogic.contexts.flower.context import FlowerContext
from programlogic.contexts.flower.in_process import InProcessFederation
from programlogic.contexts.flower.nodes import CLIENT_ID_KEY, NodeData, node_data_source
from programlogic.contexts.flower.wire import RefusedReference

__all__ = [
    "CLIENT_ID_KEY",
    "FlowerContext",
    "InProcessFederation",
    "NodeData",
    "RefusedReference",
    "make_client_app",
    "node_data_source",
]
