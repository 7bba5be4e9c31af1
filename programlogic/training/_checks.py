"""The checks ``train_model`` makes of what users give it: its arguments, before anything
starts, and what the learning process returns."""

from __future__ import annotations

import datetime
import logging
from typing import Any

from managers.validation import (
    check_bool,
    check_int,
    check_interface,
    check_number,
    check_path,
    check_timedelta,
    describe,
)
from programlogic.context import FederatedContext
from programlogic.process import LearningProcessOutput
from programlogic.stopping import StoppingPolicy
from programlogic.training._cadence import Cadence

__all__ = ["check_arguments", "check_output", "warn_of_long_waits"]

logger = logging.getLogger(__name__)


def warn_of_long_waits(
    stopping: StoppingPolicy | None,
    stopping_waits_for_evaluations: bool,
    evaluation_manager: object,
) -> None:
    """Log a warning when the waiting mode would hold each round for a long evaluation."""
    duration = getattr(evaluation_manager, "duration", None)
    if (
        stopping is not None
        and stopping_waits_for_evaluations
        and isinstance(duration, datetime.timedelta)
        and duration > datetime.timedelta(0)
    ):
        logger.warning(
            "stopping_waits_for_evaluations=True: each evaluated round waits until its "
            "evaluation's duration (%s) is over; give the EvaluationManager "
            "duration=timedelta(0) to decide after one evaluation round",
            duration,
        )


def check_arguments(**arguments: Any) -> int | datetime.timedelta:
    """Validate ``train_model``'s arguments; returns the evaluation periodicity."""
    check_interface(
        "train_process",
        arguments["train_process"],
        "LearningProcess",
        ["initialize", "next", "get_model_weights", "set_model_weights"],
    )
    check_interface(
        "train_data_source", arguments["train_data_source"], "FederatedDataSource", ["iterator"]
    )
    check_int("train_per_round_clients", arguments["train_per_round_clients"], minimum=1)
    check_int("train_total_rounds", arguments["train_total_rounds"], minimum=1)
    check_int("seed", arguments["seed"], minimum=0)
    check_interface(
        "program_state_manager",
        arguments["program_state_manager"],
        "ProgramStateManager",
        ["save", "load_latest"],
    )
    check_interface(
        "model_output_manager", arguments["model_output_manager"], "ReleaseManager", ["release"]
    )
    check_interface(
        "train_metrics_manager",
        arguments["train_metrics_manager"],
        "ReleaseManager",
        ["release"],
        allow_none=True,
    )
    check_interface(
        "evaluation_manager",
        arguments["evaluation_manager"],
        "EvaluationManager",
        ["resume_from_previous_state", "start_evaluation", "wait_for_evaluations_to_finish"],
        allow_none=True,
    )
    check_interface(
        "stopping",
        arguments["stopping"],
        "StoppingPolicy",
        ["before_round", "after_evaluation"],
        allow_none=True,
    )
    check_bool("stopping_waits_for_evaluations", arguments["stopping_waits_for_evaluations"])
    check_bool("resume_with_changed_configuration", arguments["resume_with_changed_configuration"])
    check_interface("clock", arguments["clock"], "Clock", ["now"], allow_none=True)
    check_int("checkpoint_every", arguments["checkpoint_every"], minimum=1)
    check_timedelta(
        "checkpoint_interval",
        arguments["checkpoint_interval"],
        above=datetime.timedelta(0),
        allow_none=True,
    )
    check_path("privacy_ledger", arguments["privacy_ledger"], allow_none=True)
    check_number(
        "privacy_spent_acknowledged",
        arguments["privacy_spent_acknowledged"],
        minimum=0,
        allow_none=True,
    )
    periodicity = arguments["evaluation_periodicity"]
    if isinstance(periodicity, datetime.timedelta):
        return check_timedelta("evaluation_periodicity", periodicity, above=datetime.timedelta(0))
    if isinstance(periodicity, bool) or not isinstance(periodicity, int):
        raise TypeError(
            "evaluation_periodicity must be an int >= 1 (rounds) or a timedelta > 0, "
            f"got {describe(periodicity)}"
        )
    return check_int("evaluation_periodicity", periodicity, minimum=1)


def check_cadence(cadence: Cadence, context: FederatedContext, periodicity: Any) -> None:
    """Refuse a checkpoint cadence whose replayed rounds would not be the rounds lost."""
    if cadence.every_round:
        return
    asked = f"checkpoint_every={cadence.every}" + (
        "" if cadence.interval is None else f" and checkpoint_interval={cadence.interval}"
    )
    if not context.replays_rounds:
        raise ValueError(
            f"{asked} needs a federated context that computes a round again exactly, and "
            f"this {type(context).__name__} does not (a round deadline drops clients by "
            "timing): the rounds after a checkpoint, computed again after a crash, would "
            "differ from the ones released; checkpoint every round"
        )
    if isinstance(periodicity, datetime.timedelta):
        raise ValueError(
            f"{asked} needs an int evaluation_periodicity, got {periodicity!r}: which "
            "rounds a time period evaluates depends on when they run, so the rounds "
            "computed again after a crash would not be evaluated as the ones released"
        )


def check_output(output: Any) -> LearningProcessOutput:
    """``output`` of ``train_process.next``, once it is known to hold a state and metrics."""
    if not (hasattr(output, "state") and hasattr(output, "metrics")):
        raise TypeError(
            "train_process.next must return a LearningProcessOutput(state, "
            f"metrics), got {type(output).__name__}"
        )
    return output
