"""Transactions in one partition: open transactions, the last stable offset, the aborted
ones, and the control records (markers) that close them.

A transactional producer's batches carry the transactional attribute (log/records.py's
bit 4) and its producer id and epoch. The transaction coordinator (the metadata group,
dmq/metadata/transactions.py) decides, durably, then writes one **marker** to each
partition the transaction touched: a control batch (attributes bits 4 and 5) of one
record whose key is `MARKER_KEY` (version 0, type 0 abort / 1 commit, as Kafka's), with
the producer id and the epoch the coordinator chose. Its value is empty (a marker from
before the epoch bump: it carries the producer's epoch) or `_MARKER_VALUE` (version 1, the
transaction's epoch): a **bumped marker**, whose own epoch is the transaction's + 1, the
producer's next epoch (KIP-890 part 2; dmq/metadata/transactions.py). Applied in log
order on every replica:

1. a transactional data batch of a producer with no open transaction here opens one at
   its base offset, with the batch's epoch; a batch of an epoch older than the open
   transaction's, or than the producer's known epoch, is refused (`ProducerFencedError`);
2. a marker with an epoch older than the producer's known epoch is refused
   (`ProducerFencedError`). A bumped marker whose epoch the producer already has here
   (known epoch, or its open transaction's) is a duplicate of one applied before (a
   coordinator's retry, or a stale coordinator's marker arriving after the next
   transaction's first batch): refused (`DuplicateMarkerError`), nothing written, nothing
   closed. Otherwise the marker closes the producer's open transaction (if any): an abort
   adds `(producer_id, first_offset, marker_offset)` to the aborted list; and the
   producer's epoch becomes the marker's, which fences the closed transaction's late
   batches (step 1). An unbumped marker (from before the bump, or one of a producer at
   the last epoch) closes whatever is open and, without an open transaction, is written,
   harmless, as before;
3. the **last stable offset** (LSO) is the first offset of the oldest open transaction, or
   the high watermark when none is open: a `read_committed` reader never reads at or past
   it, and filters out the records of aborted transactions (same producer id, inside an
   aborted range, in a transactional batch). Markers are never served as records.

The state is replicated state, kept and stored exactly as the producer states are
(dmq/partition/producers.py): applied in log order, saved with the applied checkpoint
(`raft-producers`) and in the partition's snapshots, replayed from the journal after it.

**Forgetting aborted ranges.** A range is needed while a replica's log may still hold a
record of it. Retention and compaction run on each replica's own clock, so the list is
shortened by a replicated command, the same on every replica: the partition leader, once
its own log holds nothing of the ranges ending below some offset H (its log start offset,
or the end of its last compaction pass: a pass removes every aborted record of the
segments it covers, log/compaction.py), proposes `TrimCommand(H)` (dmq/partition/machine.py);
applying it drops the ranges whose marker lies below H from the replicated list and
raises the **trim horizon** to H. A replica whose own log still holds records of a dropped
range (its retention or compaction lags the leader's) keeps that range in a local list
(`kept`: stored with the state and in its snapshots, never compared between replicas)
until its own log start or compaction passes the marker. Reads and compaction use both
lists, so read_committed returns the same records with or without trimming, on every
replica; a snapshot carries both, and a restore keeps the ranges of the local data it
keeps. State written before trimming (no horizon, no `kept`) reads as horizon 0.

Not thread-safe: the tick thread applies, readers hold the replica's lock.
"""

from __future__ import annotations

import bisect
import struct
from collections.abc import Iterable
from typing import Any, Final, Literal

from dmq.partition.producers import DuplicateMarkerError, ProducerFencedError
from log.errors import CorruptRecordError
from log.records import BatchHeader, DecodedBatch, Record, decode_batch, encode_batch

MARKER_ABORT: Final = 0
MARKER_COMMIT: Final = 1
_MARKER_KEY = struct.Struct(">hh")  # version, type (Kafka's ControlRecordType key)
MARKER_VERSION: Final = 0
# A bumped marker's value: version, the epoch of the transaction it ends (Kafka's marker
# value is version + coordinator epoch; this one names what the partition must check).
_MARKER_VALUE = struct.Struct(">hh")
MARKER_VALUE_VERSION: Final = 1

