"""A run's configuration, as clients send it in ``POST /runs``, validated by pydantic."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

__all__ = ["RunConfig", "confine"]

TRAIN_CLIENTS = 10  # writers 0-9 of scikit-learn's digits train; see load_digits_writers


class RunConfig(BaseModel):
    """Federated averaging on scikit-learn's handwritten digits, one client per writer.

    Unknown fields are refused, so a typo never silently falls back to a default.
    ``directory`` is where the run keeps its checkpoints and metrics, relative to the
    service's data directory (default: ``runs/{id}``).
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    rounds: int = Field(ge=1, le=1_000_000)
    clients_per_round: int = Field(default=TRAIN_CLIENTS, ge=1, le=TRAIN_CLIENTS)
    model: Literal["softmax", "mlp", "cnn"] = "softmax"
    client_lr: float = Field(default=0.02, gt=0, le=10)
    server_lr: float = Field(default=1.0, gt=0, le=10)
    epochs: int = Field(default=5, ge=1, le=100)
    batch_size: int = Field(default=5, ge=1, le=1024)
    seed: int = Field(default=0, ge=0, lt=2**63)
    directory: str | None = Field(default=None, min_length=1, max_length=200)


def confine(data_dir: Path, directory: str) -> Path:
    """``directory`` resolved under ``data_dir``; ``ValueError`` if it would land elsewhere.

    Relative paths are taken from ``data_dir``; ``..`` parts, absolute paths outside
    ``data_dir`` and symbolic links that lead out of it are refused. The data
    directory itself is refused too: it holds the service's own files.
    """
    root = data_dir.resolve()
    candidate = Path(directory)
    if ".." in candidate.parts:
        raise ValueError(f"directory must not contain '..', got {directory!r}")
    resolved = (root / candidate).resolve()
    if resolved == root or not resolved.is_relative_to(root):
        raise ValueError(f"directory must be inside the data directory, got {directory!r}")
    return resolved
