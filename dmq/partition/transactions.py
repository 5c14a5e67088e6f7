"""Transactions in one partition: open transactions, the last stable offset, the aborted
ones, and the control records (markers) that close them.

A transactional producer's batches carry the transactional attribute (log/records.py's
bit 4) and its producer id and epoch. The transaction coordinator (the metadata group,
dmq/metadata/transactions.py) decides, durably, then writes one **marker** to each
partition the transaction touched: a control batch (attributes bits 4 and 5) of one
record whose key is `MARKER_KEY` (version 0, type 0 abort / 1 commit, as Kafka's), with
the producer id and the epoch the coordinator chose. Applied in log order on every replica:

1. a transactional data batch of a producer with no open transaction here opens one at
   its base offset;
2. a marker with an epoch older than the producer's known epoch is refused
   (`ProducerFencedError`); otherwise it closes the producer's open transaction (if any):
   an abort adds `(producer_id, first_offset, marker_offset)` to the aborted list; and the
   producer's epoch becomes the marker's (a coordinator abort carries epoch + 1, which
   fences the old producer's late batches). A marker without an open transaction is a
   coordinator's retry: written, harmless;
3. the **last stable offset** (LSO) is the first offset of the oldest open transaction, or
   the high watermark when none is open: a `read_committed` reader never reads at or past
   it, and filters out the records of aborted transactions (same producer id, inside an
   aborted range, in a transactional batch). Markers are never served as records.

The state is replicated state, kept and stored exactly as the producer states are
(dmq/partition/producers.py): applied in log order, saved with the applied checkpoint
(`raft-producers`) and in the partition's snapshots, replayed from the journal after it.
An aborted range is forgotten once the log start offset passes its marker (retention):
no record of it can be read any more.

Not thread-safe: the tick thread applies, readers hold the replica's lock.
"""

from __future__ import annotations

import bisect
import struct
from collections.abc import Iterable
from typing import Any, Final, Literal

from log.errors import CorruptRecordError
from log.records import BatchHeader, DecodedBatch, Record, decode_batch, encode_batch

MARKER_ABORT: Final = 0
MARKER_COMMIT: Final = 1
_MARKER_KEY = struct.Struct(">hh")  # version, type (Kafka's ControlRecordType key)
MARKER_VERSION: Final = 0

Isolation = Literal["read_uncommitted", "read_committed"]
ISOLATIONS: Final = ("read_uncommitted", "read_committed")
# (producer_id, first_offset, marker_offset): the offsets [first, marker] of one aborted
# transaction; only that producer's transactional records in the range are aborted.
AbortedRange = tuple[int, int, int]


def encode_marker(producer_id: int, producer_epoch: int, commit: bool, timestamp_ms: int) -> bytes:
    """The control batch that commits or aborts a producer's open transaction."""
    key = _MARKER_KEY.pack(MARKER_VERSION, MARKER_COMMIT if commit else MARKER_ABORT)
    return encode_batch(
        [Record(key, b"", (), timestamp_ms)],
        producer_id=producer_id,
        producer_epoch=producer_epoch,
        is_transactional=True,
        is_control=True,
    )


def marker_type(batch: bytes) -> int:
    """MARKER_COMMIT or MARKER_ABORT of a control batch; CorruptRecordError otherwise."""
    records = decode_batch(batch).records
    key = records[0].key if len(records) == 1 else None
    if key is None or len(key) != _MARKER_KEY.size:
        raise CorruptRecordError("a control batch holds one marker record", field="batch")
    version, kind = _MARKER_KEY.unpack(key)
    if version != MARKER_VERSION or kind not in (MARKER_ABORT, MARKER_COMMIT):
        raise CorruptRecordError(f"unknown marker {version}/{kind}", field="batch")
    return int(kind)


class TransactionStates:
    """The open and aborted transactions of one partition (module docstring)."""

    def __init__(self) -> None:
        self._open: dict[int, int] = {}  # producer_id -> first offset of its open transaction
        # Aborted ranges in marker order (so sorted by marker offset).
        self._aborted: list[AbortedRange] = []

    @property
    def open_transactions(self) -> dict[int, int]:
        return dict(self._open)

    @property
    def aborted(self) -> list[AbortedRange]:
        return list(self._aborted)

    def first_open_offset(self) -> int | None:
        return min(self._open.values()) if self._open else None

    def last_stable_offset(self, high_watermark: int) -> int:
        first = self.first_open_offset()
        return high_watermark if first is None else min(first, high_watermark)

    def on_data(self, header: BatchHeader, base_offset: int) -> None:
        """After a data batch was appended at base_offset (step 1)."""
        if header.is_transactional and header.producer_id >= 0:
            self._open.setdefault(header.producer_id, base_offset)

    def on_marker(self, producer_id: int, kind: int, marker_offset: int) -> None:
        """After a marker was appended at marker_offset (step 2)."""
        first = self._open.pop(producer_id, None)
        if first is not None and kind == MARKER_ABORT:
            self._aborted.append((producer_id, first, marker_offset))

    def forget_before(self, log_start_offset: int) -> None:
        """Aborted ranges that retention removed entirely are no longer needed."""
        drop = 0
        while drop < len(self._aborted) and self._aborted[drop][2] < log_start_offset:
            drop += 1
        if drop:
            del self._aborted[:drop]

    def aborted_between(self, start_offset: int, end_offset: int) -> list[AbortedRange]:
        """Aborted ranges overlapping [start_offset, end_offset)."""
        # Ranges end at their marker, in increasing order: skip those ending before start.
        i = bisect.bisect_left(self._aborted, start_offset, key=lambda r: r[2])
        return [r for r in self._aborted[i:] if r[1] < end_offset]

    def to_doc(self) -> dict[str, Any]:
        """Canonical JSON form (sorted open producers)."""
        return {
            "open": [[p, o] for p, o in sorted(self._open.items())],
            "aborted": [list(r) for r in self._aborted],
        }

    @classmethod
    def from_doc(cls, doc: dict[str, Any] | None) -> TransactionStates:
        """Inverse of to_doc; None (state written before transactions) is no transaction."""
        states = cls()
        if doc is None:
            return states
        try:
            states._open = {int(p): int(o) for p, o in doc["open"]}
            states._aborted = [(int(p), int(f), int(m)) for p, f, m in doc["aborted"]]
        except (TypeError, KeyError, ValueError) as error:
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
