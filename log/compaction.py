"""Log compaction (cleanup_policy=compact): keep the last record per key.

Compaction runs in three steps so that appends are never blocked by it:

1. `plan_compaction(log)` (owner thread, cheap): pick the closed segments that lie
   entirely below the high watermark and note each one's file identity.
2. `build_compaction(plan, now_ms)` (any thread, slow): read those files through
   descriptors of its own, map every key to its last offset, and write a cleaned
   copy of each segment next to it (`<base>.log.cleaned`). Closed segments are
   immutable, so this reads a stable snapshot while the owner keeps appending to
   the active segment.
3. `install_compaction(log, result)` (owner thread, cheap): if every planned segment
   is still there unchanged, swap each cleaned file in (index files are removed first
   and rebuilt after, so a crash at any point leaves either the old or the new `.log`
   with no stale index); otherwise discard the result.

What is kept: for each key, the record with the highest offset among the planned
segments; tombstones (null value) only while younger than delete_retention_ms;
records with a null key, and control batches, untouched. Offsets never change (gaps
appear); a batch whose records all survive is copied byte for byte; a batch that
loses records is re-encoded with the same base offset, last offset delta (its last
offset stays, even when its last records go, as in Kafka's v2 batches), codec and
producer fields; a batch that loses all of them disappears, and so does a segment left
empty. Those whole-batch gaps never reach the log end offset: the active segment is
never compacted.
Compaction does not merge small segments (a later improvement).

Transactions (the caller passes what the partition knows: log/README.md, "Compaction
and transactions"): only segments below the **stable offset** (the LSO, the first offset
of the oldest open transaction) are compacted, so an open transaction's records are
never removed and never make an older record of the same key go. The records of an
**aborted** transaction (a transactional batch of producer p inside an aborted range
(p, first, marker)) take no part in the last-offset map and are removed. A **control
batch** (a transaction marker) is kept while any record of its transaction is left, and
then until its timestamp is older than delete_retention_ms.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Sequence
from dataclasses import dataclass, field

from log import records as fmt
from log.errors import StorageWriteError
from log.partition_log import PartitionLog
from log.segment import CLEANED_SUFFIX, NO_SPACE_ERRNOS, Segment, fsync_directory


@dataclass(frozen=True, slots=True)
class PlannedSegment:
    base_offset: int
    path: str
    size_bytes: int
    inode: int


# (producer_id, first_offset, marker_offset) of one aborted transaction: that producer's
# transactional batches with a base offset in [first, marker] hold its records.
AbortedRange = tuple[int, int, int]


@dataclass(frozen=True, slots=True)
class CompactionPlan:
    directory: str
    segments: tuple[PlannedSegment, ...]
    delete_retention_ms: int
    aborted: tuple[AbortedRange, ...] = ()  # the ranges that reach the planned segments


@dataclass(slots=True)
class CompactionResult:
    plan: CompactionPlan
    cleaned_paths: dict[int, str] = field(default_factory=dict)  # base offset -> .cleaned
    records_before: int = 0
    records_after: int = 0
    bytes_before: int = 0
    bytes_after: int = 0


def plan_compaction(
    log: PartitionLog,
    *,
    stable_offset: int | None = None,
    aborted: Sequence[AbortedRange] = (),
) -> CompactionPlan | None:
    """The closed segments entirely below the high watermark and `stable_offset` (the
    partition's LSO; None: no transaction is open), and the `aborted` ranges that reach
    them (the partition's aborted transactions)."""
    end = log.high_watermark if stable_offset is None else min(stable_offset, log.high_watermark)
    planned: list[PlannedSegment] = []
    for s in log.segments[:-1]:
        if not s.closed or s.next_offset > end:
            break  # a prefix: a later segment above the end would leave a hole in the map
        if not s.is_empty:
            planned.append(
                PlannedSegment(s.base_offset, str(s.log_path), s.size_bytes, os.fstat(s.fd).st_ino)
            )
    if not planned:
        return None
    first = planned[0].base_offset
    reaching = tuple(sorted(r for r in aborted if r[2] >= first and r[1] < end))
    return CompactionPlan(
        str(log.directory), tuple(planned), log.config.delete_retention_ms, reaching
    )


def _aborted_batch(header: fmt.BatchHeader, ranges: dict[int, list[tuple[int, int]]]) -> bool:
    """A data batch of an aborted transaction."""
    if header.is_control or not header.is_transactional:
        return False
    return any(f <= header.base_offset <= m for f, m in ranges.get(header.producer_id, ()))


def _batches(path: str, size_bytes: int) -> list[tuple[fmt.BatchHeader, bytes]]:
    with open(path, "rb") as f:
        data = f.read(size_bytes)
    return [(header, data[pos : pos + header.size_bytes]) for pos, header in fmt.iter_batches(data)]


def build_compaction(plan: CompactionPlan, now_ms: int) -> CompactionResult:
    result = CompactionResult(plan)
    ranges: dict[int, list[tuple[int, int]]] = {}
    for producer_id, first, marker in plan.aborted:
        ranges.setdefault(producer_id, []).append((first, marker))
    last_offset_of_key: dict[bytes, int] = {}
    for seg in plan.segments:
        for header, raw in _batches(seg.path, seg.size_bytes):
            if header.is_control or _aborted_batch(header, ranges):
                continue
            for record in fmt.decode_batch(raw).records:
                if record.key is not None:
                    last_offset_of_key[record.key] = record.offset
    tombstone_horizon_ms = now_ms - plan.delete_retention_ms
    # Producer id -> whether a record of its current transaction (since its last marker,
    # in log order) survives: its next marker is kept while one does.
    txn_alive: dict[int, bool] = {}
    for seg in plan.segments:
        out = bytearray()
        for header, raw in _batches(seg.path, seg.size_bytes):
            result.bytes_before += len(raw)
            if header.is_control:
                alive = txn_alive.pop(header.producer_id, False)
                if alive or header.max_timestamp_ms > tombstone_horizon_ms:
                    out += raw
                continue
            decoded = fmt.decode_batch(raw)
            if _aborted_batch(header, ranges):
                result.records_before += len(decoded.records)
                continue  # an aborted transaction's records: removed whole
            kept = [
                r
                for r in decoded.records
                if r.key is None
                or (
                    last_offset_of_key[r.key] == r.offset
                    and (r.value is not None or r.timestamp_ms > tombstone_horizon_ms)
                )
            ]
            result.records_before += len(decoded.records)
            result.records_after += len(kept)
            if kept and header.is_transactional:
                txn_alive[header.producer_id] = True
            if len(kept) == len(decoded.records):
                out += raw
            elif kept:
                out += fmt.encode_batch(
                    kept,
                    base_offset=header.base_offset,
                    codec=header.codec,
                    timestamp_type=header.timestamp_type,
                    producer_id=header.producer_id,
                    producer_epoch=header.producer_epoch,
                    base_sequence=header.base_sequence,
                    is_transactional=header.is_transactional,
                    offset_deltas=[r.offset - header.base_offset for r in kept],
                    # The batch keeps its end: a log's end offset and every batch's last
                    # offset survive compaction, so a replica copying [a, b) from a
                    # compacted log still ends at b (log/README.md, invariant 12).
                    last_offset_delta=header.last_offset_delta,
                )
        cleaned = seg.path + CLEANED_SUFFIX
        try:
            with open(cleaned, "wb") as f:
                f.write(out)
                f.flush()
                os.fsync(f.fileno())
        except OSError as exc:
            # A full disk: take back every cleaned file of this build (they would hold
            # the space until the next open) and let the next pass try again.
            for path in [*result.cleaned_paths.values(), cleaned]:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(path)
            raise StorageWriteError(
                f"compaction of {seg.path} put off: {exc}", no_space=exc.errno in NO_SPACE_ERRNOS
            ) from exc
        result.bytes_after += len(out)
        result.cleaned_paths[seg.base_offset] = cleaned
    return result


def install_compaction(log: PartitionLog, result: CompactionResult) -> bool:
    """Swap the cleaned segments in if nothing changed under the build. Returns whether
    it did; a stale result's files are removed either way."""
    current = {s.base_offset: s for s in log.segments[:-1]}
    stale = any(
        p.base_offset not in current
        or current[p.base_offset].size_bytes != p.size_bytes
        or os.fstat(current[p.base_offset].fd).st_ino != p.inode
        for p in result.plan.segments
    )
    if stale:
        for path in result.cleaned_paths.values():
            os.unlink(path)
        return False
    for planned in result.plan.segments:
        old = current[planned.base_offset]
        old.index_path.unlink(missing_ok=True)
        old.timeindex_path.unlink(missing_ok=True)
        os.replace(result.cleaned_paths[planned.base_offset], old.log_path)
        old.close_files()
        replacement = Segment(log.directory, planned.base_offset, log.config.index_interval_bytes)
        position = log.segments.index(old)
        if os.fstat(replacement.fd).st_size == 0:
            replacement.delete()
            log.segments.pop(position)
        else:
            replacement.load_closed()
            log.segments[position] = replacement
    fsync_directory(log.directory)
    return True


def compact(log: PartitionLog, now_ms: int) -> CompactionResult | None:
    """All three steps on the calling thread (tests, tools, small logs)."""
    plan = plan_compaction(log)
    if plan is None:
        return None
    result = build_compaction(plan, now_ms)
    install_compaction(log, result)
    return result
