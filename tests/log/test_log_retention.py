"""Proves retention, compaction, time-based rolls and the flush policy, with a fake clock
(every `now_ms` and `clock_ms` here is given explicitly).

- Retention by age and by size deletes whole closed segments, oldest first, and moves
  log_start_offset to the next segment (reads below it raise OffsetOutOfRangeError); it
  never deletes a segment that reaches the high watermark; an active segment that is all
  expired and all below the high watermark is rolled and then deleted; cleanup_policy=compact
  turns deletion off. The boundaries are exact: "older than retention_ms" is strict, and a
  segment goes by size only if what remains is still at least retention_bytes.
- Compaction, checked against a model on arbitrary logs: every record of the closed segments
  below the high watermark survives iff its key is null or it is its key's last record there
  (a tombstone only while younger than delete_retention_ms); offsets never change; a batch
  that keeps all its records is copied byte for byte, one that loses some is re-encoded with
  the same base offset, codec and producer fields; the rest of the log is untouched.
- Compaction emptying the first segment does not move log_start_offset, even after reopen.
- The build step runs on another thread while the owner appends (and rolls), then installs;
  a plan gone stale (retention deleted one of its segments) installs nothing and leaves no
  .cleaned file.
- A segment rolls when the incoming batch's max timestamp is more than segment_ms newer than
  the active segment's first batch.
- FlushPolicy(interval_records=N) flushes once N records are unflushed; interval_ms flushes
  when the injected clock says so.
"""

from __future__ import annotations

import shutil
import tempfile
import threading
from dataclasses import replace
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from log import (
    CleanupPolicy,
    Codec,
    CompactionResult,
    FlushPolicy,
    LogConfig,
    OffsetOutOfRangeError,
    PartitionLog,
    Record,
    build_compaction,
    compact,
    decode_batch,
    encode_batch,
    install_compaction,
    iter_batches,
    plan_compaction,
)
from log.records import with_base_offset
from log.segment import CLEANED_SUFFIX

HUGE = 2**31
NO_FLUSH = FlushPolicy(interval_records=None)


def _batch(i: int, ts: int) -> bytes:
    """A one-record batch whose size does not depend on i (for exact size arithmetic)."""
    return encode_batch([Record(b"key-%04d" % i, b"value-%04d" % i, timestamp_ms=ts)])


BATCH_BYTES = len(_batch(0, 0))


def _log_of_ten(directory: Path, **config: object) -> PartitionLog:
    """Batches 0..9 with timestamps 1000*i, three per segment: [0-2] [3-5] [6-8] [9]."""
    fields: dict[str, object] = {"segment_bytes": 3 * BATCH_BYTES, "flush": NO_FLUSH}
    log = PartitionLog.open(directory, LogConfig(**(fields | config)))  # type: ignore[arg-type]
    for i in range(10):
        log.append(_batch(i, 1_000 * i))
    assert [s.base_offset for s in log.segments] == [0, 3, 6, 9]
    log.set_high_watermark(log.log_end_offset)
    return log


def _offsets(log: PartitionLog) -> list[int]:
    return [r.offset for r in log.read_records(log.log_start_offset, HUGE)]


# --------------------------------------------------------------------------- retention


def test_retention_by_age_deletes_expired_closed_segments_oldest_first(tmp_path: Path) -> None:
    log = _log_of_ten(tmp_path, retention_ms=1_000)
    # Segment [0-2]'s newest record is at 2000: it expires only once it is *older* than 1000 ms.
    assert log.maybe_delete_segments(now_ms=3_000) == 0
    assert log.maybe_delete_segments(now_ms=3_001) == 1
    assert log.log_start_offset == 3
    assert not (tmp_path / f"{0:020d}.log").exists()
    assert not (tmp_path / f"{0:020d}.index").exists()
    assert _offsets(log) == list(range(3, 10))
    with pytest.raises(OffsetOutOfRangeError):
        log.read_records(2, HUGE)
    with pytest.raises(OffsetOutOfRangeError):
        log.read(0, HUGE)

    assert log.maybe_delete_segments(now_ms=9_001) == 2  # [3-5] at 5000, [6-8] at 8000
    assert log.log_start_offset == 9
    log.close()
    log = PartitionLog.open(tmp_path, log.config)
    assert log.log_start_offset == 9
    log.set_high_watermark(log.log_end_offset)
    assert _offsets(log) == [9]
    log.close()


