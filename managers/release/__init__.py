"""Release managers: the abstract base, its sinks and its wrappers."""

from managers.release.base import ReleaseKey, ReleaseManager
from managers.release.memory import MemoryReleaseManager

__all__ = ["MemoryReleaseManager", "ReleaseKey", "ReleaseManager"]
