"""The errors that managers raise.

::

    ManagerError
     ├── VersionError (also ValueError)        a version that cannot be saved
     │    └── VersionExistsError               the version was saved before
     ├── VersionNotFoundError (also LookupError)  no saved state under that version
     ├── AllVersionsDamagedError               versions are saved, but none of them loads
     ├── StateDirectoryLockedError             another manager uses the state directory
     └── SerializationError                    stored bytes that cannot be decoded, or a
          │                                    structure beyond the codec's limits
          │                                    (managers.serialization)
          └── NewerFormatError                 bytes written by a newer version of the
                                               codec: not damaged, unreadable here

Errors raised by a value being released or saved (a leaf that cannot be stored, a
failing value reference) and operating-system errors (a full disk) are not wrapped:
they propagate as they are.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

__all__ = [
    "AllVersionsDamagedError",
    "ManagerError",
    "NewerFormatError",
    "SerializationError",
    "StateDirectoryLockedError",
    "VersionError",
    "VersionExistsError",
    "VersionNotFoundError",
]


class ManagerError(Exception):
    """Base of the errors raised by program-state and release managers."""


class VersionError(ManagerError, ValueError):
    """A program-state version that cannot be saved: not an int, negative, or too low."""


class VersionExistsError(VersionError):
    """A program-state version that was saved before; versions are saved once."""


class VersionNotFoundError(ManagerError, LookupError):
    """No program state is saved under the requested version."""


class AllVersionsDamagedError(ManagerError):
    """``load_latest`` found saved versions but could load none of them (each damaged).

    Raised instead of returning ``(None, 0)``, which would make a program start over from
    its first round on top of the damaged run; the message names each version and why it
    does not load. :attr:`versions` lists them, ascending.
    """

    def __init__(self, message: str, versions: Iterable[int]) -> None:
        super().__init__(message)
        self.versions: list[int] = sorted(versions)

    def __reduce__(self) -> tuple[Any, ...]:
        return type(self), (self.args[0], self.versions)


class StateDirectoryLockedError(ManagerError):
    """Another program-state manager (in this or another process) uses the directory."""


class SerializationError(ManagerError):
    """Data that cannot be decoded: not a payload of this codec, an unknown format
    version, a checksum mismatch (damaged bytes) or a truncated payload; or a structure
    to encode or decode that is beyond the codec's limits (``MAX_DEPTH``,
    ``MAX_NODES``)."""


class NewerFormatError(SerializationError):
    """Data written in a newer format version of the codec than this code reads.

    The data is not damaged: a newer programlogic reads it. A manager that skips or sets
    aside damaged data (``load_latest``) therefore raises this error instead, leaving
    the data in place. :attr:`found` is the data's format version, :attr:`readable` the
    newest one this code reads.
    """

    def __init__(self, message: str, found: int, readable: int) -> None:
        super().__init__(message)
        self.found = found
        self.readable = readable

    def __reduce__(self) -> tuple[Any, ...]:
        return type(self), (self.args[0], self.found, self.readable)
