"""Release managers: the abstract base, its sinks and its wrappers."""

from managers.release.base import ReleaseKey, ReleaseManager, check_key
from managers.release.best import BestModelReleaseManager
from managers.release.csv_file import CSVFileReleaseManager
from managers.release.delayed import DelayedReleaseManager
from managers.release.filtering import FilteringReleaseManager
from managers.release.grouping import GroupingReleaseManager
from managers.release.jsonl import JSONLinesReleaseManager
from managers.release.logging import LoggingReleaseManager
from managers.release.memory import MemoryReleaseManager
from managers.release.model_file import ModelFileReleaseManager
from managers.release.periodic import PeriodicReleaseManager

__all__ = [
    "BestModelReleaseManager",
    "CSVFileReleaseManager",
    "DelayedReleaseManager",
    "FilteringReleaseManager",
    "GroupingReleaseManager",
    "JSONLinesReleaseManager",
    "LoggingReleaseManager",
    "MemoryReleaseManager",
    "ModelFileReleaseManager",
    "PeriodicReleaseManager",
    "ReleaseKey",
    "ReleaseManager",
    "check_key",
]
