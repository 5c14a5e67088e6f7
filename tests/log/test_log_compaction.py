"""Proves the compaction invariant of log/README.md (invariants 12 and 13), with hypothesis:

- after compaction of any log (batches of one to four records over a few keys, null keys,
  tombstones old and young, segments of any size), every batch that survives keeps its
  base offset and its original last offset, even when its last records were removed; the
  log end offset is unchanged; and a read from every offset in [0, log end] returns
  exactly the records a plain model keeps (per key, the last record among the compacted
  segments, tombstones only while young; everything in the active segment), in offset
  order. The same holds after the log is reopened from its files;
- a thinned batch decodes with a last offset past its last record, and a produced batch
  (validate_batch) must still end at its last record;
- `read_for_copy` over the compacted log, followed chunk by chunk from any start, gives
  the original batches that survive and vouches for exactly the range asked, never past
  the high watermark.
"""

from __future__ import annotations

import itertools
import tempfile
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from log import FlushPolicy, LogConfig, PartitionLog, Record, compaction, encode_batch
from log.config import CleanupPolicy
from log.errors import CorruptRecordError
from log.records import decode_batch, iter_batches, validate_batch

DELETE_RETENTION_MS = 1_000
NOW_MS = 10_000

# A record: key index (None: null key), value (None: tombstone), timestamp.
Spec = tuple[int | None, bytes | None, int]

records_st = st.tuples(
    st.one_of(st.none(), st.integers(0, 3)),
    st.one_of(st.none(), st.binary(max_size=20)),
    st.sampled_from([NOW_MS - 5 * DELETE_RETENTION_MS, NOW_MS]),  # old or young
)
batches_st = st.lists(st.lists(records_st, min_size=1, max_size=4), min_size=1, max_size=30)


def config(segment_bytes: int) -> LogConfig:
    return LogConfig(
        segment_bytes=segment_bytes,
        cleanup_policy=CleanupPolicy.COMPACT,
        delete_retention_ms=DELETE_RETENTION_MS,
        flush=FlushPolicy(interval_records=None),
    )


def to_record(spec: Spec) -> Record:
    key, value, ts = spec
    return Record(key=None if key is None else b"k%d" % key, value=value, timestamp_ms=ts)


def expected_survivors(
    batches: list[list[Spec]], closed_end: int
) -> list[tuple[int, bytes | None, bytes | None]]:
    """The model: offsets below closed_end are compacted (keep each key's last record
    there, a tombstone only if young); the active segment's are untouched."""
    flat = [(offset, to_record(s)) for offset, s in enumerate(s for b in batches for s in b)]
    last: dict[bytes, int] = {}
    for offset, r in flat:
        if offset < closed_end and r.key is not None:
            last[r.key] = offset
    horizon = NOW_MS - DELETE_RETENTION_MS
    return [
        (offset, r.key, r.value)
        for offset, r in flat
        if offset >= closed_end
        or r.key is None
        or (last[r.key] == offset and (r.value is not None or r.timestamp_ms > horizon))
    ]


def read_all(log: PartitionLog, start: int) -> list[tuple[int, bytes | None, bytes | None]]:
    return [(r.offset, r.key, r.value) for r in log.read_records(start, 1 << 30)]


def batch_ends(log: PartitionLog) -> dict[int, int]:
    """base_offset -> last_offset of every stored batch."""
    ends: dict[int, int] = {}
    for batch in log.read_batches(log.log_start_offset, 1 << 30):
        ends[batch.header.base_offset] = batch.header.last_offset
    return ends


def filled_log(directory: Path, batches: list[list[Spec]], segment_bytes: int) -> PartitionLog:
    """A log holding `batches` (one produce batch each), all committed."""
    log = PartitionLog.open(directory, config(segment_bytes))
    for specs in batches:
        log.append(encode_batch([to_record(s) for s in specs]))
    log.set_high_watermark(log.log_end_offset)
    return log


@settings(max_examples=150, deadline=None)
@given(batches_st, st.sampled_from([64, 200, 1024]))
def test_compaction_keeps_every_end_and_the_model_survivors(
    batches: list[list[Spec]], segment_bytes: int
) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        log = filled_log(Path(tmp), batches, segment_bytes)
        ends_before = batch_ends(log)
        end_before = log.log_end_offset
        closed_end = log.segments[-1].base_offset  # every closed segment is below the HW
        compaction.compact(log, NOW_MS)
        expected = expected_survivors(batches, closed_end)
        for reopened in (False, True):
            if reopened:
                log.close()
                log = PartitionLog.open(Path(tmp), config(segment_bytes))
                log.set_high_watermark(log.log_end_offset)
            assert log.log_end_offset == end_before
            ends_after = batch_ends(log)
            assert all(ends_before[base] == last for base, last in ends_after.items())
            for start in range(end_before + 1):
                assert read_all(log, start) == [r for r in expected if r[0] >= start]
        log.close()


@settings(max_examples=100, deadline=None)
@given(batches_st, st.sampled_from([64, 1024]), st.data())
def test_read_for_copy_vouches_for_exactly_the_range_asked(
    batches: list[list[Spec]], segment_bytes: int, data: st.DataObject
) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        log = filled_log(Path(tmp), batches, segment_bytes)
        compaction.compact(log, NOW_MS)
        # Batch boundaries: where a copy starts, a snapshot ends, a high watermark stands.
        bounds = sorted(set(itertools.accumulate((len(b) for b in batches), initial=0)))
        high_watermark = data.draw(st.sampled_from(bounds), label="high_watermark")
        start = data.draw(st.sampled_from([b for b in bounds if b <= high_watermark]))
        end = data.draw(st.sampled_from([b for b in bounds if b >= start]), label="end")
        max_bytes = data.draw(st.sampled_from([1, 100, 1 << 20]), label="max_bytes")
        log.set_high_watermark(high_watermark)
        cap = min(end, high_watermark)
        copied: list[bytes] = []
        offset = start
        while offset < end:
            chunk, covered = log.read_for_copy(offset, end, max_bytes)
            assert offset <= covered <= cap
            copied += [chunk[p : p + h.size_bytes] for p, h in iter_batches(chunk)]
            if covered == offset:  # nothing more vouched for: only at the high watermark
                assert not chunk and offset == high_watermark
                break
            offset = covered
        assert offset == cap  # vouched for the whole range, never past the HW
        with log.read(start, 1 << 30, end_offset=cap) as raw:
            assert b"".join(copied) == raw.read_bytes()
        log.close()


def test_a_thinned_batch_keeps_its_end_but_a_producer_may_not_send_one() -> None:
    records = [Record(b"a", b"1", timestamp_ms=1), Record(b"b", b"2", timestamp_ms=1)]
    thinned = encode_batch(records[:1], base_offset=10, offset_deltas=[0], last_offset_delta=3)
    decoded = decode_batch(thinned)
    assert decoded.header.last_offset == 13 and [r.offset for r in decoded.records] == [10]
    with pytest.raises(CorruptRecordError, match="dense offset deltas"):
        validate_batch(thinned)
    with pytest.raises(Exception, match="below the last record"):
        encode_batch(records, offset_deltas=[0, 2], last_offset_delta=1)
