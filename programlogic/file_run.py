"""A file-backed run: program state, metrics, evaluations and models under one root.

:class:`FileRun` builds the managers a ``train_model`` run keeps on disk, each at a
fixed place under ``root``:

- ``state/``: the program state (:class:`~managers.FileProgramStateManager`, keeping
  ``state_keep_total`` versions, the first one too if ``state_keep_first``);
- ``metrics.csv`` and/or ``metrics.jsonl``: the training metrics, one row per round
  (``metrics_formats`` picks the files);
- ``tensorboard/``: training and evaluation metrics as TensorBoard scalars, when
  ``tensorboard`` is true (one event stream for both, as their tags differ);
- ``models/``: the released models, a version per key
  (:class:`~managers.ModelFileReleaseManager`), the final model among them;
- with an ``evaluation`` (a :class:`FileRunEvaluation`): ``evaluation.csv`` and/or
  ``evaluation.jsonl``, each evaluation's final metrics keyed by train round, and
  ``evaluation/<name>/``, the :class:`~programlogic.EvaluationManager`'s own state.

Everything is found again on a rerun with the same root, so ``train_model`` resumes
where the last run stopped and its evaluations go on.

Use it as an async context manager, and pass :meth:`FileRun.train_model_arguments` to
``train_model``::

    async with FileRun(root, evaluation=FileRunEvaluation(eval_process, test, 10)) as run:
        await train_model(
            train_process=process, train_data_source=train, train_per_round_clients=10,
            train_total_rounds=100, **run.train_model_arguments(),
        )

Managers a caller adds (``metrics_managers``, ``model_managers``, the evaluation's
``metrics_managers``, ``per_round_metrics_manager`` and ``evaluated_model_manager``)
receive the same releases as the files; they stay the caller's, who closes them. The
managers :class:`FileRun` creates are its own: leaving the ``async with`` (or
:meth:`FileRun.aclose`) closes them, the evaluation manager first, and so frees the
state directory for another run.

Bad input raises at construction: ``TypeError`` for a wrong type, ``ValueError`` for a
wrong value, each naming the argument; entering raises ``NotADirectoryError`` naming
``root`` when it is a file, and creates it (parents too) when it is missing.
"""

from __future__ import annotations

import dataclasses
import datetime
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal

import anyio.to_thread

from managers import (
    CSVFileReleaseManager,
    FileProgramStateManager,
    GroupingReleaseManager,
    JSONLinesReleaseManager,
    ModelFileReleaseManager,
    ReleaseKey,
    ReleaseManager,
    TensorBoardReleaseManager,
    check_key,
)
from managers.validation import (
    check_bool,
    check_int,
    check_interface,
    check_path,
    check_timedelta,
    describe,
)
from programlogic.data import FederatedDataSource
from programlogic.evaluation import EvaluationManager
from programlogic.process import LearningProcess

__all__ = ["FileRun", "FileRunEvaluation", "MetricsFormat"]

MetricsFormat = Literal["csv", "jsonl"]
"""A metrics file's format: ``"csv"`` (``*.csv``) or ``"jsonl"`` (JSON lines, ``*.jsonl``)."""

_FORMATS: dict[str, type[ReleaseManager]] = {
    "csv": CSVFileReleaseManager,
    "jsonl": JSONLinesReleaseManager,
}


@dataclasses.dataclass(frozen=True)
class FileRunEvaluation:
    """How a :class:`FileRun` evaluates: the :class:`~programlogic.EvaluationManager`'s inputs.

    Each evaluation runs ``process`` on ``cohort_size`` clients of ``data_source`` for
    at least one round and until ``duration`` has passed (zero: one round), at most
    ``max_concurrent`` at once, clients sampled with ``seed``. Its final metrics go to
    the run's evaluation files and to ``metrics_managers``; its per-round metrics to
    ``per_round_metrics_manager`` (dropped when None); the evaluated model, when
    ``evaluated_model_manager`` is given, to it. Each evaluation's state directory keeps
    ``state_keep_total`` versions.
    """

    process: LearningProcess
    data_source: FederatedDataSource
    cohort_size: int
    duration: datetime.timedelta = datetime.timedelta(0)
    max_concurrent: int | None = None
    seed: int = 0
    metrics_managers: Sequence[ReleaseManager] = ()
    per_round_metrics_manager: ReleaseManager | None = None
    evaluated_model_manager: ReleaseManager | None = None
    state_keep_total: int = 1

    def __post_init__(self) -> None:
        check_interface("process", self.process, "LearningProcess", ["initialize", "next"])
        check_interface("data_source", self.data_source, "FederatedDataSource", ["iterator"])
        check_int("cohort_size", self.cohort_size, minimum=1)
        check_timedelta("duration", self.duration, minimum=datetime.timedelta(0))
        check_int("max_concurrent", self.max_concurrent, minimum=1, allow_none=True)
        check_int("seed", self.seed, minimum=0)
        object.__setattr__(
            self, "metrics_managers", _managers("metrics_managers", self.metrics_managers)
        )
        for name in ("per_round_metrics_manager", "evaluated_model_manager"):
            check_interface(
                name, getattr(self, name), "ReleaseManager", ["release"], allow_none=True
            )
        check_int("state_keep_total", self.state_keep_total, minimum=1)


class _Dropping(ReleaseManager):
    """Drops what it is given: per-round evaluation metrics nobody asked for."""

    async def release(self, value: Any, key: ReleaseKey) -> None:
        check_key(key)


