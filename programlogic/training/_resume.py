"""Whether ``train_model`` may resume from a saved checkpoint: the same configuration."""

from __future__ import annotations

import logging
from typing import Any, NoReturn

from managers.state.base import ProgramStateManager
from managers.structure import structure_misfit
from programlogic.exceptions import ResumeError
from programlogic.training.checkpoint import Checkpoint

__all__ = [
    "check_resumable",
    "check_state_fits",
    "configuration_differences",
    "load_resumable",
]

logger = logging.getLogger(__name__)

_ABSENT = object()
_SHOWN_DIFFERENCES = 5
_SHOWN_CHARACTERS = 80

# How the keys of the built-in samplers' descriptions (ClientSampler.describe) read.
_SAMPLER_KEY_NAMES = {"num_clients": "number of clients"}
_SAMPLER_KEYS_TOO_LONG_TO_SHOW = {"client_ids_sha256": "another set of client ids"}


async def load_resumable(
    state_manager: ProgramStateManager,
    initial_state: Any,
    *,
    total_rounds: int,
    sampler: Any,
    per_round_clients: int,
    configuration: dict[str, Any],
    allow_changed_configuration: bool,
) -> tuple[Checkpoint | None, int | None]:
    """The newest checkpoint of ``state_manager`` and its version, or ``None``s.

    Raises ResumeError when it was written by another configuration than this run's
    (:func:`check_resumable`), when its train state does not fit ``initial_state``
    (:func:`check_state_fits`), or when what the process and the data source describe
    of their configuration differs, unless ``allow_changed_configuration`` (then the
    differences are logged as a warning).
    """
    try:
        saved, version = await state_manager.load_latest(Checkpoint.template(initial_state))
    except (TypeError, ValueError) as error:
        await _raise_for_misfit(state_manager, initial_state, error)
    if saved is None:
        return None, None
    checkpoint = Checkpoint.from_saved(saved, version)
    check_resumable(
        checkpoint,
        version,
        total_rounds=total_rounds,
        sampler=sampler,
        per_round_clients=per_round_clients,
    )
    check_state_fits(checkpoint, version, initial_state)
    changed = configuration_differences(checkpoint.configuration, configuration)
    if changed is not None and not allow_changed_configuration:
        raise ResumeError(
            f"cannot resume from the program state of round {version}: it was written "
            f"with another configuration: {changed}; to continue with this run's "
            "configuration on purpose, pass resume_with_changed_configuration=True to "
            "train_model"
        )
    if changed is not None:
        logger.warning(
            "resuming after round %d with a changed configuration, saved from now on: %s",
            version,
            changed,
        )
    return checkpoint, version


async def _raise_for_misfit(
    state_manager: ProgramStateManager, initial_state: Any, error: Exception
) -> NoReturn:
    """Raise ResumeError naming how the saved train state does not fit ``initial_state``,
    when that is why loading it with ``initial_state`` as template raised ``error``;
    otherwise raise ``error``."""
    try:
        saved, version = await state_manager.load_latest()
        checkpoint = Checkpoint.from_saved(saved, version)
    except Exception:
        raise error from None
    check_state_fits(checkpoint, version, initial_state)
    raise error


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


def check_state_fits(checkpoint: Checkpoint, version: int, initial_state: Any) -> None:
    """Raise ResumeError unless the saved train state has the structure of ``initial_state``
    (:func:`managers.structure.structure_misfit`), naming the first difference."""
    misfit = structure_misfit(checkpoint.train_state, initial_state)
    if misfit is not None:
        raise ResumeError(
            f"cannot resume from the program state of round {version}: its train state "
            f"does not fit this run's learning process (another model?): at {misfit}"
        )


def configuration_differences(saved: Any, current: dict[str, Any]) -> str | None:
    """What differs between a checkpoint's configuration and this run's, or ``None``.

    Each part (``process``, ``data``) is compared only when both runs described it;
    the differing key paths are named with the saved value and this run's (the first
    few of them).
    """
    if not isinstance(saved, dict):
        return None
    differences: list[str] = []
    for part, now in current.items():
        was = saved.get(part)
        if was is not None and now is not None:
            _differences(part, was, now, differences)
    if not differences:
        return None
    shown = "; ".join(differences[:_SHOWN_DIFFERENCES])
    more = len(differences) - _SHOWN_DIFFERENCES
    return shown + (f"; and {more} more" if more > 0 else "")


def _differences(path: str, was: Any, now: Any, found: list[str]) -> None:
    if isinstance(was, dict) and isinstance(now, dict):
        for key in {**was, **now}:
            _differences(f"{path}/{key}", was.get(key, _ABSENT), now.get(key, _ABSENT), found)
    elif isinstance(was, list) and isinstance(now, list) and len(was) == len(now):
        for index, (old, new) in enumerate(zip(was, now, strict=True)):
            _differences(f"{path}/{index}", old, new, found)
    elif not _equal(was, now):
        found.append(f"{path}={_shorten(was)} (this run: {_shorten(now)})")


def _shorten(value: Any) -> str:
    text = _show(value)
    if len(text) <= _SHOWN_CHARACTERS:
        return text
    return text[: _SHOWN_CHARACTERS - 3] + "..."
