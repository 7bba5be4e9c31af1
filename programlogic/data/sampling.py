"""Seeded, resumable client sampling: which clients a round picks.

:class:`ClientSampler` selects ``k`` of a fixed list of handles for a round, a pure
function of ``(seed, round_num)``, in one of the :class:`Sampling` modes.
"""

from __future__ import annotations

import enum
import hashlib
import struct
from collections.abc import Sequence
from typing import Any

from managers.validation import (
    check_choice,
    check_int,
)
from programlogic.data.protocols import ClientHandle, check_distinct_client_ids

__all__ = ["ClientSampler", "Sampling", "poisson_select"]


class Sampling(enum.StrEnum):
    """How a sampler picks the clients of a round."""

    UNIFORM = "uniform"
    """k distinct clients, uniformly at random, new for every round."""
    WITH_REPLACEMENT = "with_replacement"
    """k clients drawn independently; a client may appear more than once in a round."""
    FIXED = "fixed"
    """The same k distinct clients every round, picked once from the seed."""
    POISSON = "poisson"
    """Each client joins a round with probability k / N (its coin keyed by seed, round, id)."""


class ClientSampler:
    """Samples clients from a fixed list of handles (what ``InMemoryDataSource.iterator`` gives).

    Handles are sorted by client id once, so the selection depends on the set of ids,
    not on the order they came in; an id given twice is a ``ValueError``. The random
    words of round ``r`` are the SHAKE-256 output of ``"{seed}/{r}"``
    (``"{seed}/fixed"`` for a fixed cohort): a standard that no library upgrade
    changes, so a resumed run selects what the first run selected even on another
    NumPy or Python. Distinct clients are drawn by a partial Fisher-Yates shuffle
    (words reduced modulo the remaining count; the bias is below ``count / 2**64``), so
    the first ``k`` of a fixed cohort are the same for every larger ``k``.
    """

    def __init__(
        self,
        handles: Sequence[ClientHandle],
        seed: int,
        sampling: Sampling | str = Sampling.UNIFORM,
    ) -> None:
        check_int("seed", seed, minimum=0)
        self._handles = sorted(handles)
        if not self._handles:
            raise ValueError(f"handles must hold at least one client, got {handles!r}")
        check_distinct_client_ids("handles", (handle.client_id for handle in self._handles))
        self._seed = seed
        self._sampling = check_choice("sampling", sampling, Sampling)

    def select(self, k: int, round_num: int) -> list[ClientHandle]:
        check_int("k", k, minimum=1)
        check_int("round_num", round_num, minimum=0)
        count = len(self._handles)
        if k > count and self._sampling is not Sampling.WITH_REPLACEMENT:
            raise ValueError(
                f"cannot select {k} distinct clients from {count} clients; "
                f"lower k or sample with replacement"
            )
        if self._sampling is Sampling.POISSON:  # see poisson_select for the coins
            return poisson_select(self._handles, self._seed, k, round_num)
        stream = "fixed" if self._sampling is Sampling.FIXED else str(round_num)
        words = _random_words(f"{self._seed}/{stream}", k)
        handles = self._handles
        if self._sampling is Sampling.WITH_REPLACEMENT:
            return [handles[word % count] for word in words]
        swapped: dict[int, int] = {}
        chosen = []
        for position, word in enumerate(words):
            pick = position + word % (count - position)
            chosen.append(handles[swapped.get(pick, pick)])
            swapped[pick] = swapped.get(position, position)
        return chosen

    def describe(self) -> dict[str, Any]:
        ids = "\n".join(handle.client_id for handle in self._handles)
        return {
            "seed": self._seed,
            "sampling": str(self._sampling),
            "num_clients": len(self._handles),
            "client_ids_sha256": hashlib.sha256(ids.encode()).hexdigest(),
        }


def _random_words(key: str, count: int) -> tuple[int, ...]:
    """``count`` uniformly random 64-bit words determined by ``key``."""
    return struct.unpack(f"<{count}Q", hashlib.shake_256(key.encode()).digest(8 * count))


def poisson_select(handles: Sequence[Any], seed: int, k: int, round_num: int) -> list[Any]:
    """The handles whose clients join round ``round_num``, each with probability ``k / N``.

    Client ``c`` joins when the 64-bit word ``w``, the first 8 bytes (little-endian) of
    the SHAKE-256 output of ``"{seed}/{round_num}/poisson/{c}"``, satisfies
    ``w * N < k * 2**64``: a pure function of the seed, the round and the client's id
    (not of the other clients), with probability ``k / N`` to within ``2**-64``.
    The handles keep their order; a round may hold any number of clients, none included.
    """
    count = len(handles)
    threshold = k << 64
    prefix = f"{seed}/{round_num}/poisson/"
    chosen = []
    for handle in handles:  # client handles: anything with a client_id
        digest = hashlib.shake_256((prefix + handle.client_id).encode()).digest(8)
        if int.from_bytes(digest, "little") * count < threshold:
            chosen.append(handle)
    return chosen