class FileRun:
    """The managers of one ``train_model`` run kept under ``root`` (see the module).

    Attributes: ``root``; ``state`` (the program-state manager); ``train_metrics`` (the
    training metrics' release manager: its files, TensorBoard, ``metrics_managers``);
    ``models`` (the model release manager: ``models/`` and ``model_managers``);
    ``model_files`` (the :class:`~managers.ModelFileReleaseManager` of ``models/``, to
    find or load a released version); ``evaluations`` (the evaluation manager, None
    without an ``evaluation``).
    """

    def __init__(
        self,
        root: str | Path,
        *,
        metrics_formats: Sequence[MetricsFormat] = ("csv",),
        tensorboard: bool = False,
        state_keep_total: int | None = 3,
        state_keep_first: bool = True,
        metrics_managers: Sequence[ReleaseManager] = (),
        model_managers: Sequence[ReleaseManager] = (),
        evaluation: FileRunEvaluation | None = None,
    ) -> None:
        self.root: Path = check_path("root", root)
        formats = _formats(metrics_formats)
        check_bool("tensorboard", tensorboard)
        check_int("state_keep_total", state_keep_total, minimum=1, allow_none=True)
        check_bool("state_keep_first", state_keep_first)
        metrics_managers = _managers("metrics_managers", metrics_managers)
        model_managers = _managers("model_managers", model_managers)
        if evaluation is not None and not isinstance(evaluation, FileRunEvaluation):
            raise TypeError(
                f"evaluation must be a FileRunEvaluation or None, got {describe(evaluation)}"
            )
        root = self.root
        owned: list[Any] = []  # closed in reverse order: the evaluation manager first

        def own(manager: Any) -> Any:
            owned.append(manager)
            return manager

        shared: list[ReleaseManager] = []
        if tensorboard:
            shared.append(own(TensorBoardReleaseManager(root / "tensorboard")))
        self.state: FileProgramStateManager = own(
            FileProgramStateManager(
                root / "state", keep_total=state_keep_total, keep_first=state_keep_first
            )
        )
        metric_files = [own(_FORMATS[f](root / f"metrics.{f}")) for f in formats]
        self.train_metrics: ReleaseManager = _group([*metric_files, *shared, *metrics_managers])
        self.model_files: ModelFileReleaseManager = own(ModelFileReleaseManager(root / "models"))
        self.models: ReleaseManager = _group([self.model_files, *model_managers])
        self.evaluations: EvaluationManager | None = None
        if evaluation is not None:
            evaluation_files = [own(_FORMATS[f](root / f"evaluation.{f}")) for f in formats]
            per_round = evaluation.per_round_metrics_manager or _Dropping()
            keep = evaluation.state_keep_total
            self.evaluations = own(
                EvaluationManager(
                    data_source=evaluation.data_source,
                    aggregated_metrics_manager=_group(
                        [*evaluation_files, *shared, *evaluation.metrics_managers]
                    ),
                    create_state_manager_fn=lambda name: FileProgramStateManager(
                        root / "evaluation" / name, keep_total=keep
                    ),
                    create_process_fn=lambda name: (evaluation.process, per_round),
                    cohort_size=evaluation.cohort_size,
                    duration=evaluation.duration,
                    max_concurrent=evaluation.max_concurrent,
                    seed=evaluation.seed,
                    evaluated_model_manager=evaluation.evaluated_model_manager,
                )
            )
        self._owned = owned

    def train_model_arguments(self) -> dict[str, Any]:
        """``train_model``'s manager arguments for this run, to pass as ``**`` keywords:
        ``program_state_manager``, ``model_output_manager``, ``train_metrics_manager``
        and, with an evaluation, ``evaluation_manager``."""
        arguments: dict[str, Any] = {
            "program_state_manager": self.state,
            "model_output_manager": self.models,
            "train_metrics_manager": self.train_metrics,
        }
        if self.evaluations is not None:
            arguments["evaluation_manager"] = self.evaluations
        return arguments

    async def __aenter__(self) -> FileRun:
        await anyio.to_thread.run_sync(_make_root, self.root)
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Close the managers this run created, the evaluation manager first; the
        first failure is raised once all were tried. Managers passed in stay open."""
        failure: BaseException | None = None
        for manager in reversed(self._owned):
            try:
                await manager.aclose()
            except Exception as error:  # the others still close
                failure = failure or error
        if failure is not None:
            raise failure


def _make_root(root: Path) -> None:
    if root.exists() and not root.is_dir():
        raise NotADirectoryError(f"root {str(root)!r} is a file, not a directory")
    root.mkdir(parents=True, exist_ok=True)


def _formats(value: Any) -> tuple[str, ...]:
    if isinstance(value, str) or not isinstance(value, Sequence):
        raise TypeError(
            f"metrics_formats must be a sequence of 'csv' and 'jsonl', got {describe(value)}"
        )
    for item in value:
        if item not in _FORMATS:
            raise ValueError(f"metrics_formats may hold 'csv' and 'jsonl' only, got {item!r}")
    if not value:
        raise ValueError("metrics_formats must name at least one format, got none")
    if len(set(value)) != len(value):
        raise ValueError(f"metrics_formats names a format twice: {list(value)!r}")
    return tuple(value)


def _managers(name: str, value: Any) -> tuple[ReleaseManager, ...]:
    if isinstance(value, str) or not isinstance(value, Sequence):
        raise TypeError(f"{name} must be a sequence of ReleaseManagers, got {describe(value)}")
    for index, manager in enumerate(value):
        check_interface(f"{name}[{index}]", manager, "ReleaseManager", ["release"])
    return tuple(value)


def _group(managers: list[ReleaseManager]) -> ReleaseManager:
    # Never closed as a group: it would close the caller's managers too.
    return managers[0] if len(managers) == 1 else GroupingReleaseManager(managers)
