"""Client preprocessing: repeat, shuffle and batch one client's arrays, seeded.

:class:`Preprocessing` does what the ``tf.data`` pipeline of TFF's EMNIST tutorial does
(``repeat(epochs).shuffle(buffer, seed).batch(batch_size)``), on numpy arrays, as a pure
function of the client's data and a seed. :func:`client_seed` derives that seed from the
program's seed, the round and the client, so a resumed run shuffles every client exactly
as the uninterrupted run did.
"""

from __future__ import annotations

import dataclasses
import hashlib
import math
from typing import NamedTuple

import numpy as np

from managers.validation import check_int, check_shape, check_type
from programlogic.datasets.arrays import ClientArrays

__all__ = ["BatchOrder", "ClientBatches", "Preprocessing", "client_seed"]


class ClientBatches(NamedTuple):
    """The batches of one client, padded to a full last batch.

    ``x`` is float32 ``[num_batches, batch_size, *feature_shape]``, ``y`` int32
    ``[num_batches, batch_size]``; ``mask`` is float32 ``[num_batches, batch_size]``,
    1 for a real example and 0 for the zero padding that fills the last batch.
    """

    x: np.ndarray
    y: np.ndarray
    mask: np.ndarray


class BatchOrder(NamedTuple):
    """The examples of a client's batches, by index: what :class:`ClientBatches` gathers.

    ``indices`` is int32 ``[num_batches, batch_size]`` (index 0 in padding slots);
    ``mask`` is float32 of the same shape, 1 for a real example and 0 for padding.
    """

    indices: np.ndarray
    mask: np.ndarray


