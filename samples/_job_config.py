"""The main job's ``config.json``: the flags that define a run, kept so that a rerun resumes it.

A rerun must repeat them (a run resumed with another model or learning rate would end
as no uninterrupted run does), so the first run writes them and every rerun compares.
The file is written atomically, so a crash leaves it whole or absent; a file damaged
otherwise (edited, or cut by a disk error) stops the job with a one-line explanation.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

__all__ = [
    "RUN_DEFINING",
    "DamagedConfigError",
    "OtherRunError",
    "check_config",
    "record_config",
    "run_config",
    "write_config",
]

RUN_DEFINING = (
    "dataset",
    "emnist_train",
    "emnist_test",
    "fashion_clients",
    "model",
    "clients_per_round",
    "sampling",
    "epochs",
    "batch_size",
    "client_lr",
    "algorithm",
    "server_lr",
    "proximal_strength",
    "aggregator",
    "clip_norm",
    "dp_noise_multiplier",
    "dp_clip",
    "dp_delta",
    "privacy_budget",
    "seed",
)
"""The flags a rerun must repeat to resume; the others may change between runs."""

_RECORDED_LATER = {
    "algorithm": "fedavg",
    "proximal_strength": None,
    "aggregator": "mean",
    "clip_norm": None,
    "dp_noise_multiplier": None,
    "dp_clip": None,
    "dp_delta": None,
    "privacy_budget": None,
}
"""Defining flags added after runs were recorded without them: what those runs used."""

_FILE_NAME = "config.json"


class DamagedConfigError(Exception):
    """The run's ``config.json`` cannot be read as a configuration."""

    def __init__(self, path: Path, reason: str) -> None:
        super().__init__(
            f"{path} is damaged ({reason}): restore it, or delete it and rerun with the flags "
            "the run was started with (or pick another --root to start over)"
        )


class OtherRunError(Exception):
    """The root holds a run whose defining flags differ from these."""


def run_config(arguments: Any) -> dict[str, Any]:
    """The defining flags of ``arguments`` (an argparse namespace), as JSON values."""
    return {name: _jsonable(getattr(arguments, name)) for name in RUN_DEFINING}


def _jsonable(value: Any) -> Any:
    return str(value) if isinstance(value, Path) else value


def check_config(root: Path, config: dict[str, Any], *, what: str = "a run configured") -> None:
    """Refuse to go on if ``root`` holds ``what`` otherwise (for the flags in ``config``),
    or a damaged file.

    Reads only: the configuration is written by :func:`record_config` once the flags
    proved usable.

    Raises:
        DamagedConfigError: the file is unreadable, not JSON, or not a JSON object.
        OtherRunError: the file names other values for defining flags.
    """
    before = _read(root / _FILE_NAME)
    if before is None:
        return

    def recorded(name: str) -> Any:
        return before.get(name, _RECORDED_LATER.get(name))

    differing = [
        f"--{name.replace('_', '-')} {recorded(name)!r} -> {config[name]!r}"
        for name in config
        if recorded(name) != config[name]
    ]
    if differing:
        raise OtherRunError(
            f"{root} holds {what} otherwise ({'; '.join(differing)}): "
            "repeat its flags to resume, or pick another --root"
        )


def _read(path: Path) -> dict[str, Any] | None:
    try:
        content = path.read_bytes()
    except FileNotFoundError:
        return None
    except OSError as error:
        raise DamagedConfigError(path, f"it cannot be read: {error.strerror}") from None
    if not content.strip():
        raise DamagedConfigError(path, "it is empty")
    try:
        config = json.loads(content)
    except ValueError as error:  # JSONDecodeError, or UnicodeDecodeError on binary content
        raise DamagedConfigError(path, f"it is not JSON: {error}") from None
    if not isinstance(config, dict):
        raise DamagedConfigError(path, f"it holds a {type(config).__name__}, not a JSON object")
    return config


def record_config(root: Path, config: dict[str, Any]) -> None:
    """Write ``config`` to ``root``'s ``config.json`` unless it has one (blocking I/O)."""
    path = root / _FILE_NAME
    if not path.exists():
        root.mkdir(parents=True, exist_ok=True)
        write_config(path, config)


def write_config(path: Path, config: dict[str, Any]) -> None:
    """Replace ``path`` with ``config`` as JSON: a crash leaves the old file or the new one.

    Written to a temporary file beside it, fsynced, renamed over it, then the directory
    fsynced (so the rename survives a power cut). On an error the temporary file is
    removed and ``path`` is left as it was.
    """
    temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with open(temporary, "w") as file:
            file.write(json.dumps(config, indent=2) + "\n")
            file.flush()
            os.fsync(file.fileno())
        os.replace(temporary, path)
    except BaseException:
        temporary.unlink(missing_ok=True)
        raise
    directory = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(directory)
    finally:
        os.close(directory)
