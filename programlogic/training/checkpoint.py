"""The checkpoint ``train_model`` saves after each round: a versioned record.

A :class:`Checkpoint` is saved to the program state manager as a plain dict
(:meth:`Checkpoint.to_saved`), which every state manager stores losslessly, and read
back with :meth:`Checkpoint.from_saved`, which checks it and refuses a format this code
does not read. The saved form of format version 1::

    {
        "format_version": 1,                  # absent in checkpoints written before it
        "train_state": ...,                   # the learning process's state
        "round": 3,
        "metrics": {...},                     # the round's metrics; None for round 0
        "evaluation": {"due": True, "last_time": 1767225720},
        "stop_reason": "early_stopped",       # None while training goes on
        "sampler": {...},                     # the data source iterator's describe()
        "per_round_clients": 10,
        "configuration": {"process": {...}, "data": {...}},   # absent before it existed
        "trained_at_us": 1767225720123456,    # absent before it existed
    }

Checkpoints written before stop reasons existed hold ``"stopped": True`` instead of a
``stop_reason``; they read as stopped for ``StopReason.EARLY_STOPPED``. Checkpoints
written before the configuration was recorded (a compatible addition) read with
``configuration`` ``None``: nothing of it is compared when they are resumed. Those
written before ``trained_at_us`` (the clock's time, in Unix microseconds, when the
round's ``next`` returned: the time the checkpoint cadence measures intervals from)
read with ``trained_at`` ``None``: a resumed cadence then measures from the time of
the resume.

Changing the record:

- A new field is a compatible change: give it a default, write it in ``to_saved`` under
  a new key, and read it in ``from_saved`` with that default when the key is absent.
  Older checkpoints then load with the default, and older code ignores the new key.
  The format version stays.
- An incompatible change (a key renamed, a value whose meaning changes) bumps
  :data:`FORMAT_VERSION`; ``from_saved`` keeps reading every version in
  :data:`READABLE_VERSIONS`, converting the older ones. Older code refuses the new
  version with a :class:`~programlogic.exceptions.CheckpointFormatError` instead of
  misreading it.
"""

from __future__ import annotations

import dataclasses
import datetime
from typing import Any

from programlogic.exceptions import CheckpointFormatError, ResumeError
from programlogic.stopping import StopReason

__all__ = ["FORMAT_VERSION", "READABLE_VERSIONS", "Checkpoint"]

FORMAT_VERSION = 1
"""The format version this code writes."""

READABLE_VERSIONS = (1,)
"""The format versions this code reads."""

_EPOCH = datetime.datetime(1970, 1, 1, tzinfo=datetime.UTC)

# Keys without which a saved value was not written by train_model.
_REQUIRED_KEYS = ("train_state", "round", "sampler", "per_round_clients")


@dataclasses.dataclass
class Checkpoint:
    """The program state of one round, as ``train_model`` saves it.

    ``train_state``: the learning process's state after round ``round_num``;
    ``metrics``: that round's metrics (``None`` for round 0); ``sampler`` and
    ``per_round_clients``: the configuration a resumed run must match;
    ``configuration``: what the learning process and the data source described of
    their configuration (``{"process": ..., "data": ...}``, each a JSON-able dict or
    ``None``), ``None`` in checkpoints written before it was recorded;
    ``evaluation_due``: whether the round is evaluated; ``last_evaluation``: when the
    latest evaluation up to this round started (Unix seconds), ``None`` before any;
    ``stop_reason``: why this round is the last, ``None`` while training goes on;
    ``trained_at``: the clock's time when the round's ``next`` returned (the initial
    state's: when training started), ``None`` in checkpoints written before it was
    recorded; ``save_due``: whether ``train_model``'s checkpoint cadence saves this
    round (decided in the training task; not stored: a stored checkpoint was saved);
    ``format_version``: :data:`FORMAT_VERSION`, also for a checkpoint read from an older
    format (``from_saved`` converts it).
    """

    train_state: Any
    round_num: int
    metrics: Any
    sampler: Any
    per_round_clients: int
    evaluation_due: bool = False
    last_evaluation: int | None = None
    stop_reason: StopReason | None = None
    configuration: dict[str, Any] | None = None
    trained_at: datetime.datetime | None = None
    save_due: bool = dataclasses.field(default=True, compare=False)
    format_version: int = dataclasses.field(default=FORMAT_VERSION, init=False)

    @staticmethod
    def template(train_state: Any) -> dict[str, Any]:
        """The structure to load a saved checkpoint with, so that ``train_state`` comes back
        with the container types of ``train_state`` (NamedTuples, dataclasses)."""
        return {"train_state": train_state}

    def to_saved(self) -> dict[str, Any]:
        """The plain structure a program state manager stores."""
        return {
            "format_version": self.format_version,
            "train_state": self.train_state,
            "round": self.round_num,
            "metrics": self.metrics,
            "evaluation": {"due": self.evaluation_due, "last_time": self.last_evaluation},
            "stop_reason": None if self.stop_reason is None else str(self.stop_reason),
            "sampler": self.sampler,
            "per_round_clients": self.per_round_clients,
            "configuration": self.configuration,
            "trained_at_us": _microseconds(self.trained_at),
        }

    @classmethod
    def from_saved(cls, saved: Any, version: int) -> Checkpoint:
        """The checkpoint that ``saved``, version ``version`` of a program state manager, holds.

        Raises :class:`~programlogic.exceptions.CheckpointFormatError` when it is in a
        format version this code does not read, and
        :class:`~programlogic.exceptions.ResumeError` when it was not written by
        ``train_model``.
        """
        if not isinstance(saved, dict):
            raise _not_ours(version)
        format_version = saved.get("format_version", 1)
        if format_version not in READABLE_VERSIONS:
            raise CheckpointFormatError(version, format_version, READABLE_VERSIONS)
        if any(key not in saved for key in _REQUIRED_KEYS):
            raise _not_ours(version)
        evaluation = saved.get("evaluation") or {}
        return cls(
            train_state=saved["train_state"],
            round_num=saved["round"],
            metrics=saved.get("metrics"),
            sampler=saved["sampler"],
            per_round_clients=saved["per_round_clients"],
            evaluation_due=evaluation.get("due", False),
            last_evaluation=evaluation.get("last_time"),
            stop_reason=_saved_stop_reason(saved),
            configuration=saved.get("configuration"),
            trained_at=_from_microseconds(saved.get("trained_at_us")),
        )


def _microseconds(when: datetime.datetime | None) -> int | None:
    if when is None:
        return None
    return (when - _EPOCH) // datetime.timedelta(microseconds=1)


def _from_microseconds(microseconds: Any) -> datetime.datetime | None:
    if microseconds is None:
        return None
    return _EPOCH + datetime.timedelta(microseconds=int(microseconds))


def _saved_stop_reason(saved: dict[str, Any]) -> StopReason | None:
    """The stop reason a saved checkpoint holds, also one written before stop reasons."""
    if saved.get("stop_reason") is not None:
        return StopReason(str(saved["stop_reason"]))
    return StopReason.EARLY_STOPPED if saved.get("stopped") else None


def _not_ours(version: int) -> ResumeError:
    return ResumeError(
        f"version {version} of the program state manager was not written by "
        "train_model; give train_model a state manager of its own"
    )
