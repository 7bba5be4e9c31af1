"""The configuration of a run that a checkpoint records: what its parts describe of it.

A learning process and a data source may each have a ``describe_configuration()``
method returning a JSON-able dict (or ``None``): the hyperparameters a resumed run must
share with the run that saved the checkpoint. ``train_model`` records both with every
checkpoint and compares them on resume.
"""

from __future__ import annotations

import json
from typing import Any

from managers.validation import describe

__all__ = ["describe_run"]


def describe_run(process: Any, data_source: Any) -> dict[str, Any]:
    """``{"process": ..., "data": ...}``: what ``process`` and ``data_source`` describe.

    Either is ``None`` when the object has no ``describe_configuration`` or it returns
    ``None``. Raises ``TypeError`` naming the method when a description is not a
    JSON-able dict (str keys; dicts, lists, str, int, float, bool and ``None`` values).
    """
    return {
        "process": _described("train_process", process),
        "data": _described("train_data_source", data_source),
    }


def _described(argument: str, subject: Any) -> dict[str, Any] | None:
    method = getattr(subject, "describe_configuration", None)
    if method is None:
        return None
    description = method()
    name = f"{argument}.describe_configuration()"
    if description is None:
        return None
    if not isinstance(description, dict):
        raise TypeError(f"{name} must return a dict or None, got {describe(description)}")
    try:
        same = json.loads(json.dumps(description, allow_nan=False)) == description
    except (TypeError, ValueError):
        same = False
    if not same:
        raise TypeError(
            f"{name} must return a JSON-able dict (str keys; dicts, lists, str, int, "
            f"float, bool and None values), got {description!r}"
        )
    return description
