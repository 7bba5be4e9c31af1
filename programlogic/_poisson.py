"""Poisson sampling of clients: each client joins a round on its own coin."""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import Any


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
