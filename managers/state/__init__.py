"""Program-state managers: the abstract base and its implementations."""

from managers.state.base import ProgramStateManager, Retention
from managers.state.file import FileProgramStateManager
from managers.state.memory import MemoryProgramStateManager

__all__ = [
    "FileProgramStateManager",
    "MemoryProgramStateManager",
    "ProgramStateManager",
    "Retention",
]
