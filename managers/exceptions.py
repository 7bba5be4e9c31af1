"""The errors that managers raise.

::

    ManagerError
     ├── VersionError (also ValueError)        a version that cannot be saved
     │    └── VersionExistsError               the version was saved before
     ├── VersionNotFoundError (also LookupError)  no saved state under that version
     ├── StateDirectoryLockedError             another manager uses the state directory
     │                                         (managers.state.file)
     └── SerializationError                    stored bytes that cannot be decoded
                                               (managers.serialization)

Errors raised by a value being released or saved (a leaf that cannot be stored, a
failing value reference) and operating-system errors (a full disk) are not wrapped:
they propagate as they are.
"""

from __future__ import annotations

__all__ = [
    "ManagerError",
    "SerializationError",
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


class SerializationError(ManagerError):
    """Data that cannot be decoded: not a payload of this codec, an unknown format
    version, a checksum mismatch (damaged bytes) or a truncated payload."""
