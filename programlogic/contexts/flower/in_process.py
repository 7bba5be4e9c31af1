"""A Flower federation inside this process: Flower's own link state and Grid, and a thread
per node running a ClientApp.

For tests of a Flower program (and for the context contract): the ServerApp side is a
real Flower ``InMemoryGrid`` on an in-memory ``LinkState``, the nodes are registered in
it as a SuperLink registers SuperNodes, and each node's thread pulls its messages from
that state, runs the ClientApp on them with the node's config, and stores the replies,
as a SuperNode does over the network. Nodes can be stopped and restarted to play the
faults of a deployment.
"""

from __future__ import annotations

import secrets
import threading
from collections.abc import Mapping, Sequence
from types import TracebackType
from typing import TYPE_CHECKING, Any, Self
from uuid import uuid4

from managers.validation import check_number
from programlogic.contexts.flower.nodes import CLIENT_ID_KEY

if TYPE_CHECKING:
    from flwr.clientapp import ClientApp
    from flwr.serverapp import Grid

__all__ = ["InProcessFederation"]


class _Node:
    def __init__(
        self, federation: InProcessFederation, node_config: dict[str, Any], name: str | None
    ) -> None:
        from flwr.common.constant import NOOP_ACCOUNT_NAME, NOOP_FLWR_AID

        state = federation._state
        self.config = node_config
        self.name = name
        self.node_id = state.create_node(
            NOOP_FLWR_AID,
            NOOP_ACCOUNT_NAME,
            secrets.token_bytes(32),
            heartbeat_interval=federation.heartbeat_interval,
            name=name,
        )
        state.acknowledge_node_heartbeat(self.node_id, federation.heartbeat_interval)
        self.stopped = threading.Event()
        self.thread = threading.Thread(
            target=federation._serve, args=(self,), name=f"flower-node-{self.node_id}", daemon=True
        )
        self.thread.start()

    def stop(self) -> None:
        self.stopped.set()
        self.thread.join()


