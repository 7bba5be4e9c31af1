"""A release manager that releases only the leaves whose paths a predicate keeps."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from managers.release._ordering import CallOrder
from managers.release.base import ReleaseKey, ReleaseManager, check_key
from managers.structure import children, dict_like, is_container, join_path
from managers.validation import check_callable, check_type
from managers.values import materialize

__all__ = ["FilteringReleaseManager"]


class FilteringReleaseManager(ReleaseManager):
    """Releases to ``manager`` the part of each value whose leaf paths ``filter_fn`` keeps.

    The value is materialized, then ``filter_fn(path)`` is called with the path of each of
    its leaves (see :mod:`managers.structure`; ``""`` for a value that is a leaf itself),
    and a leaf stays when it returns true. ``manager`` receives:

    - a container all of whose leaves stay, as it is (when everything stays, the value
      itself);
    - a container that loses some leaves, as a dict of what stays in it keyed by the
      child's name in the path: a dict keeps its own type, while a list, tuple,
      NamedTuple or dataclass becomes a plain dict keyed by index or field name, so that
      every leaf keeps its path (``weights/1`` stays ``weights/1``, not ``weights/0``);
    - no container left with no leaves: one that was empty, or whose leaves were all
      dropped, is left out.

    When no leaf stays, nothing is released: ``manager`` is not called and keeps what the
    key held. When releases of one key overlap, the last call wins: a call whose value is
    ready only after a later call of the same key was handed on is dropped. ``aclose``
    closes ``manager``.

    Example: keep the training loss and every accuracy::

        FilteringReleaseManager(
            csv, lambda path: path == "client_work/train/loss" or path.endswith("accuracy")
        )
    """

    def __init__(self, manager: ReleaseManager, filter_fn: Callable[[str], bool]) -> None:
        self._manager = check_type("manager", manager, ReleaseManager)
        self._filter_fn = check_callable("filter_fn", filter_fn)
        self._order = CallOrder()

    @property
    def manager(self) -> ReleaseManager:
        """The manager released to."""
        return self._manager

    async def release(self, value: Any, key: ReleaseKey) -> None:
        check_key(key)
        with self._order.call(key) as ticket:
            kept = _keep(await materialize(value), "", self._filter_fn)
            if not ticket.hand_on():
                return  # a later release of this key was handed on
            if kept is not _DROPPED:
                # No pause between the check above and this call: the manager receives the
                # calls of one key in the order they were handed on.
                await self._manager.release(kept, key)

    async def aclose(self) -> None:
        await self._manager.aclose()


_DROPPED = object()


def _keep(node: Any, path: str, filter_fn: Callable[[str], bool]) -> Any:
    """``node`` with only the leaves ``filter_fn`` keeps, or ``_DROPPED`` if none."""
    if not is_container(node):
        return node if filter_fn(path) else _DROPPED
    kept: dict[str, Any] = {}
    whole = True
    for name, child in children(node, path):
        result = _keep(child, join_path(path, name), filter_fn)
        if result is _DROPPED:
            whole = False
        else:
            kept[name] = result
            whole = whole and result is child
    if not kept:
        return _DROPPED
    if whole:
        return node
    return dict_like(node, kept) if isinstance(node, dict) else kept
