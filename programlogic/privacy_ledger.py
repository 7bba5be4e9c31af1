"""The privacy ledger: the privacy a run has spent, kept apart from its program state.

Spent privacy is not program state: losing the state (a deleted directory, every
version damaged) must not give the budget back. ``train_model`` keeps a
:class:`PrivacyLedger` for every differentially private run, an append-only, fsynced
file of JSON lines with one :class:`LedgerEntry` a round, keyed by the noise secret's
fingerprint and the round; every start reads it and cross-checks it with the
checkpoint (see :class:`PrivacyLedger` for what it promises and what it does not).
Where it lives by default: :func:`ledger_path_beside` the program state's directory.
The accounting itself, what a round spends, is :mod:`programlogic.privacy`'s.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import logging
import math
import os
from pathlib import Path
from typing import Any

import anyio
import numpy as np
import orjson

from managers.files import fsync_directory
from managers.validation import check_int, check_number, check_path, check_str, check_type
from programlogic.exceptions import PrivacyLedgerError
from programlogic.privacy import GaussianMechanism, composed_epsilon

__all__ = [
    "LEDGER_SUFFIX",
    "LedgerEntry",
    "PrivacyLedger",
    "ledger_path_beside",
    "secret_fingerprint",
]

logger = logging.getLogger(__name__)


def secret_fingerprint(secret: Any) -> str:
    """A fingerprint of a noise secret (an array of integers): 32 hex digits of SHA-256.

    It names the secret in the ledger without revealing it: finding a 128-bit secret
    from it is a preimage search. Equal values give equal fingerprints whatever the
    integer dtype. Raises TypeError for an array that is not of integers, ValueError
    for an empty one.
    """
    array = np.asarray(secret)
    if array.dtype.kind not in "iu":
        raise TypeError(f"a noise secret must be an array of integers, got dtype {array.dtype}")
    if array.size == 0:
        raise ValueError("a noise secret must hold at least one integer, got an empty array")
    text = f"{list(array.shape)}:" + ",".join(str(int(word)) for word in array.ravel())
    digest = hashlib.sha256(b"programlogic.privacy secret\0" + text.encode())
    return digest.hexdigest()[:32]


LEDGER_SUFFIX = ".privacy_ledger.jsonl"
"""What :func:`ledger_path_beside` appends to the state directory's name."""

_LEDGER_FORMAT = 1
_HEADER_KEY = "programlogic_privacy_ledger"


def ledger_path_beside(state_dir: str | os.PathLike[str]) -> Path:
    """Where ``train_model`` keeps the privacy ledger of a run whose program state is in
    ``state_dir`` (a file state manager's ``root_dir``) when it is given no path: the
    file ``{state_dir name}.privacy_ledger.jsonl`` beside that directory, in its parent
    (``runs/dp/state`` -> ``runs/dp/state.privacy_ledger.jsonl``). Outside the state
    directory, so deleting that directory does not delete it."""
    directory = check_path("state_dir", state_dir)
    return directory.parent / f"{directory.name}{LEDGER_SUFFIX}"


@dataclasses.dataclass(frozen=True)
class LedgerEntry:
    """One differentially private round in a :class:`PrivacyLedger`: one JSON line.

    ``secret``: the :func:`secret_fingerprint` of the run's noise secret; ``round_num``:
    the ``train_model`` round (``"round"`` in the file); ``rounds``: the rounds the
    aggregator had counted with that secret after it; ``mechanism`` and ``delta``: the
    round's; ``epsilon``: the privacy spent in all after it at ``delta`` as
    ``train_model`` accounted it (the ledger's earlier secrets included; ``inf``
    without noise; ``None`` for rounds recorded from a checkpoint, whose figure was not
    computed); ``time``: when it was recorded (Unix seconds on the run's clock), or
    ``None``. Rounds are keyed by :attr:`key`, ``(secret, round_num)``: a round replayed
    after a crash (the same secret and round: the same noise) is counted once.
    """

    secret: str
    round_num: int
    rounds: int
    mechanism: GaussianMechanism
    delta: float
    epsilon: float | None
    time: int | None = None

    @property
    def key(self) -> tuple[str, int]:
        """``(secret, round_num)``: what makes a round count once."""
        return self.secret, self.round_num

    def to_record(self) -> dict[str, Any]:
        """The entry as the JSON object of its line."""
        epsilon = self.epsilon
        return {
            "secret": self.secret,
            "round": self.round_num,
            "rounds": self.rounds,
            "mechanism": {
                key: value for key, value in self.mechanism.describe().items() if key != "adjacency"
            },
            "delta": self.delta,
            "epsilon": "inf" if epsilon is not None and math.isinf(epsilon) else epsilon,
            "time": self.time,
        }

    @classmethod
    def from_record(cls, record: Any) -> LedgerEntry:
        """The entry a line's JSON object holds; ValueError saying what is wrong with it."""
        if not isinstance(record, dict):
            raise ValueError(f"an entry must be a JSON object, got {record!r}")
        try:
            secret = check_str("secret", record["secret"], allow_empty=False)
            round_num = check_int("round", record["round"], minimum=1)
            rounds = check_int("rounds", record["rounds"], minimum=0)
            mechanism = GaussianMechanism.from_description(record["mechanism"])
            delta = check_number("delta", record["delta"], above=0, below=1)
            epsilon = record.get("epsilon")
            if epsilon == "inf":
                epsilon = math.inf
            check_number("epsilon", epsilon, minimum=0, allow_none=True)
            time = check_int("time", record.get("time"), allow_none=True)
        except KeyError as missing:
            raise ValueError(f"an entry lacks {missing}") from None
        except TypeError as error:
            raise ValueError(str(error)) from None
        return cls(
            secret,
            round_num,
            rounds,
            mechanism,
            float(delta),
            None if epsilon is None else float(epsilon),
            time,
        )