Isolation = Literal["read_uncommitted", "read_committed"]
ISOLATIONS: Final = ("read_uncommitted", "read_committed")
# (producer_id, first_offset, marker_offset): the offsets [first, marker] of one aborted
# transaction; only that producer's transactional records in the range are aborted.
AbortedRange = tuple[int, int, int]


def encode_marker(
    producer_id: int,
    producer_epoch: int,
    commit: bool,
    timestamp_ms: int,
    transaction_epoch: int | None = None,
) -> bytes:
    """The control batch that commits or aborts a producer's open transaction; with
    `transaction_epoch` (< producer_epoch) a bumped marker, else one as before the bump."""
    key = _MARKER_KEY.pack(MARKER_VERSION, MARKER_COMMIT if commit else MARKER_ABORT)
    value = b""
    if transaction_epoch is not None:
        if not 0 <= transaction_epoch < producer_epoch:
            raise ValueError("a bumped marker's epoch is above its transaction's")
        value = _MARKER_VALUE.pack(MARKER_VALUE_VERSION, transaction_epoch)
    return encode_batch(
        [Record(key, value, (), timestamp_ms)],
        producer_id=producer_id,
        producer_epoch=producer_epoch,
        is_transactional=True,
        is_control=True,
    )


def marker_type(batch: bytes) -> int:
    """MARKER_COMMIT or MARKER_ABORT of a control batch; CorruptRecordError otherwise."""
    return read_marker(batch)[0]


def read_marker(batch: bytes) -> tuple[int, int | None]:
    """(MARKER_COMMIT or MARKER_ABORT, the epoch of the transaction a bumped marker ends,
    None for an unbumped one) of a control batch; CorruptRecordError if malformed."""
    records = decode_batch(batch).records
    key = records[0].key if len(records) == 1 else None
    if key is None or len(key) != _MARKER_KEY.size:
        raise CorruptRecordError("a control batch holds one marker record", field="batch")
    version, kind = _MARKER_KEY.unpack(key)
    if version != MARKER_VERSION or kind not in (MARKER_ABORT, MARKER_COMMIT):
        raise CorruptRecordError(f"unknown marker {version}/{kind}", field="batch")
    value = records[0].value or b""
    if not value:
        return int(kind), None
    if len(value) != _MARKER_VALUE.size:
        raise CorruptRecordError("a marker value is empty or 4 bytes", field="batch")
    value_version, transaction_epoch = _MARKER_VALUE.unpack(value)
    if value_version != MARKER_VALUE_VERSION or transaction_epoch < 0:
        raise CorruptRecordError(f"unknown marker value {value_version}", field="batch")
    return int(kind), int(transaction_epoch)


# What a produce command's apply may change in a TransactionStates, to put back if the disk
# refuses the command (save, restore_saved): a copy of the open transactions, the aborted
# list with its length then, the horizon and the kept list.
SavedTransactions = tuple[
    dict[int, tuple[int, int]], list[AbortedRange], int, int, list[AbortedRange]
]


