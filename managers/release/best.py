"""A release manager that passes on a model only when its metric beats the best so far."""

from __future__ import annotations

import math
from typing import Any

import anyio

from managers.release.base import ReleaseKey, ReleaseManager, check_key
from managers.state.base import ProgramStateManager
from managers.validation import check_choice, check_str, check_type, describe
from managers.values import materialize

__all__ = ["BestModelReleaseManager"]


class BestModelReleaseManager(ReleaseManager):
    """Passes on to ``manager`` the model of a release whose metric beats every one before it.

    A released value is an evaluated model, ``{"weights": ..., "metrics": ...}``, as an
    :class:`~programlogic.EvaluationManager` releases it with key = the training round.
    ``metric`` is the path of a number in the metrics, its parts joined by ``/``
    (``"client_work/eval/total_rounds_metrics/sparse_categorical_accuracy"``); with
    ``mode`` ``"max"`` a larger one is better, with ``"min"`` a smaller one. A release
    passes, its ``weights`` released to ``manager`` under the same key, when it is the
    first, when its metric is strictly better than the best so far, or when its key is
    the best's (releasing it again replaces it, e.g. after a restart). A metric that is
    not a finite number never passes. So ``manager`` holds each round that was the best
    when its evaluation finished, and the latest it received is the best of all
    (:meth:`best`); when evaluations finish in round order (``max_concurrent=1``) that
    is its highest key, the version TensorFlow Serving serves.

    The best so far survives a restart when ``state_manager`` is given: before a release
    is passed on, its key and metric are saved to it (a new version each time,
    ``{"key": key, "metric": float}``), and a restarted manager starts from the latest
    version. A state manager of its own keeping one version is enough:
    ``FileProgramStateManager(root / "best", keep_total=1)``. Without one, the best
    starts afresh. Releases are decided and passed on one at a time, in call order.
    ``aclose`` closes ``manager`` (not ``state_manager``, which the caller owns).
    """

    def __init__(
        self,
        manager: ReleaseManager,
        metric: str,
        mode: str = "max",
        *,
        state_manager: ProgramStateManager | None = None,
    ) -> None:
        self._manager = check_type("manager", manager, ReleaseManager)
        check_str("metric", metric, allow_empty=False)
        self._path = metric.split("/")
        if "" in self._path:
            raise ValueError(f"metric must be names joined by '/', got {metric!r}")
        self._metric = metric
        self._mode = check_choice("mode", mode, ["max", "min"])
        check_type("state_manager", state_manager, ProgramStateManager, allow_none=True)
        self._state_manager = state_manager
        self._loaded = state_manager is None
        self._version = 0
        self._best: tuple[ReleaseKey, float] | None = None
        self._lock: anyio.Lock | None = None

    @property
    def manager(self) -> ReleaseManager:
        """The manager released to."""
        return self._manager

    async def best(self) -> tuple[ReleaseKey, float] | None:
        """``(key, metric)`` of the best release passed on so far, or ``None``."""
        async with self._guard():
            await self._load()
            return self._best

    async def release(self, value: Any, key: ReleaseKey) -> None:
        check_key(key)
        async with self._guard():  # one decision and release at a time: the last call wins
            plain = await materialize(value)
            if not isinstance(plain, dict) or set(plain) != {"weights", "metrics"}:
                raise TypeError(
                    "BestModelReleaseManager releases {'weights': ..., 'metrics': ...}, "
                    f"got {describe(plain)}"
                )
            metric = self._read_metric(plain["metrics"])
            await self._load()
            if not self._passes(key, metric):
                return
            if self._state_manager is not None:
                self._version += 1  # before the save: a cancelled save may have saved it
                record = {"key": key, "metric": metric}
                await self._state_manager.save(record, self._version)
            self._best = (key, metric)
            await self._manager.release(plain["weights"], key)

    async def aclose(self) -> None:
        await self._manager.aclose()

    def _passes(self, key: ReleaseKey, metric: float) -> bool:
        if not math.isfinite(metric):
            return False
        if self._best is None or key == self._best[0]:
            return True
        best = self._best[1]
        return metric > best if self._mode == "max" else metric < best

    def _read_metric(self, metrics: Any) -> float:
        node = metrics
        for part in self._path:
            if not isinstance(node, dict) or part not in node:
                raise ValueError(f"the released metrics hold no {self._metric!r}")
            node = node[part]
        try:
            return float(node)
        except (TypeError, ValueError):
            raise TypeError(
                f"metric {self._metric!r} must be a number, got {describe(node)}"
            ) from None

    async def _load(self) -> None:
        if self._loaded or self._state_manager is None:
            return
        record, version = await self._state_manager.load_latest()
        if record is not None:
            key = record["key"]
            self._best = (key if isinstance(key, str) else int(key), float(record["metric"]))
            self._version = version
        self._loaded = True

    def _guard(self) -> anyio.Lock:
        if self._lock is None:
            self._lock = anyio.Lock()
        return self._lock
