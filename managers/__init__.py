"""Storing and publishing the values of a federated program.

The lower layer of programlogic, usable on its own: program-state managers checkpoint a
program's state by version, release managers publish values (metrics, models) by key,
and :mod:`managers.structure` / :mod:`managers.values` handle the nested structures and
value references they store. Nothing here imports ``programlogic``.
"""

from managers.clock import Clock, SystemClock
from managers.exceptions import (
    AllVersionsDamagedError,
    ManagerError,
    NewerFormatError,
    SerializationError,
    StateDirectoryLockedError,
    VersionError,
    VersionExistsError,
    VersionNotFoundError,
)
from managers.release import (
    BestModelReleaseManager,
    CSVFileReleaseManager,
    DelayedReleaseManager,
    FilteringReleaseManager,
    GroupingReleaseManager,
    JSONLinesReleaseManager,
    LoggingReleaseManager,
    MemoryReleaseManager,
    ModelFileReleaseManager,
    PeriodicReleaseManager,
    ReleaseKey,
    ReleaseManager,
    check_key,
)
from managers.release.tensorboard import TensorBoardReleaseManager
from managers.state import (
    FileProgramStateManager,
    MemoryProgramStateManager,
    ProgramStateManager,
    Retention,
)
from managers.values import ValueReference, materialize
from managers.writes import PreparedWrite, WriteBatch, WriteQueue

__all__ = [
    "AllVersionsDamagedError",
    "BestModelReleaseManager",
    "CSVFileReleaseManager",
    "Clock",
    "DelayedReleaseManager",
    "FileProgramStateManager",
    "FilteringReleaseManager",
    "GroupingReleaseManager",
    "JSONLinesReleaseManager",
    "LoggingReleaseManager",
    "ManagerError",
    "MemoryProgramStateManager",
    "MemoryReleaseManager",
    "ModelFileReleaseManager",
    "NewerFormatError",
    "PeriodicReleaseManager",
    "PreparedWrite",
    "ProgramStateManager",
    "ReleaseKey",
    "ReleaseManager",
    "Retention",
    "SerializationError",
    "StateDirectoryLockedError",
    "SystemClock",
    "TensorBoardReleaseManager",
    "ValueReference",
    "VersionError",
    "VersionExistsError",
    "VersionNotFoundError",
    "WriteBatch",
    "WriteQueue",
    "check_key",
    "materialize",
]
