"""A run's configuration, as clients send it in ``POST /runs``, validated by pydantic."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated, Literal, NoReturn

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationInfo
from pydantic_core import PydanticCustomError

from samples.service.lock import LOCK_FILE

__all__ = [
    "INDEX",
    "MAX_NAME_BYTES",
    "RECORDED",
    "SERVICE_FILES",
    "RunConfig",
    "check_run_directory",
    "check_token",
    "confine",
]

TRAIN_CLIENTS = 10  # writers 0-9 of scikit-learn's digits train; see load_digits_writers

INDEX = "runs.json"
"""The registry's record of the runs, in the data directory."""

SERVICE_FILES = (INDEX, LOCK_FILE)
"""The service's own files in its data directory; no part of a run's directory is named so."""

MAX_NAME_BYTES = 255
"""The longest file name most file systems take, in bytes (``confine`` asks the one in use)."""

_RUN_FILES_BYTES = 128
"""Room kept, under the longest path the system takes, for the files a run writes."""

RECORDED = "recorded"
"""The validation context of configurations read back from ``runs.json``: their directory
was accepted when the run started, under the rules of the time, so it is not checked again."""


def check_run_directory(directory: str | None, info: ValidationInfo) -> str | None:
    """``directory`` if it is a name a run may have; a pydantic error naming it otherwise.

    Refused: control characters, empty parts, hidden parts (starting with ``.``, which
    also refuses ``.`` and ``..``), parts named after the service's own files, and parts
    over :data:`MAX_NAME_BYTES` bytes in UTF-8.
    """
    if directory is None or (info.context or {}).get(RECORDED):
        return directory
    if any(ord(character) < 32 or ord(character) == 127 for character in directory):
        _refuse("directory must not contain control characters", directory)
    parts = directory.split("/")
    if Path(directory).is_absolute():
        _refuse("directory must be relative to the runs directory", directory)
    if any(part == "" for part in parts):
        _refuse("directory must not have an empty part", directory)
    if any(part.startswith(".") for part in parts):
        _refuse("directory must not have a hidden part (starting with '.')", directory)
    for own in SERVICE_FILES:
        if any(part.startswith(own) for part in parts):
            _refuse(f"directory must not be named after the service's file {own}", directory)
    longest = max(len(part.encode()) for part in parts)
    if longest > MAX_NAME_BYTES:
        _refuse(
            f"each part of directory must be at most {MAX_NAME_BYTES} bytes in UTF-8 "
            f"(one has {longest})",
            directory,
        )
    return directory


def _refuse(rule: str, directory: str) -> NoReturn:
    # A custom error type keeps pydantic from prefixing the message with "Value error, ".
    raise PydanticCustomError(
        "run_directory", "{rule}, got {value}", {"rule": rule, "value": repr(directory)}
    )


class RunConfig(BaseModel):
    """Federated averaging on scikit-learn's handwritten digits, one client per writer.

    Unknown fields are refused, so a typo never silently falls back to a default; values
    are strict (``true`` is not a round count, ``"3"`` is not a number). ``directory`` is
    where the run keeps its checkpoints and metrics, relative to the ``runs/`` directory
    of the service's data directory (default: the run's id).
    """

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    rounds: int = Field(ge=1, le=1_000_000)
    clients_per_round: int = Field(default=TRAIN_CLIENTS, ge=1, le=TRAIN_CLIENTS)
    model: Literal["softmax", "mlp", "cnn"] = "softmax"
    client_lr: float = Field(default=0.02, gt=0, le=10)
    server_lr: float = Field(default=1.0, gt=0, le=10)
    epochs: int = Field(default=5, ge=1, le=100)
    batch_size: int = Field(default=5, ge=1, le=1024)
    seed: int = Field(default=0, ge=0, lt=2**63)
    directory: Annotated[
        str | None, Field(min_length=1, max_length=200), AfterValidator(check_run_directory)
    ] = None


def check_token(token: str) -> None:
    """Refuse a bearer token that is short, blank, or would not survive an HTTP header.

    Raises:
        ValueError: naming what is wrong (never the token itself).
    """
    if not token.isascii():
        raise ValueError("token must be printable ASCII")
    if any(character.isspace() or not character.isprintable() for character in token):
        raise ValueError("token must not contain whitespace or control characters")
    if len(token) < 16:
        raise ValueError(f"token must be at least 16 characters long, got {len(token)}")


def confine(runs_dir: Path, directory: str) -> Path:
    """``directory`` resolved under ``runs_dir``; ``ValueError`` if it would land elsewhere.

    ``..`` parts, absolute paths and symbolic links that lead out of ``runs_dir`` are
    refused, as is ``runs_dir`` itself; so are names longer than the file system takes
    and paths too long for the files a run writes.
    """
    root = runs_dir.resolve()
    candidate = Path(directory)
    if ".." in candidate.parts:
        raise ValueError(f"directory must not contain '..', got {directory!r}")
    resolved = (root / candidate).resolve()
    if resolved == root or not resolved.is_relative_to(root):
        raise ValueError(f"directory must be inside the runs directory, got {directory!r}")
    existing = next(parent for parent in (resolved, *resolved.parents) if parent.exists())
    name_max = _limit(existing, "PC_NAME_MAX", MAX_NAME_BYTES)
    path_max = _limit(existing, "PC_PATH_MAX", 4096)
    longest = max(len(os.fsencode(part)) for part in candidate.parts)
    if longest > name_max:
        raise ValueError(
            f"each part of directory must be at most {name_max} bytes (one has {longest}), "
            f"got {directory!r}"
        )
    length = len(os.fsencode(resolved)) + _RUN_FILES_BYTES
    if length > path_max:
        raise ValueError(
            f"directory makes paths too long ({length} bytes with the run's files, over "
            f"{path_max}), got {directory!r}"
        )
    return resolved


def _limit(directory: Path, name: str, default: int) -> int:
    try:
        return os.pathconf(directory, name)
    except (OSError, ValueError):
        return default
