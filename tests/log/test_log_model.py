"""Proves that PartitionLog gives the same answers as a plain in-memory list of batches.

A hypothesis state machine drives one log with tiny segments and a sparse index (so size and
time rolls happen every few appends) through append (none and zstd), append keeping the
batch's own offsets (a replica copying a leader: gaps between and inside batches),
set_high_watermark, raw `read`, `read_records`, offset_for_timestamp, truncate_to, roll,
close-and-reopen and retention (maybe_delete_segments with a fake clock), and checks every
answer against the model: the batches as appended, with their offsets, bytes and timestamps.
Compaction is modelled on its own in test_log_retention.py.

What the model encodes about the log:
- append assigns base offset = log_end_offset and stores the batch byte for byte (only the
  base offset field is stamped); append(assign_offsets=False) keeps the batch's offsets if
  they start at or after log_end_offset, and refuses it otherwise;
- a batch is visible to readers once the high watermark passes its last offset (the high
  watermark may sit inside a batch; batches are never split), and a read returns whole
  batches, starting with the one holding the requested offset, up to max_bytes but at least
  one;
- offset_for_timestamp answers the first offset below the high watermark whose record
  timestamp is at or after the target;
- truncate_to accepts any offset in [log_start_offset, log_end_offset] that is not inside a
  batch and drops every batch from there on (the log then ends where the last kept batch
  ends, or where the segment holding the offset begins, if that is later); it refuses
  anything else without changing the log; the high watermark comes down with it;
- reopening keeps every record and resets the high watermark to log_start_offset;
- retention deletes whole closed segments, oldest first, that lie entirely below the high
  watermark and are older than retention_ms or not needed to keep retention_bytes, after
  rolling an active segment that is all expired and all below the high watermark.

After every step: log_start_offset <= high_watermark <= log_end_offset as in the model;
read_records from log_start_offset returns exactly the visible records, in offset order;
the size matches; the directory holds exactly one `<20-digit base offset>.log` per segment
(closed ones with both indexes) and nothing else but the log-start checkpoint.
"""

from __future__ import annotations

import re
import shutil
import tempfile
from dataclasses import dataclass, replace
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    rule,
    run_state_machine_as_test,
)

from log import (
    Codec,
    FlushPolicy,
    Header,
    InvalidOffsetError,
    LogConfig,
    OffsetOutOfRangeError,
    PartitionLog,
    Record,
    decode_batch,
    encode_batch,
    iter_batches,
)
from log.partition_log import LOG_START_CHECKPOINT
from log.records import with_base_offset

RETENTION_MS = 3_000
RETENTION_BYTES = 1_200
CONFIG = LogConfig(
    segment_bytes=400,
    segment_ms=4_000,
    index_interval_bytes=64,
    retention_ms=RETENTION_MS,
    retention_bytes=RETENTION_BYTES,
    # Durability is the crash tests' subject; here fsync on every append only costs time.
    flush=FlushPolicy(interval_records=None),
)
HUGE = 2**31

payloads = st.one_of(st.none(), st.just(b""), st.binary(min_size=1, max_size=12))
records_st = st.lists(
    st.builds(
        Record,
        key=payloads,
        value=payloads,
        headers=st.lists(
            st.builds(Header, st.sampled_from(["a", "é"]), st.binary(max_size=3)), max_size=2
        ).map(tuple),
        # Relative to the machine's clock: mostly forward, sometimes a little behind.
        timestamp_ms=st.integers(-300, 300),
    ),
    min_size=1,
    max_size=4,
)


@dataclass(frozen=True)
class ModelBatch:
    records: tuple[Record, ...]  # as decoded: absolute offsets and timestamps
    raw: bytes  # as stored: the appended bytes with the base offset stamped

    @property
    def base(self) -> int:
        return self.records[0].offset

    @property
    def last(self) -> int:
        return self.records[-1].offset

    @property
    def size(self) -> int:
        return len(self.raw)

    @property
    def max_ts(self) -> int:
        return max(r.timestamp_ms for r in self.records)


