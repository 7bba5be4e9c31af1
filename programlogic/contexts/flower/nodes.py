"""The clients of a Flower federation on the server side: declared ids, data on the nodes.

A federation's population is declared (in the run config, say): client ids that last,
unlike Flower's node ids. :func:`node_data_source` makes a data source over them whose
handles load nothing on the server: their loader, a :class:`NodeData`, travels to the
node and runs there, where it calls the node's hook ``load(node_config, split)`` (given
to :func:`~programlogic.contexts.flower.make_client_app`). Sampling is the data source's
own: a pure function of (seed, round) over the declared population, whichever nodes
are online.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

from managers.validation import check_str
from programlogic.data import ClientHandle, HandleDataSource, Sampling

__all__ = ["CLIENT_ID_KEY", "NodeData", "node_data_source"]

CLIENT_ID_KEY = "client-id"
"""The node-config key that names which declared client a SuperNode is."""

LoadHook = Callable[[Mapping[str, Any], str], Any]

_node: contextvars.ContextVar[tuple[LoadHook, Mapping[str, Any]] | None] = contextvars.ContextVar(
    "programlogic_flower_node", default=None
)


class NodeData:
    """A client's loader that reads the data of split ``split`` where the work runs: on the
    node, through its hook ``load(node_config, split)``.

    Called anywhere else (on the server, in a context other than Flower's) it raises
    ``RuntimeError``: the data is on the node only.
    """

    __slots__ = ("split",)

    def __init__(self, split: str) -> None:
        check_str("split", split)
        self.split = split

    def __call__(self) -> Any:
        node = _node.get()
        if node is None:
            raise RuntimeError(
                f"NodeData({self.split!r}) loads a client's data on its Flower node only "
                "(in a ClientApp made by programlogic.contexts.flower.make_client_app)"
            )
        load, node_config = node
        return load(node_config, self.split)

    def __reduce__(self) -> tuple[type[NodeData], tuple[str]]:
        return (NodeData, (self.split,))

    def __eq__(self, other: object) -> bool:
        return isinstance(other, NodeData) and other.split == self.split

    def __hash__(self) -> int:
        return hash((NodeData, self.split))

    def __repr__(self) -> str:
        return f"NodeData({self.split!r})"


@contextlib.contextmanager
def on_node(load: LoadHook, node_config: Mapping[str, Any]) -> Iterator[None]:
    """:class:`NodeData` loads through ``load`` with ``node_config`` inside (for the ClientApp)."""
    token = _node.set((load, node_config))
    try:
        yield
    finally:
        _node.reset(token)


def node_data_source(
    client_ids: Sequence[str], split: str, *, sampling: Sampling | str = Sampling.UNIFORM
) -> HandleDataSource:
    """A data source over the declared ``client_ids`` whose data is split ``split`` on each
    client's node (see :class:`NodeData`); ``sampling`` as for
    :class:`~programlogic.data.InMemoryDataSource`.
    """
    if isinstance(client_ids, str) or not isinstance(client_ids, Sequence):
        raise TypeError(
            f"client_ids must be a sequence of client id strings, got {type(client_ids).__name__}"
        )
    loader = NodeData(split)
    return HandleDataSource(
        [ClientHandle(client_id, loader) for client_id in client_ids], sampling=sampling
    )
