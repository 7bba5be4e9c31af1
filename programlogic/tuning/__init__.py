"""Hyperparameter tuning as program logic: concurrent, pruned, resumable trials on Optuna.

:func:`tune` runs a study whose trials are ``train_model`` runs: the search space is
Optuna's ``suggest_*`` calls, the factory builds each trial's :class:`TrialProgram`, the
objective is an evaluation metric. Trials run concurrently in one federated context,
report each evaluation to Optuna's pruner, checkpoint under ``<root>/trials/<number>/``
and resume after a crash as the same trials. Needs the ``tuning`` extra
(``pip install 'programlogic[tuning]'``).
"""

from programlogic.tuning._trial import PRUNED, TrialProgram, TrialSpec
from programlogic.tuning.tuner import StudyProgress, TrialSummary, TuningResult, tune

__all__ = [
    "PRUNED",
    "StudyProgress",
    "TrialProgram",
    "TrialSpec",
    "TrialSummary",
    "TuningResult",
    "tune",
]