def test_retention_never_deletes_a_segment_that_reaches_the_high_watermark(
    tmp_path: Path,
) -> None:
    log = _log_of_ten(tmp_path, retention_ms=1_000)
    log.set_high_watermark(4)  # inside segment [3-5]
    assert log.maybe_delete_segments(now_ms=10**9) == 1
    assert [s.base_offset for s in log.segments] == [3, 6, 9]
    assert log.high_watermark == 4

    log.set_high_watermark(9)  # the active segment [9] is not below it: it stays active
    assert log.maybe_delete_segments(now_ms=10**9) == 2
    assert [s.base_offset for s in log.segments] == [9]
    assert log.log_end_offset == 10 and log.log_start_offset == 9

    # All expired and all committed: the active segment is rolled, then deleted.
    log.set_high_watermark(10)
    assert log.maybe_delete_segments(now_ms=10**9) == 1
    assert [(s.base_offset, s.is_empty) for s in log.segments] == [(10, True)]
    assert (log.log_start_offset, log.high_watermark, log.log_end_offset) == (10, 10, 10)
    assert log.read_records(10, HUGE) == []
    assert log.append(_batch(10, 11_000)).base_offset == 10
    log.close()


@pytest.mark.parametrize(
    ("retention_bytes", "deleted"),
    [
        (4 * BATCH_BYTES + 1, 1),  # after [0-2] goes 7 batches remain; [3-5] would leave 4
        (4 * BATCH_BYTES, 2),  # ... and 4 batches is still enough to keep
        (0, 3),  # the active segment always stays
    ],
)
def test_retention_by_size_keeps_at_least_retention_bytes(
    tmp_path: Path, retention_bytes: int, deleted: int
) -> None:
    log = _log_of_ten(tmp_path, retention_ms=None, retention_bytes=retention_bytes)
    assert log.size_bytes == 10 * BATCH_BYTES
    assert log.maybe_delete_segments(now_ms=0) == deleted
    assert log.log_start_offset == 3 * deleted
    assert _offsets(log) == list(range(3 * deleted, 10))
    log.close()


@pytest.mark.parametrize(
    ("policy", "deleted", "log_start_offset"),
    [(CleanupPolicy.COMPACT, 0, 0), (CleanupPolicy.COMPACT_DELETE, 4, 10)],
)
def test_only_a_delete_policy_deletes(
    tmp_path: Path, policy: CleanupPolicy, deleted: int, log_start_offset: int
) -> None:
    log = _log_of_ten(tmp_path, retention_ms=0, retention_bytes=0, cleanup_policy=policy)
    assert log.maybe_delete_segments(now_ms=10**9) == deleted
    assert log.log_start_offset == log_start_offset
    assert _offsets(log) == list(range(log_start_offset, 10))
    log.close()


def test_a_read_in_flight_survives_retention_deleting_its_segment(tmp_path: Path) -> None:
    log = _log_of_ten(tmp_path, retention_ms=None, retention_bytes=0)
    stored = b"".join(with_base_offset(_batch(i, 1_000 * i), i) for i in range(10))
    with log.read(0, HUGE) as in_flight:
        assert log.maybe_delete_segments(now_ms=0) == 3
        assert not (tmp_path / f"{0:020d}.log").exists()
        assert in_flight.read_bytes() == stored  # through descriptors of its own
    log.close()


# --------------------------------------------------------------------------- compaction

DELETE_RETENTION_MS = 1_000
COMPACT_CONFIG = LogConfig(
    segment_bytes=200,
    cleanup_policy=CleanupPolicy.COMPACT,
    delete_retention_ms=DELETE_RETENTION_MS,
    flush=NO_FLUSH,
)

