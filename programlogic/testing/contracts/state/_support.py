"""What the tests of the program-state suite share: the manager factory and the states
they save."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from managers.state.base import ProgramStateManager

__all__ = ["StateManagerFactory", "state_of"]

StateManagerFactory = Callable[[], ProgramStateManager]


def state_of(round_number: int) -> dict[str, Any]:
    """The state a program saves after round ``round_number``."""
    return {
        "round": round_number,
        "weights": [float(round_number), float(round_number) + 0.5],
        "optimizer": {"lr": 0.1, "step": round_number},
        "name": f"round-{round_number}",
    }