@dataclasses.dataclass(frozen=True)
class Preprocessing:
    """Repeats a client's examples ``epochs`` times, shuffles them and batches them.

    The order is that of ``tf.data``'s ``repeat(epochs).shuffle(shuffle_buffer)
    .batch(batch_size)``: a buffer holds the first ``shuffle_buffer`` elements of the
    repeated stream; each output element is taken from a uniformly random slot of the
    buffer, which is refilled with the next element of the stream, and once the stream
    is exhausted the rest of the buffer comes out in random order. So with a buffer
    smaller than the client, examples can only move a bounded distance, and epochs
    mix only near their boundaries, as in TFF. ``shuffle_buffer=0`` (or 1) keeps the
    order: epoch after epoch of the data as given. The last batch is kept even when
    partial, padded with zeros and masked out.

    ``feature_shape``, when given, reshapes every example (``(784,)`` flattens 28x28
    images, ``(28, 28, 1)`` adds a channel axis).

    Calling it is a pure function of the data and the seed (a numpy Generator seeded
    with ``seed``); it is a plain frozen dataclass, so it pickles to other processes.
    """

    epochs: int = 5
    batch_size: int = 20
    shuffle_buffer: int = 100
    feature_shape: tuple[int, ...] | None = None

    def __post_init__(self) -> None:
        check_int("epochs", self.epochs, minimum=1)
        check_int("batch_size", self.batch_size, minimum=1)
        check_int("shuffle_buffer", self.shuffle_buffer, minimum=0)
        check_type("feature_shape", self.feature_shape, tuple, allow_none=True)
        check_shape("feature_shape", self.feature_shape, allow_none=True)

    def for_evaluation(self) -> Preprocessing:
        """The preprocessing that evaluates what this one trains on.

        Same ``feature_shape`` and ``batch_size``, one epoch, no shuffle: every example
        once, shaped as the model trained on it expects.
        """
        return dataclasses.replace(self, epochs=1, shuffle_buffer=0)

    def __call__(self, data: ClientArrays, seed: int) -> ClientBatches:
        """The batches of one client's ``data``, shuffled with ``seed`` (an int >= 0)."""
        examples = self.examples(data)
        order = self.order(len(examples.y), seed)
        padding = order.mask == 0
        x = examples.x[order.indices]
        x[padding] = 0.0
        y = examples.y[order.indices]
        y[padding] = 0
        return ClientBatches(x, y, order.mask)

    def examples(self, data: ClientArrays) -> ClientArrays:
        """``data`` checked, as float32 and int32 arrays, each example in ``feature_shape``.

        Labels that are not integers (regression targets, one-hot rows) stay float32; ``y``
        may hold more than one value per example (``[n, ...]``).
        """
        if not (hasattr(data, "x") and hasattr(data, "y")):
            raise TypeError(
                "a client's data must have x and y arrays (programlogic.datasets.ClientArrays), "
                f"got {type(data).__name__}"
            )
        x = np.asarray(data.x, dtype=np.float32)
        y = np.asarray(data.y)
        y = y.astype(np.int32 if y.dtype.kind in "biu" else np.float32, copy=False)
        if x.ndim < 1 or y.ndim < 1 or y.shape[:1] != x.shape[:1]:
            raise ValueError(
                "data must hold one label per example, got x of shape "
                f"{x.shape} and y of shape {y.shape}"
            )
        count = x.shape[0]
        example_shape = x.shape[1:]
        if self.feature_shape is not None and math.prod(self.feature_shape) != math.prod(
            example_shape
        ):
            raise ValueError(
                f"feature_shape {self.feature_shape} does not fit examples of shape "
                f"{example_shape} ({math.prod(example_shape)} values)"
            )
        shape = example_shape if self.feature_shape is None else self.feature_shape
        return ClientArrays(x.reshape(count, *shape), y)

    def order(self, count: int, seed: int) -> BatchOrder:
        """Which of ``count`` examples fills each slot of each batch, shuffled with ``seed``.

        What :meth:`__call__` gathers, without gathering it: compiled client updates
        take a client's examples once and these indices, instead of ``epochs`` copies.
        """
        check_int("seed", seed, minimum=0)
        check_int("count", count, minimum=0)
        stream = self._order(count, np.random.default_rng(seed))
        total = stream.size
        num_batches = -(-total // self.batch_size)
        padded = num_batches * self.batch_size
        indices = np.zeros(padded, dtype=np.int32)
        indices[:total] = stream
        mask = np.zeros(padded, dtype=np.float32)
        mask[:total] = 1.0
        shape = (num_batches, self.batch_size)
        return BatchOrder(indices.reshape(shape), mask.reshape(shape))

    def _order(self, count: int, rng: np.random.Generator) -> np.ndarray:
        """Indices of the examples in output order, ``epochs * count`` of them.

        Vectorized form of the buffer: while the stream lasts, step ``j`` draws slot
        ``s[j]`` and puts stream element ``buffer + j`` there; so step ``j`` emits what
        the previous step that drew the same slot put there, or the slot's initial
        element when no earlier step drew it. What is left in the buffer at the end
        comes out in a random permutation (each output uniform among the remaining).
        """
        total = self.epochs * count
        buffer = min(self.shuffle_buffer, total)
        if buffer <= 1:
            return np.arange(total, dtype=np.intp) % max(count, 1)
        steps = total - buffer
        slots = rng.integers(0, buffer, size=steps)
        by_slot = np.argsort(slots, kind="stable")  # steps grouped by slot, in time order
        sorted_slots = slots[by_slot]
        same_as_before = np.zeros(steps, dtype=bool)
        same_as_before[1:] = sorted_slots[1:] == sorted_slots[:-1]
        previous_step = np.full(steps, -1, dtype=np.intp)
        previous_step[1:] = by_slot[:-1]
        previous_step = np.where(same_as_before, previous_step, -1)
        emitted = np.empty(steps, dtype=np.intp)
        emitted[by_slot] = np.where(previous_step >= 0, buffer + previous_step, sorted_slots)
        remaining = np.arange(buffer, dtype=np.intp)
        last_of_slot = np.ones(steps, dtype=bool)
        last_of_slot[:-1] = sorted_slots[1:] != sorted_slots[:-1]
        remaining[sorted_slots[last_of_slot]] = buffer + by_slot[last_of_slot]
        stream = np.concatenate([emitted, rng.permutation(remaining)])
        return stream % count


def client_seed(seed: int, round_num: int, client_id: str) -> int:
    """A 63-bit seed for one client's preprocessing in one round.

    It is the first 8 bytes (little endian) of the SHA-256 of
    ``f"{seed}/{round_num}/{client_id}"``, masked to 63 bits: a pure function of the
    three, the same on every platform and library version.
    """
    digest = hashlib.sha256(f"{seed}/{round_num}/{client_id}".encode()).digest()
    return int.from_bytes(digest[:8], "little") & ((1 << 63) - 1)
