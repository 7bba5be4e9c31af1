"""Whether ``train_model`` may resume from a saved checkpoint: the same configuration."""

from __future__ import annotations

from typing import Any

from programlogic.checkpoint import Checkpoint
from programlogic.exceptions import ResumeError

__all__ = ["check_resumable"]

_ABSENT = object()

# How the keys of the built-in samplers' descriptions (ClientSampler.describe) read.
_SAMPLER_KEY_NAMES = {"num_clients": "number of clients"}
_SAMPLER_KEYS_TOO_LONG_TO_SHOW = {"client_ids_sha256": "another set of client ids"}


def check_resumable(
    checkpoint: Checkpoint,
    version: int,
    *,
    total_rounds: int,
    sampler: Any,
    per_round_clients: int,
) -> None:
    """Raise ResumeError when ``checkpoint``, version ``version``, was written by another
    configuration than this run's, or is beyond its ``total_rounds``.

    The sampler's description is opaque: it is compared as a whole value, and for a
    dict description the keys whose values differ are named.
    """
    if version > total_rounds:
        raise ResumeError(
            f"the program state is at round {version}, beyond train_total_rounds={total_rounds}"
        )
    differences = _sampler_differences(checkpoint.sampler, sampler)
    saved_clients = checkpoint.per_round_clients
    if saved_clients != per_round_clients:
        differences.insert(
            0, f"train_per_round_clients={saved_clients!r} (this run: {per_round_clients!r})"
        )
    if differences:
        raise ResumeError(
            f"cannot resume from the program state of round {version}: it was "
            f"written with {', '.join(differences)}"
        )


def _sampler_differences(saved: Any, current: Any) -> list[str]:
    """What differs between two sampler descriptions, one phrase a difference."""
    if not (isinstance(saved, dict) and isinstance(current, dict)):
        if _equal(saved, current):
            return []
        return [f"the sampler description {saved!r} (this run: {current!r})"]
    differences = []
    for key in {**saved, **current}:
        was, now = saved.get(key, _ABSENT), current.get(key, _ABSENT)
        if _equal(was, now):
            continue
        if key in _SAMPLER_KEYS_TOO_LONG_TO_SHOW:
            differences.append(_SAMPLER_KEYS_TOO_LONG_TO_SHOW[key])
        else:
            name = _SAMPLER_KEY_NAMES.get(key, key)
            differences.append(f"{name}={_show(was)} (this run: {_show(now)})")
    return differences


def _equal(saved: Any, current: Any) -> bool:
    """Whether two description values are equal; values that cannot tell are unequal."""
    try:
        return bool(saved == current)
    except (TypeError, ValueError):  # e.g. arrays, whose == is elementwise
        return False


def _show(value: Any) -> str:
    return "nothing" if value is _ABSENT else repr(value)