class PartitionLogMachine(RuleBasedStateMachine):
    root: Path  # set by the test: every run gets a fresh directory under tmp_path

    def __init__(self) -> None:
        super().__init__()
        self.directory = Path(tempfile.mkdtemp(dir=self.root))
        self.log = PartitionLog.open(self.directory, CONFIG)
        self.batches: list[ModelBatch] = []
        self.lso = 0
        self.hw = 0
        self.leo = 0
        self.clock_ms = 10_000

    def teardown(self) -> None:
        self.log.close()
        shutil.rmtree(self.directory)

    # ------------------------------------------------------------------ model answers

    def visible(self) -> list[ModelBatch]:
        return [b for b in self.batches if b.last < self.hw]

    def expected_read(
        self, start: int, max_bytes: int, end_offset: int | None = None
    ) -> list[ModelBatch]:
        out: list[ModelBatch] = []
        total = 0
        end = self.hw if end_offset is None else min(end_offset, self.hw)
        for b in self.batches:
            if b.last < start:
                continue
            if b.last >= end or (total and total + b.size > max_bytes):
                break
            out.append(b)
            total += b.size
        return out

    # ------------------------------------------------------------------ rules

    @initialize(batches=st.lists(records_st, max_size=12))
    def fill(self, batches: list[list[Record]]) -> None:
        for records in batches:
            self.append(records, Codec.NONE, 400)

    @rule(records=records_st, codec=st.sampled_from(Codec), advance_ms=st.integers(0, 1_500))
    def append(self, records: list[Record], codec: Codec, advance_ms: int) -> None:
        self.clock_ms += advance_ms
        records = [replace(r, timestamp_ms=self.clock_ms + r.timestamp_ms) for r in records]
        batch = encode_batch(records, base_offset=0, codec=codec)
        result = self.log.append(batch)
        assert (result.base_offset, result.last_offset) == (self.leo, self.leo + len(records) - 1)
        assert result.size_bytes == len(batch)
        assert result.max_timestamp_ms == max(r.timestamp_ms for r in records)
        stored = tuple(replace(r, offset=self.leo + i) for i, r in enumerate(records))
        self.batches.append(ModelBatch(stored, with_base_offset(batch, self.leo)))
        self.leo += len(records)

    @rule(records=records_st, data=st.data())
    def append_keeping_offsets(self, records: list[Record], data: st.DataObject) -> None:
        """A replica copying a leader's (maybe compacted) batch: its own offsets, gaps allowed."""
        base = data.draw(st.integers(max(self.leo - 2, 0), self.leo + 30), label="base")
        gaps = data.draw(
            st.lists(st.integers(1, 4), min_size=len(records) - 1, max_size=len(records) - 1)
        )
        deltas = [0]
        for gap in gaps:
            deltas.append(deltas[-1] + gap)
        records = [replace(r, timestamp_ms=self.clock_ms + r.timestamp_ms) for r in records]
        batch = encode_batch(records, base_offset=base, offset_deltas=deltas)
        if base < self.leo:
            with pytest.raises(InvalidOffsetError):
                self.log.append(batch, assign_offsets=False)
            return
        result = self.log.append(batch, assign_offsets=False)
        assert (result.base_offset, result.last_offset) == (base, base + deltas[-1])
        stored = tuple(replace(r, offset=base + d) for r, d in zip(records, deltas, strict=True))
        self.batches.append(ModelBatch(stored, batch))
        self.leo = base + deltas[-1] + 1

    @rule(data=st.data())
    def set_high_watermark(self, data: st.DataObject) -> None:
        # Mostly "everything is committed", as after a Raft apply; sometimes anywhere.
        hw = st.one_of(st.just(self.leo), st.integers(self.lso, self.leo))
        self.hw = data.draw(hw, label="high_watermark")
        self.log.set_high_watermark(self.hw)

    @rule(past_end=st.booleans())
    def refuse_high_watermark_outside_the_log(self, past_end: bool) -> None:
        offset = self.leo + 1 if past_end or self.lso == 0 else self.lso - 1
        with pytest.raises(InvalidOffsetError):
            self.log.set_high_watermark(offset)

    def draw_max_bytes(self, data: st.DataObject, start: int) -> int:
        """Any size, or one that ends exactly at (or one byte around) a batch boundary."""
        edges, total = [], 0
        for b in self.batches:
            if b.last >= start:
                total += b.size
                edges += [total - 1, total, total + 1]
        sizes = st.integers(1, 700)
        if edges:
            sizes = st.one_of(sizes, st.sampled_from([e for e in edges if e >= 1]))
        return data.draw(sizes, label="max_bytes")

    @rule(data=st.data(), bounded=st.booleans())
    def read(self, data: st.DataObject, bounded: bool) -> None:
        start = data.draw(st.integers(self.lso, self.leo), label="start")
        max_bytes = self.draw_max_bytes(data, start)
        end = data.draw(st.integers(start, self.leo + 1), label="end") if bounded else None
        expected = self.expected_read(start, max_bytes, end)
        with self.log.read(start, max_bytes, end_offset=end) as result:
            raw = result.read_bytes()
            assert (result.start_offset, result.high_watermark, result.log_start_offset) == (
                start,
                self.hw,
                self.lso,
            )
            assert result.next_offset == (expected[-1].last + 1 if expected else start)
        assert raw == b"".join(b.raw for b in expected)
        decoded = [decode_batch(raw[pos : pos + h.size_bytes]) for pos, h in iter_batches(raw)]
        assert [tuple(d.records) for d in decoded] == [b.records for b in expected]
        if decoded:  # whole batches: the first one holds `start` (or follows its gap)
            first = decoded[0].header
            assert first.base_offset <= start <= first.last_offset or (
                start < first.base_offset
                and not any(b.last >= start for b in self.batches if b.base < first.base_offset)
            )
            assert decoded[-1].header.last_offset < self.hw

    @rule(data=st.data(), max_records=st.one_of(st.none(), st.integers(1, 6)))
    def read_records(self, data: st.DataObject, max_records: int | None) -> None:
        start = data.draw(st.integers(self.lso, self.leo), label="start")
        max_bytes = self.draw_max_bytes(data, start)
        expected = [
            r for b in self.expected_read(start, max_bytes) for r in b.records if r.offset >= start
        ][:max_records]
        assert self.log.read_records(start, max_bytes, max_records=max_records) == expected

    @rule(below=st.booleans())
    def refuse_reads_outside_the_log(self, below: bool) -> None:
        offset = self.lso - 1 if below and self.lso > 0 else self.leo + 1
        with pytest.raises(OffsetOutOfRangeError):
            self.log.read_records(offset, HUGE)
        with pytest.raises(OffsetOutOfRangeError):
            self.log.read(offset, HUGE)

    @rule(data=st.data())
    def offset_for_timestamp(self, data: st.DataObject) -> None:
        stored = [r.timestamp_ms + d for b in self.batches for r in b.records for d in (0, 1)]
        recent = st.integers(self.clock_ms - 3_000, self.clock_ms + 300)
        target = data.draw(st.one_of(st.sampled_from(stored), recent) if stored else recent)
        candidates = [
            r.offset
            for b in self.batches
            for r in b.records
            if r.timestamp_ms >= target and r.offset < self.hw
        ]
        assert self.log.offset_for_timestamp(target) == min(candidates, default=None)

    @rule(data=st.data())
    def truncate_to(self, data: st.DataObject) -> None:
        boundaries = [b.base for b in self.batches] + [self.leo]
        offset = data.draw(
            st.one_of(st.sampled_from(boundaries), st.integers(self.lso - 1, self.leo + 1)),
            label="truncate offset",
        )
        inside_a_batch = any(b.base < offset <= b.last for b in self.batches)
        if inside_a_batch or not self.lso <= offset <= self.leo:
            with pytest.raises(InvalidOffsetError):
                self.log.truncate_to(offset)
            return
        # An offset in a gap cuts at the next batch; the log then ends where the last kept
        # batch does, or where the segment holding the offset begins.
        segment_base = max(s.base_offset for s in self.log.segments if s.base_offset <= offset)
        self.log.truncate_to(offset)
        if offset < self.leo:
            self.batches = [b for b in self.batches if b.base < offset]
            self.leo = max([b.last + 1 for b in self.batches] + [segment_base])
        self.hw = min(self.hw, self.leo)

    @rule()
    def roll(self) -> None:
        segments = len(self.log.segments)
        was_empty = self.log.active.is_empty
        self.log.roll()
        assert len(self.log.segments) == segments + (0 if was_empty else 1)
        assert self.log.active.base_offset == self.leo and self.log.active.is_empty

    @rule()
    def close_and_reopen(self) -> None:
        self.log.close()
        self.log = PartitionLog.open(self.directory, CONFIG)
        assert self.log.recovered_bytes_truncated == 0
        assert self.log.high_watermark == self.lso
        self.log.set_high_watermark(self.hw)

    @rule(data=st.data())
    def maybe_delete_segments(self, data: st.DataObject) -> None:
        # Any time ahead, or exactly when (or 1 ms before) some batch expires.
        edges = [b.max_ts + RETENTION_MS + d for b in self.batches for d in (0, 1)]
        later = st.integers(self.clock_ms, self.clock_ms + 6_000)
        now_ms = data.draw(st.one_of(later, st.sampled_from(edges)) if edges else later)
        expected_deleted, expected_start = self.expected_retention(now_ms)
        assert self.log.maybe_delete_segments(now_ms) == expected_deleted
        assert self.log.log_start_offset == expected_start
        self.lso = expected_start
        self.batches = [b for b in self.batches if b.base >= expected_start]
        self.hw = max(self.hw, self.lso)

    def expected_retention(self, now_ms: int) -> tuple[int, int]:
        """(segments deleted, new log_start_offset) by the documented rule, computed from the
        model's batches; only where segments begin is taken from the log."""
        bases = [s.base_offset for s in self.log.segments]
        horizon_ms = now_ms - RETENTION_MS

        def segment(i: int) -> list[ModelBatch]:
            end = bases[i + 1] if i + 1 < len(bases) else self.leo + 1
            return [b for b in self.batches if bases[i] <= b.base < end]

        active = segment(len(bases) - 1)
        if active and self.leo <= self.hw and max(b.max_ts for b in active) < horizon_ms:
            bases.append(self.leo)  # the active segment is rolled so that it can go
        total = sum(b.size for b in self.batches)
        deleted = 0
        while len(bases) > 1:
            oldest = segment(0)
            if oldest[-1].last >= self.hw:
                break
            size = sum(b.size for b in oldest)
            if not (max(b.max_ts for b in oldest) < horizon_ms or total - size >= RETENTION_BYTES):
                break
            total -= size
            bases.pop(0)
            deleted += 1
        return deleted, (bases[0] if deleted else self.lso)

    # ------------------------------------------------------------------ invariants

    @invariant()
    def log_matches_model(self) -> None:
        log = self.log
        assert self.lso <= self.hw <= self.leo
        assert (log.log_start_offset, log.high_watermark, log.log_end_offset) == (
            self.lso,
            self.hw,
            self.leo,
        )
        records = log.read_records(self.lso, HUGE)
        assert records == [r for b in self.visible() for r in b.records]
        offsets = [r.offset for r in records]
        assert offsets == sorted(set(offsets))
        assert log.size_bytes == sum(b.size for b in self.batches)

    @invariant()
    def directory_holds_exactly_the_segments(self) -> None:
        names = {p.name for p in self.directory.iterdir()}
        segments = self.log.segments
        logs = sorted(n for n in names if n.endswith(".log"))
        assert logs == [f"{s.base_offset:020d}.log" for s in segments]
        assert all(re.fullmatch(r"\d{20}\.log", n) for n in logs)
        bases = [s.base_offset for s in segments]
        assert bases == sorted(set(bases))
        for s in segments[:-1]:
            assert {s.index_path.name, s.timeindex_path.name} <= names
        allowed = {n for s in segments for n in (s.log_path.name, s.index_path.name)}
        allowed |= {s.timeindex_path.name for s in segments} | {LOG_START_CHECKPOINT}
        assert names <= allowed


def test_partition_log_answers_like_the_model(tmp_path: Path) -> None:
    PartitionLogMachine.root = tmp_path
    run_state_machine_as_test(
        PartitionLogMachine,
        settings=settings(
            max_examples=100,
            stateful_step_count=50,
            deadline=None,
            suppress_health_check=[HealthCheck.too_slow],
        ),
    )
