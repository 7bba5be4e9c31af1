"""``train_model``: the program logic that trains a model round by round, resumably.

The package holds the loop and what exists only for it, one concept a module:

- ``_loop``: :func:`train_model` itself, :class:`TrainingResult`, :func:`final_model_key`;
- ``_checks``: the checks of its arguments and of what the learning process returns;
- ``_cadence``: which rounds are checkpointed (``checkpoint_every``/``checkpoint_interval``);
- ``_persister``: the task that saves a round's checkpoint, then releases the round;
- ``_resume``: loading the newest checkpoint and refusing one another run wrote;
- ``_stopping``: how the loop asks its stopping policy, and marks the last round;
- ``_evaluations``: what the loop needs of an evaluation manager;
- ``_privacy``: the privacy ledger's checks at start and its record of each round;
- ``_configuration``: the description of a run that a resume compares;
- :mod:`programlogic.training.checkpoint`: the versioned record saved each round.

Each module logs under its own name, below ``programlogic.training``: a handler or
level set on ``programlogic.training`` covers them all.
"""

from programlogic.training._evaluations import EvaluationManagerProtocol
from programlogic.training._loop import TrainingResult, final_model_key, train_model
from programlogic.training.checkpoint import Checkpoint

__all__ = [
    "Checkpoint",
    "EvaluationManagerProtocol",
    "TrainingResult",
    "final_model_key",
    "train_model",
]
