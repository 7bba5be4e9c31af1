"""The ClientApp each SuperNode runs: programlogic's client work on the node's writer.

A SuperNode says which writer it is in its node config (``flower-supernode
--node-config 'client-id="writer_03"'``); :func:`load` gives that writer's digits.
Flower starts a fresh process for each message, so this module imports only what the
handshake and the data need; the learning code (TensorFlow) is imported when a
message's work names it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from programlogic.contexts.flower import CLIENT_ID_KEY, make_client_app


def load(node_config: Mapping[str, Any], split: str) -> Any:
    """This node's writer's digits: a training writer's for ``"train"``, a held-out
    writer's for ``"test"`` (writers 0-9 train, 10-13 are held out)."""
    from programlogic.datasets import load_digits_writers

    data = load_digits_writers()
    source = {"train": data.train, "test": data.test}.get(split)
    if source is None:
        raise ValueError(f"split must be 'train' or 'test', got {split!r}")
    client_id = node_config[CLIENT_ID_KEY]
    for handle in source.all_clients():
        if handle.client_id == client_id:
            return handle.load()
    raise ValueError(
        f"this node is client {client_id!r}, which holds no {split!r} data; the "
        f"{split} writers: {', '.join(source.client_ids)}"
    )


app = make_client_app(load=load)
