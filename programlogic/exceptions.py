"""The errors that programlogic raises.

::

    ProgramLogicError
     ├── NoFederatedContextError (also RuntimeError)  no context is active here
     ├── ClientError                                  client work raised; names the clients
     ├── NotEnoughClientsError                        fewer than min_clients finished a round
     ├── ClusterConnectionError (also ConnectionError) the cluster of a context is gone
     ├── PrivacyLedgerError (also ValueError)         a privacy ledger that is damaged or in use
     └── ResumeError (also ValueError)                a checkpoint written by another config
          ├── CheckpointFormatError                   a checkpoint format this code cannot read
          └── PrivacySpentError                       starting would forget privacy already spent

    SimulatedCrash (programlogic.testing)            the crash a testing fake injects

Errors of the managers layer are in :mod:`managers.exceptions`. Exceptions raised by
user code (a learning process, a release manager) propagate unchanged, except inside
client work, where :class:`ClientError` adds which client failed and keeps the
original as ``__cause__`` (and as ``.error``).
"""

from __future__ import annotations

from collections.abc import Sequence

__all__ = [
    "CheckpointFormatError",
    "ClientError",
    "ClusterConnectionError",
    "NoFederatedContextError",
    "NotEnoughClientsError",
    "PrivacyLedgerError",
    "PrivacySpentError",
    "ProgramLogicError",
    "ResumeError",
]


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
        self.__cause__ = error  # also when unpickled: remote backends ship it between processes

    def __reduce__(self):  # pickled by backends that ship errors between processes
        return (type(self), (self.client_ids, self.error))


class ResumeError(ProgramLogicError, ValueError):
    """The saved program state was written by a run with another configuration."""


class CheckpointFormatError(ResumeError):
    """A checkpoint is in a format version this code does not read (written by newer code).

    ``version``: the program state manager's version that holds it; ``found``: its
    format version; ``readable``: the format versions this code reads.
    """

    def __init__(self, version: int, found: object, readable: Sequence[int]) -> None:
        self.version, self.found, self.readable = version, found, tuple(readable)
        super().__init__(
            f"version {version} of the program state manager holds a checkpoint in format "
            f"version {found!r}; this code reads format versions "
            f"{', '.join(map(str, self.readable))}; resume it with a newer programlogic"
        )


class PrivacyLedgerError(ProgramLogicError, ValueError):
    """A privacy ledger cannot be used: damaged (other than a torn last line), not a
    ledger, or in use by another run. The message names the file."""


class PrivacySpentError(ResumeError):
    """Starting ``train_model`` would forget or under-count privacy its ledger records as
    spent: the program state is gone (or every version was damaged) while the ledger
    holds rounds, or a checkpoint's aggregator counts fewer rounds than were run.

    ``epsilon``: the privacy spent in all, at ``delta``; ``rounds``: the DP rounds the
    ledger holds; ``ledger``: its path. A run that means to start over passes
    ``privacy_spent_acknowledged=epsilon`` to ``train_model``.
    """

    def __init__(
        self, message: str, *, epsilon: float, delta: float, rounds: int, ledger: object
    ) -> None:
        self.epsilon, self.delta, self.rounds, self.ledger = epsilon, delta, rounds, ledger
        super().__init__(message)

    def __reduce__(self):  # pickled like the other errors that cross processes
        return (
            _privacy_spent_error,
            (str(self), self.epsilon, self.delta, self.rounds, self.ledger),
        )


def _privacy_spent_error(
    message: str, epsilon: float, delta: float, rounds: int, ledger: object
) -> PrivacySpentError:
    return PrivacySpentError(message, epsilon=epsilon, delta=delta, rounds=rounds, ledger=ledger)


class NotEnoughClientsError(ProgramLogicError):
    """Fewer clients than a context's ``min_clients`` finished the work of a round.

    ``finished`` clients finished, ``required`` were needed, ``dropped`` were dropped
    (stragglers past the round's deadline, or clients whose workers kept dying).
    """

    def __init__(self, finished: int, required: int, dropped: int) -> None:
        self.finished, self.required, self.dropped = finished, required, dropped
        super().__init__(
            f"only {finished} clients finished the round, at least {required} are needed "
            f"(min_clients); {dropped} were dropped"
        )

    def __reduce__(self):  # pickled by backends that ship errors between processes
        return (type(self), (self.finished, self.required, self.dropped))


class ClusterConnectionError(ProgramLogicError, ConnectionError):
    """A context lost the connection to the cluster that runs its work.

    Nothing of the round in progress is kept; rerunning the program with the same
    program-state manager resumes after the last saved round.
    """
