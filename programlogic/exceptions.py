"""The errors that programlogic raises.

::

    ProgramLogicError
     ├── NoFederatedContextError (also RuntimeError)  no context is active here
     ├── ClientError                                  client work raised; names the clients
     └── ResumeError (also ValueError)                a checkpoint written by another config

Errors of the managers layer are in :mod:`managers.exceptions`. Exceptions raised by
user code (a learning process, a release manager) propagate unchanged, except inside
client work, where :class:`ClientError` adds which client failed and keeps the
original as ``__cause__`` (and as ``.error``).
"""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ["ClientError", "NoFederatedContextError", "ProgramLogicError", "ResumeError"]


class ProgramLogicError(Exception):
    """Base of the errors raised by programlogic itself."""


class NoFederatedContextError(ProgramLogicError, RuntimeError):
    """Something that needs a federated context ran outside of one."""


class ClientError(ProgramLogicError):
    """The work of one client (or of one group of clients) raised.

    ``client_ids`` names the clients whose work failed; ``error`` is what they raised.
    """

    def __init__(self, client_ids: Sequence[str], error: BaseException) -> None:
        self.client_ids = tuple(client_ids)
        self.error = error
        if len(self.client_ids) == 1:
            who = f"client {self.client_ids[0]!r}"
        else:
            who = f"the group of clients {list(self.client_ids)!r}"
        super().__init__(f"the work of {who} failed: {type(error).__name__}: {error}")

    def __reduce__(self):  # pickled by backends that ship errors between processes
        return (type(self), (self.client_ids, self.error))


class ResumeError(ProgramLogicError, ValueError):
    """The saved program state was written by a run with another configuration."""