class TransactionStates:
    """The open and aborted transactions of one partition (module docstring)."""

    def __init__(self) -> None:
        # producer_id -> (first offset, epoch) of its open transaction; the epoch is -1 for
        # one opened before epochs were kept (a state written before the epoch bump).
        self._open: dict[int, tuple[int, int]] = {}
        # Aborted ranges in marker order (so sorted by marker offset): replicated state.
        self._aborted: list[AbortedRange] = []
        # Ranges with a marker below it were trimmed from _aborted (replicated).
        self._horizon = 0
        # Trimmed ranges whose records this replica's log may still hold (local state,
        # sorted by marker; usually empty). See "Forgetting aborted ranges".
        self._kept: list[AbortedRange] = []

    @property
    def open_transactions(self) -> dict[int, int]:
        """producer_id -> first offset of its open transaction."""
        return {p: first for p, (first, _) in self._open.items()}

    def open_epoch(self, producer_id: int) -> int | None:
        """The epoch of the producer's open transaction (-1 if unknown), None if none."""
        entry = self._open.get(producer_id)
        return None if entry is None else entry[1]

    @property
    def aborted(self) -> list[AbortedRange]:
        """Every range a reader or compaction of this replica must honour: the replicated
        ones and the trimmed ones its log may still hold, sorted by marker."""
        if not self._kept:
            return list(self._aborted)
        return sorted(self._aborted + self._kept, key=lambda r: r[2])

    @property
    def replicated_aborted(self) -> list[AbortedRange]:
        """The replicated list alone (the same on every replica at a position)."""
        return list(self._aborted)

    @property
    def trim_horizon(self) -> int:
        return self._horizon

    def first_open_offset(self) -> int | None:
        return min(first for first, _ in self._open.values()) if self._open else None

    def last_stable_offset(self, high_watermark: int) -> int:
        first = self.first_open_offset()
        return high_watermark if first is None else min(first, high_watermark)

    def check_data(self, header: BatchHeader) -> None:
        """Before appending a transactional data batch (step 1): one of an epoch older than
        its producer's open transaction is refused. (The producer states refuse it too
        while they know the producer; this holds after they forgot it.) Changes nothing."""
        open_epoch = self.open_epoch(header.producer_id) if header.is_transactional else None
        if open_epoch is not None and header.producer_epoch < open_epoch:
            raise ProducerFencedError(
                f"producer {header.producer_id} epoch {header.producer_epoch} is fenced by "
                f"its open transaction of epoch {open_epoch}",
                field="producer_epoch",
            )

    def check_marker(self, header: BatchHeader, transaction_epoch: int | None) -> None:
        """Before appending a marker (step 2), its checks on the open transaction: a bumped
        marker must end an epoch below its own, and one whose epoch the producer's open
        transaction already has is a duplicate. Changes nothing."""
        if transaction_epoch is None:
            return
        if header.producer_epoch <= transaction_epoch:
            raise CorruptRecordError(
                f"a bumped marker's epoch {header.producer_epoch} is not above its "
                f"transaction's {transaction_epoch}",
                field="producer_epoch",
            )
        open_epoch = self.open_epoch(header.producer_id)
        if open_epoch is not None and open_epoch >= header.producer_epoch:
            raise DuplicateMarkerError(
                f"marker of producer {header.producer_id} epoch {header.producer_epoch}: its "
                f"transaction ended here before (the open one is of epoch {open_epoch})",
                field="producer_epoch",
            )

    def on_data(self, header: BatchHeader, base_offset: int) -> None:
        """After a data batch was appended at base_offset (step 1)."""
        if header.is_transactional and header.producer_id >= 0:
            self._open.setdefault(header.producer_id, (base_offset, header.producer_epoch))

    def on_marker(self, producer_id: int, kind: int, marker_offset: int) -> None:
        """After a marker was appended at marker_offset (step 2)."""
        entry = self._open.pop(producer_id, None)
        if entry is not None and kind == MARKER_ABORT:
            self._aborted.append((producer_id, entry[0], marker_offset))

    def save(self) -> SavedTransactions:
        """What applying a produce command may change here, for `restore_saved`: a copy of
        the open transactions (one entry per producer with one open) and the aborted list's
        length. Such an apply only adds to and pops from `_open`, appends to `_aborted`
        (on_marker) and replaces `_kept` with a new list (forget_local), so this is
        O(open transactions), not a copy of every aborted range (a partition may keep
        thousands until retention trims them)."""
        return (dict(self._open), self._aborted, len(self._aborted), self._horizon, self._kept)

    def restore_saved(self, saved: SavedTransactions) -> None:
        """Put back the state `save` returned `saved` in (the command's apply is undone)."""
        open_transactions, aborted, length, horizon, kept = saved
        del aborted[length:]
        self._open, self._aborted = open_transactions, aborted
        self._horizon, self._kept = horizon, kept

    def can_trim(self, clean_below: int) -> bool:
        """Whether a replicated range ends below `clean_below` (the offset below which
        this replica's log holds no aborted record): a trim would shorten the list."""
        return bool(self._aborted) and self._aborted[0][2] < clean_below

    def trim(self, horizon: int, clean_below: int) -> None:
        """Apply a TrimCommand(horizon) (replicated): ranges whose marker is below it
        leave the replicated list; those this replica's log may still hold (marker at or
        past `clean_below`, local) are kept locally."""
        if horizon <= self._horizon:
            return
        self._horizon = horizon
        i = bisect.bisect_left(self._aborted, horizon, key=lambda r: r[2])
        dropped, self._aborted = self._aborted[:i], self._aborted[i:]
        left = [r for r in dropped if r[2] >= clean_below]
        if left:
            self._kept = sorted(self._kept + left, key=lambda r: r[2])

    def forget_local(self, clean_below: int) -> None:
        """Locally kept ranges whose records this replica's retention or compaction
        removed (marker below `clean_below`) are no longer needed here."""
        if self._kept and self._kept[0][2] < clean_below:
            self._kept = [r for r in self._kept if r[2] >= clean_below]

    def keep_local(self, ranges: Iterable[AbortedRange]) -> None:
        """After a restore that kept local data: the ranges that data needs and the
        snapshot no longer lists (trimmed by a horizon this replica's log lags)."""
        have = set(self._aborted) | set(self._kept)
        extra = [(p, f, m) for p, f, m in ranges if (p, f, m) not in have]
        if extra:
            self._kept = sorted(self._kept + extra, key=lambda r: r[2])

    def aborted_between(self, start_offset: int, end_offset: int) -> list[AbortedRange]:
        """Aborted ranges (replicated and kept) overlapping [start_offset, end_offset)."""
        found: list[AbortedRange] = []
        for ranges in (self._aborted, self._kept):
            # Ranges end at their marker, in increasing order: skip those ending before start.
            i = bisect.bisect_left(ranges, start_offset, key=lambda r: r[2])
            found.extend(r for r in ranges[i:] if r[1] < end_offset)
        if self._kept:
            found.sort(key=lambda r: r[2])
        return found

    def to_doc(self) -> dict[str, Any]:
        """Canonical JSON form (sorted open producers); `horizon` and `kept` only when
        set, so a state that never trimmed is written as before."""
        doc: dict[str, Any] = {
            "open": [[p, o, e] for p, (o, e) in sorted(self._open.items())],
            "aborted": [list(r) for r in self._aborted],
        }
        if self._horizon:
            doc["horizon"] = self._horizon
        if self._kept:
            doc["kept"] = [list(r) for r in self._kept]
        return doc

    @classmethod
    def from_doc(cls, doc: dict[str, Any] | None) -> TransactionStates:
        """Inverse of to_doc; None (state written before transactions) is no transaction."""
        states = cls()
        if doc is None:
            return states
        try:
            # [producer, first offset] before the epoch bump: epoch unknown (-1).
            states._open = {
                int(e[0]): (int(e[1]), int(e[2]) if len(e) > 2 else -1) for e in doc["open"]
            }
            states._aborted = [(int(p), int(f), int(m)) for p, f, m in doc["aborted"]]
            states._horizon = int(doc.get("horizon", 0))
            states._kept = [(int(p), int(f), int(m)) for p, f, m in doc.get("kept", ())]
        except (TypeError, KeyError, ValueError, IndexError) as error:
            raise ValueError(f"malformed transaction state: {error}") from error
        return states


def visible_records(
    batches: Iterable[DecodedBatch],
    start_offset: int,
    end_offset: int,
    aborted: list[AbortedRange],
    max_records: int,
) -> tuple[list[Record], int]:
    """The records of `batches` in [start_offset, end_offset) a read_committed reader sees
    (no markers, no aborted transactional records), at most max_records; and the offset
    to read from next (past every batch looked at, so aborted stretches are skipped)."""
    by_producer: dict[int, list[tuple[int, int]]] = {}
    for producer_id, first, last in aborted:
        by_producer.setdefault(producer_id, []).append((first, last))
    out: list[Record] = []
    next_offset = start_offset
    for batch in batches:
        header = batch.header
        if header.base_offset >= end_offset:
            break
        ranges = by_producer.get(header.producer_id, ()) if header.is_transactional else ()
        aborted_batch = any(f <= header.base_offset <= m for f, m in ranges)
        for record in batch.records:
            if not start_offset <= record.offset < end_offset:
                continue
            if header.is_control or aborted_batch:
                next_offset = record.offset + 1
                continue
            if len(out) >= max_records:
                return out, next_offset
            out.append(record)
            next_offset = record.offset + 1
        next_offset = max(next_offset, min(header.next_offset, end_offset))
    return out, next_offset