class InProcessFederation:
    """Nodes running ``client_app`` in threads of this process, behind Flower's own Grid.

    ``client_ids``: one node per id, its node config ``{"client-id": id}``;
    ``node_configs``: more nodes, each with the config given; ``registered_names``: more
    nodes with an empty config, registered under these names (as SuperNode
    authentication registers a node with ``flwr supernode register --name``). ``run_config``: what
    ``context.run_config`` holds on the nodes. ``heartbeat_interval``: how long a
    stopped node stays listed online.

    Use it as a context manager; :attr:`grid` is the ``Grid`` to give
    :class:`~programlogic.contexts.flower.FlowerContext`::

        with InProcessFederation(make_client_app(load), ["site-0", "site-1"]) as federation:
            async with FlowerContext(federation.grid) as context:
                ...

    Each node thread runs one message at a time, as a SuperNode does.
    """

    def __init__(
        self,
        client_app: ClientApp,
        client_ids: Sequence[str] = (),
        *,
        node_configs: Sequence[Mapping[str, Any]] = (),
        registered_names: Sequence[str] = (),
        run_config: Mapping[str, Any] | None = None,
        heartbeat_interval: float = 30.0,
        poll_interval: float = 0.005,
    ) -> None:
        if not callable(client_app):
            raise TypeError(
                f"client_app must be a Flower ClientApp, got {type(client_app).__name__}"
            )
        if isinstance(client_ids, str):
            raise TypeError("client_ids must be a sequence of client ids, not a str")
        check_number("heartbeat_interval", heartbeat_interval, above=0)
        check_number("poll_interval", poll_interval, above=0)
        self.client_app = client_app
        self._configs: list[tuple[dict[str, Any], str | None]] = [
            ({CLIENT_ID_KEY: client_id}, None) for client_id in client_ids
        ]
        self._configs += [(dict(config), None) for config in node_configs]
        self._configs += [({}, name) for name in registered_names]
        self.run_config = dict(run_config or {})
        self.heartbeat_interval = float(heartbeat_interval)
        self.poll_interval = float(poll_interval)
        self._nodes: dict[str, _Node] = {}
        self._anonymous: list[_Node] = []
        self._grid: Grid | None = None

    @property
    def grid(self) -> Grid:
        """The Grid of the federation's run (while it is entered)."""
        if self._grid is None:
            raise RuntimeError(
                "the InProcessFederation is not entered: use `with InProcessFederation(...):`"
            )
        return self._grid

    @property
    def node_ids(self) -> dict[str, int]:
        """The Flower node id of each client's current node."""
        return {client_id: node.node_id for client_id, node in self._nodes.items()}

    def __enter__(self) -> Self:
        from flwr.common.constant import NOOP_FLWR_AID, SUPERLINK_NODE_ID
        from flwr.server.superlink.linkstate import LinkStateFactory
        from flwr.supercore.constant import FLWR_IN_MEMORY_DB_NAME, NOOP_FEDERATION_ID
        from flwr.supercore.object_store import ObjectStoreFactory
        from flwr.supercore.task_identity import TaskIdentity
        from flwr.superlink.federation import NoOpFederationManager
        from flwr.superlink.grid import InMemoryGrid

        factory = LinkStateFactory(
            FLWR_IN_MEMORY_DB_NAME, NoOpFederationManager(), ObjectStoreFactory()
        )
        self._state = factory.state()
        self._run_id = self._state.create_run(
            None, None, None, {}, NOOP_FEDERATION_ID, None, NOOP_FLWR_AID, "serverapp"
        )
        # The identity Flower stamps on messages made in this process (its simulation
        # sets the same): this run, the SuperLink's node.
        TaskIdentity.task_id = 1
        TaskIdentity.run_id = self._run_id
        TaskIdentity.node_id = SUPERLINK_NODE_ID
        grid = InMemoryGrid(factory)
        grid.set_run(self._state.get_run_info(run_ids=[self._run_id])[0])
        for config, name in self._configs:
            self._add(config, name)
        self._grid = grid
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self._grid = None
        for node in [*self._nodes.values(), *self._anonymous]:
            node.stop()
        self._nodes.clear()
        self._anonymous.clear()

    def _add(self, config: dict[str, Any], name: str | None) -> _Node:
        node = _Node(self, config, name)
        client_id = config.get(CLIENT_ID_KEY, name)
        if isinstance(client_id, str):
            self._nodes[client_id] = node
        else:
            self._anonymous.append(node)
        return node

    def stop_node(self, client_id: str) -> None:
        """Stop the node of ``client_id``: it takes no more messages, and Flower lists it
        offline and answers messages to it with a "Node Unavailable" error, as it does
        for a SuperNode that signed off (one that died: after ``heartbeat_interval``)."""
        node = self._node(client_id)
        node.stop()
        self._state.deactivate_node(node.node_id)

    def restart_node(self, client_id: str) -> int:
        """Start ``client_id``'s node again, under a new Flower node id (as a SuperNode
        without authentication gets), with the same node config; returns the new id."""
        node = self._node(client_id)
        if not node.stopped.is_set():
            self.stop_node(client_id)
        return self._add(node.config, node.name).node_id

    def _node(self, client_id: str) -> _Node:
        if self._grid is None:
            raise RuntimeError("the InProcessFederation is not entered")
        try:
            return self._nodes[client_id]
        except KeyError:
            raise KeyError(
                f"no node of client {client_id!r}; the nodes: {sorted(self._nodes)}"
            ) from None

    def _serve(self, node: _Node) -> None:
        from flwr.app import Context, Error, Message, RecordDict

        state = self._state
        context = Context(self._run_id, node.node_id, node.config, RecordDict(), self.run_config)
        beat = 0.0
        while not node.stopped.wait(self.poll_interval):
            beat += self.poll_interval
            if beat >= self.heartbeat_interval / 3:
                state.acknowledge_node_heartbeat(node.node_id, self.heartbeat_interval)
                beat = 0.0
            for message in state.get_message_ins(node_id=node.node_id, limit=1):
                try:
                    reply = self.client_app(message, context)
                except Exception as error:  # a SuperNode answers so too
                    reply = Message(
                        Error(code=0, reason=f"{type(error).__name__}: {error}"), reply_to=message
                    )
                reply.metadata.__dict__["_message_id"] = str(uuid4())
                state.store_message_res(reply)
