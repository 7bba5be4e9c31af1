"""The ClientApp that SuperNodes run: programlogic's client work on the node's own data.

:func:`make_client_app` builds a Flower ``ClientApp`` that answers the two kinds of
message :class:`~programlogic.contexts.flower.FlowerContext` sends:

- ``query.programlogic_hello``, the handshake: the node answers which declared client
  it is, the ``client-id`` of its node config (``flower-supernode --node-config
  'client-id="site-3"'``), or that it has none (then the server takes the name the node
  is registered under, if any);
- ``train.programlogic_work``: one client's work. The message names the work and the
  client's loader as importable references (see :mod:`programlogic.contexts.flower.wire`:
  code of ``programlogic``, ``managers`` or the app's own packages, nothing else); the
  node runs it with :func:`~programlogic.contexts.units.compute_unit`, so a
  :class:`~programlogic.contexts.flower.NodeData` loader reads the node's own data
  through the hook ``load(node_config, split)``, and answers with the result, or with
  the :class:`~programlogic.exceptions.ClientError` the work raised.

In a Flower App, name the module-level ``app`` it returns as the ``clientapp`` of
``[tool.flwr.app.components]``.
"""

from __future__ import annotations

import builtins
from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any

from managers.validation import check_callable
from programlogic.contexts.flower.nodes import CLIENT_ID_KEY, on_node
from programlogic.contexts.flower.wire import LIBRARY_PACKAGES, decode, encode
from programlogic.contexts.units import compute_unit
from programlogic.exceptions import ClientError

if TYPE_CHECKING:
    from flwr.app import Context, Message
    from flwr.clientapp import ClientApp

__all__ = ["HELLO", "RECORD", "WORK", "make_client_app"]

HELLO = "query.programlogic_hello"
"""The message type of the handshake."""
WORK = "train.programlogic_work"
"""The message type of one client's work."""
RECORD = "programlogic"
"""The name of the ConfigRecord that carries programlogic's payload in both messages."""


def make_client_app(
    load: Callable[[Mapping[str, Any], str], Any] | None = None,
    *,
    packages: Iterable[str] = (),
) -> ClientApp:
    """A Flower ``ClientApp`` running programlogic's client work on this node.

    ``load(node_config, split)`` returns this node's data of ``split`` (``"train"``,
    ``"test"``: what the server's :func:`~programlogic.contexts.flower.node_data_source`
    names), in the form the learning process takes (the built-in processes:
    :class:`~programlogic.datasets.ClientArrays`). None: the node holds no data of its
    own, and only loaders that travel as references work (the contract suite's).
    ``packages``: top-level packages whose code messages may name besides programlogic's
    (the Flower App's own); the package defining ``load`` is always one of them.
    """
    from flwr.app import ConfigRecord, Message, RecordDict
    from flwr.clientapp import ClientApp

    if load is not None:
        check_callable("load", load)
    trusted = [*_names("packages", packages)]
    if load is not None and getattr(load, "__module__", None):
        trusted.append(load.__module__.partition(".")[0])
    hook = load if load is not None else _no_data
    app = ClientApp()

    @app.query("programlogic_hello")
    def hello(message: Message, context: Context) -> Message:
        client_id = context.node_config.get(CLIENT_ID_KEY)
        answer: dict[str, Any] = {"node-id": int(context.node_id)}
        if isinstance(client_id, str) and client_id:
            answer["client-id"] = client_id
        else:
            answer["error"] = (
                f"this node's config has no {CLIENT_ID_KEY!r} string (got {client_id!r}) "
                f"and it is registered under no name: start it with --node-config "
                f"'{CLIENT_ID_KEY}=\"<declared client id>\"'"
            )
        return Message(RecordDict({RECORD: ConfigRecord(answer)}), reply_to=message)

    @app.train("programlogic_work")
    def work(message: Message, context: Context) -> Message:
        payload = message.content.config_records[RECORD]
        answer = _compute(payload, context, hook, trusted)
        return Message(RecordDict({RECORD: ConfigRecord(answer)}), reply_to=message)

    return app


def _compute(
    payload: Any, context: Context, load: Callable[..., Any], trusted: list[str]
) -> dict[str, bytes]:
    client_id = str(payload["client-id"])
    try:
        own = context.node_config.get(CLIENT_ID_KEY)
        if own is not None and own != client_id:
            raise RuntimeError(f"the work of client {client_id!r} reached the node of {own!r}")
        fn, broadcast, grouped = decode(payload["work"], trusted)
        loader = decode(payload["loader"], trusted)
        with on_node(load, context.node_config):
            results = compute_unit(fn, broadcast, [client_id], [loader], grouped)
        return {"result": encode(results)}
    except ClientError as error:
        return {"error": encode(ClientError(error.client_ids, _portable(error.error)))}
    except Exception as error:  # the message could not be read: the client's work failed
        return {"error": encode(ClientError([client_id], _portable(error)))}


def _portable(error: BaseException) -> BaseException:
    """``error``, or a RuntimeError saying what it was when the server could not decode it."""
    kind = type(error)
    if kind.__module__ == "builtins" and getattr(builtins, kind.__name__, None) is kind:
        return error
    if kind.__module__.partition(".")[0] in LIBRARY_PACKAGES:
        return error
    return RuntimeError(f"{kind.__module__}.{kind.__qualname__}: {error}")


def _no_data(node_config: Mapping[str, Any], split: str) -> Any:
    raise RuntimeError(
        f"this node's ClientApp was made without a load hook, so it holds no {split!r} "
        "data: give make_client_app(load=...)"
    )


def _names(argument: str, packages: Iterable[str]) -> list[str]:
    if isinstance(packages, str):
        raise TypeError(f"{argument} must be an iterable of package names, not a str")
    names = list(packages)
    for name in names:
        if not isinstance(name, str) or not name.isidentifier():
            raise ValueError(f"{argument} holds {name!r}, which is not a top-level package name")
    return names
