"""A filtered read: the records of a partition's log that a fetch filter keeps.

Runs on the partition's storage thread under the replica's lock (like every read), on
decoded, CRC-checked batches, before anything is encoded for the wire: a record the
filter drops costs its decode and one call of the filter, never its JSON or base64.

It reads forward from `start_offset` batch by batch and stops at the first of:
`max_records` or `max_bytes` of kept records, the high watermark (or `end_offset`, the
last stable offset of a read_committed fetch, if lower), or `scan_bytes_max`
bytes of batches read (the cost bound of one fetch: a long run of records that do not
match is read in slices, never in one go). `next_offset` is where the scan stopped, so a
consumer that resumes there never reads the skipped records again.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from log.partition_log import PartitionLog
from log.records import Record

# Bytes read from the log per step of a filtered scan: one step decodes about this much.
SCAN_STEP_BYTES = 256 * 1024


@dataclass(frozen=True, slots=True)
class FilteredRead:
    records: list[Record]
    next_offset: int  # the first offset not scanned
    high_watermark: int
    log_start_offset: int
    scanned_bytes: int


def read_matching(
    log: PartitionLog,
    start_offset: int,
    matches: Callable[[Record], bool],
    *,
    max_bytes: int,
    max_records: int,
    scan_bytes_max: int,
    end_offset: int | None = None,
    aborted: Sequence[tuple[int, int, int]] = (),
) -> FilteredRead:
    """Kept records from start_offset (module docstring); the caller holds the lock.
    `aborted`: (producer_id, first_offset, marker_offset) of aborted transactions, whose
    transactional batches are skipped as markers are (dmq/partition/transactions.py)."""
    kept: list[Record] = []
    kept_bytes = 0
    scanned = 0
    offset = start_offset
    end = log.high_watermark if end_offset is None else min(end_offset, log.high_watermark)
    by_producer: dict[int, list[tuple[int, int]]] = {}
    for producer_id, first, last in aborted:
        by_producer.setdefault(producer_id, []).append((first, last))
    while offset < end and scanned < scan_bytes_max:
        step = min(SCAN_STEP_BYTES, scan_bytes_max - scanned)
        batches = list(log.read_batches(offset, step, end_offset=end))
        if not batches:
            with log.read(offset, step) as raw:  # only a gap lies ahead: skip it
                if raw.next_offset <= offset:
                    break
                offset = raw.next_offset
            continue
        for batch in batches:
            header = batch.header
            scanned += header.size_bytes
            ranges = by_producer.get(header.producer_id, ()) if header.is_transactional else ()
            if not header.is_control and not any(f <= header.base_offset <= m for f, m in ranges):
                for record in batch.records:
                    if record.offset < offset or record.offset >= end:
                        continue
                    if not matches(record):
                        continue
                    size = _record_bytes(record)
                    if kept and kept_bytes + size > max_bytes:
                        return _done(log, kept, record.offset, scanned)
                    kept.append(record)
                    kept_bytes += size
                    if len(kept) >= max_records:
                        return _done(log, kept, record.offset + 1, scanned)
            offset = max(offset, header.base_offset + header.last_offset_delta + 1)
    return _done(log, kept, offset, scanned)


def _done(log: PartitionLog, kept: list[Record], next_offset: int, scanned: int) -> FilteredRead:
    return FilteredRead(kept, next_offset, log.high_watermark, log.log_start_offset, scanned)


def _record_bytes(record: Record) -> int:
    size = len(record.key or b"") + len(record.value or b"")
    return size + sum(len(h.key) + len(h.value or b"") for h in record.headers)
