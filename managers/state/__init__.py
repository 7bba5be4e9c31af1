"""Program-state managers: the abstract base and its implementations."""

from managers.state.base import ProgramStateManager
from managers.state.memory import MemoryProgramStateManager

__all__ = ["MemoryProgramStateManager", "ProgramStateManager"]
