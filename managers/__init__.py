"""Storing and publishing the values of a federated program.

The lower layer of programlogic, usable on its own: program-state managers checkpoint a
program's state by version, release managers publish values (metrics, models) by key,
and :mod:`managers.structure` / :mod:`managers.values` handle the nested structures and
value references they store. Nothing here imports ``programlogic``.
"""

from managers.exceptions import (
    ManagerError,
    VersionError,
    VersionExistsError,
    VersionNotFoundError,
)
from managers.release import MemoryReleaseManager, ReleaseKey, ReleaseManager
from managers.state import MemoryProgramStateManager, ProgramStateManager
from managers.values import ValueReference, materialize

__all__ = [
    "ManagerError",
    "MemoryProgramStateManager",
    "MemoryReleaseManager",
    "ProgramStateManager",
    "ReleaseKey",
    "ReleaseManager",
    "ValueReference",
    "VersionError",
    "VersionExistsError",
    "VersionNotFoundError",
    "materialize",
]