class PrivacyLedger:
    """The privacy a run has spent, kept apart from its program state: an append-only,
    fsynced file of JSON lines, one :class:`LedgerEntry` a differentially private round.

    ``train_model`` keeps one for every DP run (its ``privacy_ledger`` argument, or by
    default :func:`ledger_path_beside` a file state manager's directory) and records
    each round in it before that round's checkpoint is saved, so no checkpoint, release
    or evaluation of a round exists that the ledger does not hold. On every start it
    reads the ledger and refuses (:class:`~programlogic.exceptions.PrivacySpentError`,
    naming the epsilon spent at delta and the rounds) to start over while the ledger
    holds rounds, unless told ``privacy_spent_acknowledged=<that epsilon>``, and to
    resume a checkpoint whose aggregator counts other rounds than it trained.

    What it promises: spent privacy survives losing the program state (a deleted state
    directory, every version damaged and set aside with ``on_all_damaged="start_fresh"``,
    an edited checkpoint), and the budget stop and the released epsilon count every
    round it holds, those of earlier noise secrets too. What it does not cover: deleting
    or editing the ledger itself (deleting the run's root directory deletes both), a new
    run with another ledger (another root) trained on the same data, and a ledger shared
    by runs that are not meant to share a budget. A DP run whose program state has no
    directory (a memory state manager) needs a path: without one ``train_model`` refuses
    to start.

    On disk: a first line ``{"programlogic_privacy_ledger": 1}``, then one entry a line,
    each written with one ``write`` and fsynced before :meth:`append` returns (the file
    and its directory are fsynced when created). Only rounds are appended; nothing is
    ever rewritten, except a torn last line, the trace of a crash in the middle of an
    append (a line without its newline): it is ignored when read, and cut off when
    the ledger is opened, with a warning. Any other damage (a line that is not an
    entry, a first line that is not the header) raises
    :class:`~programlogic.exceptions.PrivacyLedgerError` naming the file and the line:
    restore the file, since setting it aside forgets the privacy it records.

    Opening takes an exclusive lock (``flock``) on the file until :meth:`close`: one run
    at a time writes a ledger; another raises ``PrivacyLedgerError``. Blocking file
    work: ``async with ledger:`` opens it and :meth:`record` appends in a worker
    thread. :meth:`read` reads one without locking or repairing it.
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = check_path("path", path)
        self._entries: dict[tuple[str, int], LedgerEntry] = {}
        self._descriptor: int | None = None
        self._size = 0

    def __repr__(self) -> str:
        return f"PrivacyLedger({str(self.path)!r})"

    @property
    def entries(self) -> tuple[LedgerEntry, ...]:
        """The rounds held, in the order they were recorded (each key once)."""
        return tuple(self._entries.values())

    def __contains__(self, key: object) -> bool:
        return key in self._entries

    @classmethod
    def read(cls, path: str | os.PathLike[str]) -> tuple[LedgerEntry, ...]:
        """The entries of the ledger at ``path`` (none when there is no file), a torn last
        line ignored; read without a lock, nothing written. Blocking."""
        ledger = cls(path)
        try:
            data = ledger.path.read_bytes()
        except FileNotFoundError:
            return ()
        ledger._parse(data)
        return ledger.entries

    def open(self) -> None:
        """Create or open the file, lock it, read it and cut off a torn last line
        (blocking). Raises PrivacyLedgerError when it is damaged or locked."""
        if self._descriptor is not None:
            raise RuntimeError(f"{self!r} is already open")
        directory = self.path.parent
        created = [each for each in (directory, *directory.parents) if not each.exists()]
        directory.mkdir(parents=True, exist_ok=True)
        for each in reversed(created):  # each new directory's entry made durable
            fsync_directory(each.parent)
        flags = os.O_RDWR | os.O_CREAT | os.O_APPEND | getattr(os, "O_CLOEXEC", 0)
        descriptor = os.open(self.path, flags, 0o644)
        try:
            _lock(descriptor, self.path)
            with os.fdopen(os.dup(descriptor), "rb") as file:
                data = file.read()
            torn = self._parse(data)
            size = len(data) - len(torn)
            if torn:
                logger.warning(
                    "the privacy ledger %s ends with a torn line (%d bytes, a crash in the "
                    "middle of an append): ignored and cut off",
                    self.path,
                    len(torn),
                )
                os.ftruncate(descriptor, size)
                os.fsync(descriptor)
            if size == 0:
                header = orjson.dumps({_HEADER_KEY: _LEDGER_FORMAT}) + b"\n"
                _write_all(descriptor, header)
                os.fsync(descriptor)
                fsync_directory(directory)
                size = len(header)
        except BaseException:
            os.close(descriptor)
            raise
        self._descriptor, self._size = descriptor, size

    def close(self) -> None:
        """Close the file and release its lock; a no-op when it is not open."""
        descriptor, self._descriptor = self._descriptor, None
        if descriptor is not None:
            os.close(descriptor)

    async def __aenter__(self) -> PrivacyLedger:
        await anyio.to_thread.run_sync(self.open)
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        self.close()  # closing a descriptor does not block, and must happen when cancelled

    def append(self, entry: LedgerEntry) -> bool:
        """Append ``entry`` and fsync, unless its key is held (then False: counted once).

        Blocking. A failed write (a full disk) cuts the file back to where it was and
        raises. Raises RuntimeError when the ledger is not open.
        """
        check_type("entry", entry, LedgerEntry)
        if self._descriptor is None:
            raise RuntimeError(f"{self!r} is not open: open it (async with) before appending")
        if entry.key in self._entries:
            return False
        line = orjson.dumps(entry.to_record()) + b"\n"
        try:
            _write_all(self._descriptor, line)
            os.fsync(self._descriptor)
        except BaseException:
            with contextlib.suppress(OSError):
                os.ftruncate(self._descriptor, self._size)
            raise
        self._size += len(line)
        self._entries[entry.key] = entry
        return True

    async def record(self, *entries: LedgerEntry) -> int:
        """:meth:`append` each of ``entries``, in order, in one worker-thread call; returns
        how many were appended (the others' keys were held)."""

        def append_each() -> int:
            return sum(self.append(entry) for entry in entries)

        return await anyio.to_thread.run_sync(append_each)

    def rounds_by_mechanism(
        self, *, excluding_secret: str | None = None
    ) -> dict[GaussianMechanism, int]:
        """How many rounds of each mechanism the ledger holds, leaving out those of the
        noise secret whose fingerprint is ``excluding_secret``."""
        counts: dict[GaussianMechanism, int] = {}
        for entry in self._entries.values():
            if entry.secret != excluding_secret:
                counts[entry.mechanism] = counts.get(entry.mechanism, 0) + 1
        return counts

    def rounds_of(self, secret: str) -> dict[int, LedgerEntry]:
        """The rounds held of the noise secret whose fingerprint is ``secret``, by round."""
        return {
            entry.round_num: entry for entry in self._entries.values() if entry.secret == secret
        }

    def spent(self, delta: float) -> float:
        """Epsilon at ``delta`` of every round held, composed (blocking CPU work)."""
        return composed_epsilon(self.rounds_by_mechanism(), delta)

    def _parse(self, data: bytes) -> bytes:
        """Read ``data`` into the entries; returns its torn last line (``b""`` for none)."""
        end = data.rfind(b"\n") + 1
        complete, torn = data[:end], data[end:]
        lines = complete.split(b"\n")[:-1]
        self._entries = {}
        for number, line in enumerate(lines, start=1):
            try:
                record = orjson.loads(line)
            except orjson.JSONDecodeError as error:
                raise self._damaged(number, f"not JSON ({error})") from None
            if number == 1:
                self._check_header(record)
                continue
            try:
                entry = LedgerEntry.from_record(record)
            except ValueError as error:
                raise self._damaged(number, str(error)) from None
            self._entries.setdefault(entry.key, entry)
        return torn

    def _check_header(self, record: Any) -> None:
        version = record.get(_HEADER_KEY) if isinstance(record, dict) else None
        if version == _LEDGER_FORMAT:
            return
        if isinstance(version, int) and not isinstance(version, bool):
            raise PrivacyLedgerError(
                f"the privacy ledger {self.path} is in format {version}; this code reads "
                f"format {_LEDGER_FORMAT}: use a newer programlogic"
            )
        raise self._damaged(1, f"not a privacy ledger's first line ({record!r})")

    def _damaged(self, line: int, what: str) -> PrivacyLedgerError:
        return PrivacyLedgerError(
            f"the privacy ledger {self.path} is damaged at line {line}: {what}; only a torn "
            "last line (a crash in the middle of an append) is repaired: restore the file "
            "from a copy, since setting it aside forgets the privacy it records"
        )


def _lock(descriptor: int, path: Path) -> None:
    """Lock the ledger's file for this process, or raise PrivacyLedgerError."""
    import fcntl

    try:
        fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        raise PrivacyLedgerError(
            f"the privacy ledger {path} is in use by another run: one run at a time writes a ledger"
        ) from None


def _write_all(descriptor: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(descriptor, view) :]