keyed_records = st.lists(
    st.builds(
        Record,
        key=st.one_of(st.none(), st.sampled_from([b"a", b"b", b"c", b"d", b""])),
        value=st.one_of(st.none(), st.binary(max_size=6)),
        timestamp_ms=st.integers(0, 3_000),
    ),
    min_size=1,
    max_size=4,
)


def _raw_batches(log: PartitionLog) -> dict[int, bytes]:
    """Every stored batch by base offset, read from the files (whatever the high watermark)."""
    out = {}
    for segment in log.segments:
        data = segment.log_path.read_bytes()
        for pos, header in iter_batches(data):
            out[header.base_offset] = data[pos : pos + header.size_bytes]
    return out


def _expected_after_compaction(
    records: list[Record], planned_end: int, now_ms: int
) -> list[Record]:
    planned = [r for r in records if r.offset < planned_end]
    last_of_key = {r.key: r.offset for r in planned if r.key is not None}
    kept = [
        r
        for r in planned
        if r.key is None
        or (
            last_of_key[r.key] == r.offset
            and (r.value is not None or r.timestamp_ms > now_ms - DELETE_RETENTION_MS)
        )
    ]
    return kept + [r for r in records if r.offset >= planned_end]


@settings(
    max_examples=80,
    deadline=None,
    # Every example makes a fresh directory of its own under tmp_path.
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(
    batches=st.lists(
        st.tuples(
            keyed_records,
            st.sampled_from(Codec),
            st.integers(-1, 5),
            st.one_of(st.none(), st.integers(0, 3_000)),  # log-append time
        ),
        min_size=3,
        max_size=20,
    ),
    data=st.data(),
)
def test_compaction_keeps_the_last_record_per_key_with_its_offset(
    tmp_path: Path,
    batches: list[tuple[list[Record], Codec, int, int | None]],
    data: st.DataObject,
) -> None:
    directory = Path(tempfile.mkdtemp(dir=tmp_path))
    log = PartitionLog.open(directory, COMPACT_CONFIG)
    records: list[Record] = []
    for batch_records, codec, producer_id, append_time_ms in batches:
        batch = encode_batch(batch_records, codec=codec, producer_id=producer_id, base_sequence=9)
        base = log.append(batch, log_append_time_ms=append_time_ms).base_offset
        records += [
            replace(r, offset=base + i, timestamp_ms=append_time_ms)
            if append_time_ms is not None
            else replace(r, offset=base + i)
            for i, r in enumerate(batch_records)
        ]
    before = _raw_batches(log)
    end = log.log_end_offset
    hw = data.draw(st.one_of(st.just(end), st.integers(0, end)), label="high_watermark")
    log.set_high_watermark(hw)
    now_ms = data.draw(st.integers(0, 4_500), label="now_ms")
    planned = [s for s in log.segments[:-1] if s.next_offset <= hw]
    planned_end = planned[-1].next_offset if planned else 0
    expected = _expected_after_compaction(records, planned_end, now_ms)

    result = compact(log, now_ms)

    assert (result is None) == (not planned)
    if result is not None:
        assert result.records_before == sum(1 for r in records if r.offset < planned_end)
        assert result.records_after == sum(1 for r in expected if r.offset < planned_end)
    assert (log.log_start_offset, log.high_watermark, log.log_end_offset) == (0, hw, end)
    log.set_high_watermark(end)
    assert log.read_records(0, HUGE) == expected
    for base, raw in _raw_batches(log).items():
        original = decode_batch(before[base])
        kept = decode_batch(raw)
        if len(kept.records) == len(original.records):
            assert raw == before[base]  # untouched: the very same bytes
        else:
            assert 0 < len(kept.records) < len(original.records)
            fields = ("codec", "timestamp_type", "producer_id", "base_sequence", "base_offset")
            assert [getattr(kept.header, f) for f in fields] == [
                getattr(original.header, f) for f in fields
            ]
    log.close()
    reopened = PartitionLog.open(directory, COMPACT_CONFIG)
    assert reopened.log_start_offset == 0
    reopened.set_high_watermark(reopened.log_end_offset)
    assert reopened.read_records(0, HUGE) == expected
    reopened.close()
    shutil.rmtree(directory)


def _compacting_log(directory: Path) -> PartitionLog:
    return PartitionLog.open(directory, replace(COMPACT_CONFIG, segment_bytes=150))


def test_a_tombstone_is_kept_for_delete_retention_ms_after_its_timestamp(tmp_path: Path) -> None:
    for now_ms, kept in [(500 + DELETE_RETENTION_MS - 1, True), (500 + DELETE_RETENTION_MS, False)]:
        log = _compacting_log(tmp_path / str(now_ms))
        log.append(encode_batch([Record(b"k", b"old", timestamp_ms=100)]))
        log.append(encode_batch([Record(b"k", None, timestamp_ms=500)]))  # the delete
        log.roll()
        log.append(encode_batch([Record(b"other", b"v", timestamp_ms=600)]))
        log.set_high_watermark(log.log_end_offset)
        compact(log, now_ms)
        tombstone = [Record(b"k", None, (), 500, 1)] if kept else []
        assert log.read_records(0, HUGE) == [*tombstone, Record(b"other", b"v", (), 600, 2)]
        log.close()


def test_compaction_emptying_the_first_segment_keeps_log_start_offset(tmp_path: Path) -> None:
    log = _compacting_log(tmp_path)
    for value in (b"v0", b"v1"):
        log.append(encode_batch([Record(b"k", value, timestamp_ms=1)]))
    log.roll()  # segment [0-1] holds only values that [2-3] supersedes
    for value in (b"v2", b"v3"):
        log.append(encode_batch([Record(b"k", value, timestamp_ms=1)]))
    log.roll()
    log.append(encode_batch([Record(b"x", b"active", timestamp_ms=1)]))
    log.set_high_watermark(log.log_end_offset)

    compact(log, now_ms=10)
    assert [s.base_offset for s in log.segments] == [2, 4]
    assert log.log_start_offset == 0
    assert [r.offset for r in log.read_records(0, HUGE)] == [3, 4]
    log.close()
    log = _compacting_log(tmp_path)
    assert log.log_start_offset == 0
    log.set_high_watermark(log.log_end_offset)
    assert [r.offset for r in log.read_records(0, HUGE)] == [3, 4]
    log.close()


def test_compaction_built_on_another_thread_installs_while_the_owner_appends(
    tmp_path: Path,
) -> None:
    log = _compacting_log(tmp_path)
    expected: list[Record] = []
    for i in range(30):
        record = Record(b"k%d" % (i % 3), b"v%d" % i, timestamp_ms=i)
        base = log.append(encode_batch([record])).base_offset
        expected.append(replace(record, offset=base))
    log.set_high_watermark(log.log_end_offset)
    plan = plan_compaction(log)
    assert plan is not None
    planned_end = log.segments[len(plan.segments) - 1].next_offset
    results: list[CompactionResult] = []
    owner_moved_on = threading.Event()

    def build() -> None:
        owner_moved_on.wait()  # build only once the log has grown past the plan
        results.append(build_compaction(plan, 10**6))

    builder = threading.Thread(target=build)
    builder.start()
    for i in range(30, 80):  # the owner keeps appending, rolling new segments meanwhile
        record = Record(b"k%d" % (i % 3), b"v%d" % i, timestamp_ms=i)
        base = log.append(encode_batch([record])).base_offset
        expected.append(replace(record, offset=base))
        if i == 40:
            owner_moved_on.set()
    builder.join()

    assert install_compaction(log, results[0]) is True
    expected = _expected_after_compaction(expected, planned_end, 10**6)
    # Keys cycle k0 k1 k2, one record per batch: only the planned part's last three remain.
    assert [r.offset for r in expected if r.offset < planned_end] == [
        planned_end - 3,
        planned_end - 2,
        planned_end - 1,
    ]
    log.set_high_watermark(log.log_end_offset)
    assert log.read_records(0, HUGE) == expected
    assert not list(tmp_path.glob("*" + CLEANED_SUFFIX))
    log.close()


def test_a_stale_compaction_installs_nothing_and_leaves_no_cleaned_file(tmp_path: Path) -> None:
    log = _log_of_ten(
        tmp_path, cleanup_policy=CleanupPolicy.COMPACT_DELETE, retention_ms=None, retention_bytes=0
    )
    plan = plan_compaction(log)
    assert plan is not None and len(plan.segments) == 3
    result = build_compaction(plan, now_ms=0)
    assert len(list(tmp_path.glob("*" + CLEANED_SUFFIX))) == 3
    assert log.maybe_delete_segments(now_ms=0) == 3  # retention takes the planned segments
    files = sorted(p.name for p in tmp_path.iterdir() if not p.name.endswith(CLEANED_SUFFIX))
    segments = [(s.base_offset, s.size_bytes) for s in log.segments]

    assert install_compaction(log, result) is False
    assert sorted(p.name for p in tmp_path.iterdir()) == files
    assert [(s.base_offset, s.size_bytes) for s in log.segments] == segments
    assert _offsets(log) == [9]
    log.close()


# --------------------------------------------------------------------------- rolls, flushes


def test_a_segment_rolls_when_a_batch_is_more_than_segment_ms_newer_than_its_first(
    tmp_path: Path,
) -> None:
    log = PartitionLog.open(tmp_path, LogConfig(segment_ms=1_000, flush=NO_FLUSH))
    # The first batch's max timestamp (500) is what later batches are measured against.
    log.append(encode_batch([Record(None, b"a", timestamp_ms=0), Record(None, b"b", (), 500)]))
    log.append(encode_batch([Record(None, b"c", timestamp_ms=1_500)]))  # exactly 1000 newer
    assert [s.base_offset for s in log.segments] == [0]
    log.append(encode_batch([Record(None, b"d", timestamp_ms=1_501)]))
    assert [s.base_offset for s in log.segments] == [0, 3]
    log.append(encode_batch([Record(None, b"e", timestamp_ms=2_501)]))  # 1000 after 1501
    log.append(encode_batch([Record(None, b"f", timestamp_ms=2_502)]))
    assert [s.base_offset for s in log.segments] == [0, 3, 5]
    log.close()
    # Reopening recovers the active segment's first timestamp: the rule still holds.
    log = PartitionLog.open(tmp_path, log.config)
    log.append(encode_batch([Record(None, b"g", timestamp_ms=3_502)]))
    assert [s.base_offset for s in log.segments] == [0, 3, 5]
    log.append(encode_batch([Record(None, b"h", timestamp_ms=3_503)]))
    assert [s.base_offset for s in log.segments] == [0, 3, 5, 7]
    log.close()


def test_flush_policy_by_records_flushes_once_n_records_are_unflushed(tmp_path: Path) -> None:
    log = PartitionLog.open(tmp_path, LogConfig(flush=FlushPolicy(interval_records=3)))
    flushed = []
    for count in (1, 1, 1, 2, 2, 5, 1):
        batch = encode_batch([Record(None, b"v")] * count)
        flushed.append((log.append(batch).flushed, log.flushed_offset))
    assert flushed == [
        (False, 0),
        (False, 0),
        (True, 3),
        (False, 3),
        (True, 7),
        (True, 12),
        (False, 12),
    ]
    log.close()


def test_flush_policy_by_time_follows_the_injected_clock(tmp_path: Path) -> None:
    now = [1_000]
    config = LogConfig(flush=FlushPolicy(interval_records=None, interval_ms=100))
    log = PartitionLog.open(tmp_path, config, clock_ms=lambda: now[0])
    steps = []
    for clock_ms in (1_050, 1_099, 1_100, 1_150, 1_260):
        now[0] = clock_ms
        steps.append(log.append(encode_batch([Record(None, b"v")])).flushed)
    assert steps == [False, False, True, False, True]
    now[0] = 1_300
    log.append(encode_batch([Record(None, b"v")]))  # 40 ms after the last flush
    assert log.maybe_flush() is False and log.flushed_offset == 5
    now[0] = 1_359
    assert log.maybe_flush() is False
    now[0] = 1_360
    assert log.maybe_flush() is True and log.flushed_offset == 6
    now[0] = 2_000
    assert log.maybe_flush() is False  # nothing left to flush
    log.close()
