"""Proves that PartitionLog.open recovers from crashes and damage without losing flushed data
and without serving anything it cannot vouch for.

- A torn write: the active segment cut at every byte position inside its last batch reopens
  without an exception as exactly the earlier batches; log_end_offset is the torn batch's
  base offset and the next append takes it.
- A flipped bit: every single-bit flip of that batch reopens likewise, except in base_offset,
  which the CRC does not cover (the log stamps offsets in place): there a flip that moves the
  batch forward is taken as a gap, one that moves it back (or negative) drops it. Earlier
  batches always survive.
- Index damage: a closed segment's .index or .timeindex that is missing, empty, cut, garbage
  or pointing outside the segment is rebuilt, so reads and offset_for_timestamp still give
  the right answers (and the rebuilt files equal the originals).
- Corrupt data in a closed segment is never served: a bad CRC makes read_records raise
  CorruptSegmentError naming the file and the batch's position; a broken header makes the raw
  `read` raise it too.
- Leftovers of interrupted compactions and index writes (.cleaned, .tmp) are removed on open.
- flushed_offset tells what is on stable storage: with FlushPolicy(interval_records=None)
  nothing is until flush(); then everything below it survives losing any unflushed tail.
- Reopening after a crash makes the recovered tail durable before counting it as flushed:
  the bytes a killed process left in the page cache were never fdatasync'ed (found by
  jepsen/: kill -9, restart, then a power cut left a log shorter than its checkpoint).
"""

from __future__ import annotations

import os
import random
import shutil
import struct
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import pytest

from log import (
    AppendResult,
    Codec,
    CorruptRecordError,
    CorruptSegmentError,
    FlushPolicy,
    LogConfig,
    PartitionLog,
    Record,
    decode_batch,
    encode_batch,
)
from log import segment as log_segment
from log.records import HEADER_BYTES

HUGE = 2**31
# Three batches of 70-90 bytes per segment; every batch gets an offset-index entry.
CONFIG = LogConfig(segment_bytes=260, index_interval_bytes=1)


def _batch_records(i: int) -> list[Record]:
    # Timestamps wander (batch 3 is older than batch 2) so the time index has work to do.
    # Batch 0 has one record, the others two: later batches start at odd offsets, so a
    # flip of base_offset's lowest bit makes a batch overlap the one before it.
    ts = 1_000 + 100 * i - (150 if i % 3 == 0 else 0)
    first = Record(b"key-%d" % i, b"value-%d" % i, timestamp_ms=ts)
    return [first] if i == 0 else [first, Record(None, b"x", (), ts + 7)]


def _with_offsets(records: list[Record], base: int) -> list[Record]:
    return [replace(r, offset=base + i) for i, r in enumerate(records)]


def _write_log(
    directory: Path, batches: int, config: LogConfig = CONFIG, codec: Codec = Codec.NONE
) -> tuple[list[Record], list[AppendResult]]:
    """Append batches of _batch_records; returns the records as stored and the results."""
    log = PartitionLog.open(directory, config)
    stored: list[Record] = []
    results = []
    for i in range(batches):
        records = _batch_records(i)
        result = log.append(encode_batch(records, codec=codec))
        stored += _with_offsets(records, result.base_offset)
        results.append(result)
    log.close()
    return stored, results


def _all_records(log: PartitionLog) -> list[Record]:
    log.set_high_watermark(log.log_end_offset)
    return log.read_records(log.log_start_offset, HUGE)


Damage = Callable[[Path], object]


def _flip(path: Path, position: int, mask: int) -> None:
    with open(path, "r+b") as f:
        f.seek(position)
        byte = f.read(1)[0]
        f.seek(position)
        f.write(bytes([byte ^ mask]))


def _cut_at(size: int) -> Damage:
    return lambda path: os.truncate(path, size)


def _flip_at(position: int, mask: int) -> Damage:
    return lambda path: _flip(path, position, mask)


def _reopen_damaged(source: Path, work: Path, name: str, damage: Damage) -> Path:
    shutil.rmtree(work, ignore_errors=True)
    shutil.copytree(source, work)
    damage(work / name)
    return work


def _check_recovered(log: PartitionLog, expected: list[Record], torn: AppendResult) -> None:
    """The log is exactly `expected`, and appends continue where the torn batch began."""
    assert log.log_end_offset == expected[-1].offset + 1 == torn.base_offset
    assert _all_records(log) == expected
    assert log.flushed_offset == log.log_end_offset
    after = log.append(encode_batch([Record(b"after", b"crash", timestamp_ms=9_000)]))
    assert (after.base_offset, after.position) == (torn.base_offset, torn.position)
    log.close()
    again = PartitionLog.open(log.directory, CONFIG)
    assert again.recovered_bytes_truncated == 0
    assert _all_records(again) == [
        *expected,
        Record(b"after", b"crash", (), 9_000, torn.base_offset),
    ]
    again.close()


# --------------------------------------------------------------------------- torn tail


@pytest.mark.parametrize("codec", list(Codec), ids=lambda c: c.name.lower())
def test_cut_anywhere_inside_the_last_batch_recovers_every_earlier_batch(
    tmp_path: Path, codec: Codec
) -> None:
    source = tmp_path / "source"
    stored, results = _write_log(source, batches=8, codec=codec)
    torn = results[-1]
    assert torn.position > 0  # the active segment holds earlier batches too
    name = sorted(p.name for p in source.glob("*.log"))[-1]  # the active segment
    expected = stored[: -len(_batch_records(7))]

    for cut in range(torn.position, torn.position + torn.size_bytes):
        work = _reopen_damaged(source, tmp_path / "work", name, _cut_at(cut))
        log = PartitionLog.open(work, CONFIG)
        assert log.recovered_bytes_truncated == cut - torn.position
        _check_recovered(log, expected, torn)


@pytest.mark.parametrize("codec", list(Codec), ids=lambda c: c.name.lower())
def test_any_single_bit_flip_in_the_last_batch_loses_no_earlier_batch(
    tmp_path: Path, codec: Codec
) -> None:
    source = tmp_path / "source"
    stored, results = _write_log(source, batches=8, codec=codec)
    torn = results[-1]
    name = sorted(p.name for p in source.glob("*.log"))[-1]
    expected = stored[: -len(_batch_records(7))]
    last_records = stored[len(expected) :]

    for bit in range(torn.size_bytes * 8):
        position, mask = torn.position + bit // 8, 0x80 >> (bit % 8)
        work = _reopen_damaged(source, tmp_path / "work", name, _flip_at(position, mask))
        log = PartitionLog.open(work, CONFIG)
        if bit >= 64:
            assert log.recovered_bytes_truncated == torn.size_bytes, bit
            _check_recovered(log, expected, torn)
            continue
        # base_offset is outside the CRC: a larger value reads as the same batch after a
        # gap, a smaller or negative one breaks the offset order and is dropped.
        moved_base = torn.base_offset ^ (1 << (63 - bit))  # bit 0 is the sign
        if bit > 0 and moved_base > torn.base_offset:
            assert log.recovered_bytes_truncated == 0
            assert _all_records(log) == expected + [
                replace(r, offset=r.offset - torn.base_offset + moved_base) for r in last_records
            ]
            log.close()
        else:
            assert log.recovered_bytes_truncated == torn.size_bytes, bit
            _check_recovered(log, expected, torn)


# --------------------------------------------------------------------------- index damage

INDEX_DAMAGE: dict[str, Damage] = {
    "missing": lambda p: p.unlink(),
    "empty": lambda p: p.write_bytes(b""),
    "cut-mid-entry": lambda p: os.truncate(p, p.stat().st_size - 3),
    "cut-to-one-entry": lambda p: os.truncate(p, 12 if p.suffix == ".timeindex" else 8),
    "garbage": lambda p: p.write_bytes(random.Random(7).randbytes(p.stat().st_size)),
    # One well-formed entry whose relative offset lies far past the segment's last batch.
    "pointing-past-the-segment": lambda p: p.write_bytes(
        struct.pack(">qI", 0, 1_000) if p.suffix == ".timeindex" else struct.pack(">II", 1_000, 0)
    ),
}


def _read_or_none(path: Path, suffix: str) -> bytes | None:
    target = path.with_suffix(suffix)
    return target.read_bytes() if target.exists() else None


@pytest.mark.parametrize("suffix", [".index", ".timeindex"])
@pytest.mark.parametrize("damage", list(INDEX_DAMAGE))
def test_damaged_index_of_a_closed_segment_is_rebuilt(
    tmp_path: Path, suffix: str, damage: str
) -> None:
    config = replace(CONFIG, segment_bytes=2_000)
    source = tmp_path / "source"
    log = PartitionLog.open(source, config)
    stored: list[Record] = []
    for i in range(12):
        result = log.append(encode_batch(_batch_records(i)))
        stored += _with_offsets(_batch_records(i), result.base_offset)
    log.roll()
    result = log.append(encode_batch([Record(b"active", b"segment", timestamp_ms=5_000)]))
    log.close()
    closed_records = list(stored)
    stored.append(Record(b"active", b"segment", (), 5_000, result.base_offset))
    closed = PartitionLog.open(source, config).segments[0]
    originals = {s: closed.log_path.with_suffix(s).read_bytes() for s in (".index", ".timeindex")}
    assert len(originals[".index"]) == 12 * 8 and len(originals[".timeindex"]) > 12 * 2

    name = closed.log_path.with_suffix(suffix).name
    work = _reopen_damaged(source, tmp_path / "work", name, INDEX_DAMAGE[damage])
    damaged = {s: _read_or_none(work / name, s) for s in originals}
    log = PartitionLog.open(work, config)
    log.set_high_watermark(log.log_end_offset)
    assert log.segments[0].max_timestamp_ms == max(r.timestamp_ms for r in closed_records)
    for record in stored:
        assert log.read_records(record.offset, 1, max_records=1) == [record]
    for target in sorted({r.timestamp_ms + d for r in stored for d in (-1, 0, 1)}):
        expected = min((r.offset for r in stored if r.timestamp_ms >= target), default=None)
        assert log.offset_for_timestamp(target) == expected, target
    log.close()
    for s, original in originals.items():
        now = (work / name).with_suffix(s).read_bytes()
        # A prefix of whole entries is still a true, sparser index: it may be kept as it is.
        assert now == original or (now == damaged[s] and original.startswith(now))


# --------------------------------------------------------------------------- corrupt data


def _closed_segment_log(directory: Path) -> tuple[PartitionLog, list[Record], list[AppendResult]]:
    stored, results = _write_log(directory, batches=8)
    log = PartitionLog.open(directory, CONFIG)
    assert len(log.segments) >= 3
    log.set_high_watermark(log.log_end_offset)
    return log, stored, results


def test_a_bad_crc_in_a_closed_segment_is_never_served(tmp_path: Path) -> None:
    log, stored, results = _closed_segment_log(tmp_path)
    victim = results[1]  # the middle batch of the first, closed segment
    segment = log.segments[0]
    assert victim.position > 0 and victim.position + victim.size_bytes < segment.size_bytes
    log.close()
    _flip(segment.log_path, victim.position + HEADER_BYTES + 3, 0x10)  # inside its records

    log = PartitionLog.open(tmp_path, CONFIG)  # closed segments are not CRC-checked on open
    log.set_high_watermark(log.log_end_offset)
    # A read from before the batch ends at it: what came before, never the batch.
    assert log.read_records(log.log_start_offset, HUGE) == [
        r for r in stored if r.offset < victim.base_offset
    ]
    with pytest.raises(CorruptSegmentError) as raised:  # a read that starts at the batch
        log.read_records(victim.base_offset + 1, HUGE)
    assert (raised.value.path, raised.value.position) == (str(segment.log_path), victim.position)
    yielded = []
    with pytest.raises(CorruptSegmentError):
        for batch in log.read_batches(0, HUGE):
            yielded.append(batch.header.base_offset)
    assert yielded == [results[0].base_offset]  # what came before, never the corrupt batch
    with pytest.raises(CorruptSegmentError):
        log.offset_for_timestamp(_batch_records(1)[0].timestamp_ms)
    # Raw reads leave the CRC to the consumer, who refuses the batch end to end.
    with log.read(victim.base_offset, 1) as raw, pytest.raises(CorruptRecordError):
        decode_batch(raw.read_bytes())
    # The batches around it are still served.
    after = results[2].base_offset
    assert log.read_records(after, HUGE) == [r for r in stored if r.offset >= after]
    log.close()


def test_a_broken_header_in_a_closed_segment_makes_raw_reads_raise(tmp_path: Path) -> None:
    log, _, results = _closed_segment_log(tmp_path)
    victim = results[1]
    segment = log.segments[0]
    _flip(segment.log_path, victim.position + 12, 0x02)  # magic 1 -> 3, under the open log

    with pytest.raises(CorruptSegmentError) as raised:
        log.read(results[0].base_offset, HUGE)
    assert (raised.value.path, raised.value.position) == (str(segment.log_path), victim.position)
    with pytest.raises(CorruptSegmentError):
        log.read_records(results[0].base_offset, HUGE)
    log.close()


# --------------------------------------------------------------------------- leftovers


def test_leftover_cleaned_and_tmp_files_are_removed_on_open(tmp_path: Path) -> None:
    stored, _ = _write_log(tmp_path, batches=8)
    before = sorted(p.name for p in tmp_path.iterdir())
    leftovers = [
        "00000000000000000000.log.cleaned",  # a compaction that never installed
        "00000000000000000000.index.tmp",  # an index write cut short
        "log-start-offset.tmp",
        "00000000000000099999.index",  # an index whose segment is gone
        "00000000000000099999.timeindex",
    ]
    for leftover in leftovers:
        (tmp_path / leftover).write_bytes(b"junk")

    log = PartitionLog.open(tmp_path, CONFIG)
    assert sorted(p.name for p in tmp_path.iterdir()) == before
    assert _all_records(log) == stored
    log.close()


# --------------------------------------------------------------------------- flushing


def test_flushed_offset_covers_what_flush_wrote_and_it_survives_losing_the_rest(
    tmp_path: Path,
) -> None:
    config = replace(CONFIG, segment_bytes=10_000, flush=FlushPolicy(interval_records=None))
    log = PartitionLog.open(tmp_path / "log", config)
    first = [log.append(encode_batch(_batch_records(i))) for i in range(3)]
    durable = [
        r for i, res in enumerate(first) for r in _with_offsets(_batch_records(i), res.base_offset)
    ]
    assert not any(r.flushed for r in first)
    assert log.flushed_offset == 0
    log.flush()
    assert log.flushed_offset == log.log_end_offset == len(durable)
    later = [log.append(encode_batch(_batch_records(i))) for i in range(3, 5)]
    assert not any(r.flushed for r in later)
    assert log.flushed_offset == len(durable)  # the later batches are not on stable storage

    # Losing any part of the unflushed tail (the page cache, in a power cut) keeps every
    # offset below flushed_offset.
    flushed_bytes = first[-1].position + first[-1].size_bytes
    name = log.active.log_path.name
    end = later[-1].position + later[-1].size_bytes
    for cut in range(flushed_bytes, end + 1, 7):
        work = _reopen_damaged(tmp_path / "log", tmp_path / "work", name, _cut_at(cut))
        reopened = PartitionLog.open(work, config)
        assert reopened.log_end_offset >= len(durable)
        assert _all_records(reopened)[: len(durable)] == durable
        reopened.close()
    log.close()
    # close() flushes: everything is durable and the reopened log says so.
    reopened = PartitionLog.open(tmp_path / "log", config)
    assert reopened.flushed_offset == reopened.log_end_offset == later[-1].last_offset + 1
    reopened.close()


def test_reopening_after_a_crash_makes_the_unflushed_tail_durable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(log_segment, "_DURABLE_TRACE", True)  # the power-loss test hook
    config = replace(CONFIG, segment_bytes=10_000, flush=FlushPolicy(interval_records=None))
    crashed = PartitionLog.open(tmp_path / "log", config)
    for i in range(3):
        crashed.append(encode_batch(_batch_records(i)))
    size = crashed.active.size_bytes
    trace = crashed.active.log_path.with_name(crashed.active.log_path.name + ".durable")

    def traced() -> int:  # the last durable length the hook recorded
        return int(trace.read_text().split()[-1]) if trace.exists() else 0

    assert crashed.flushed_offset == 0 and traced() == 0  # in the page cache only
    # The process dies here (no close); a new one opens the same files.
    reopened = PartitionLog.open(tmp_path / "log", config)
    assert reopened.flushed_offset == reopened.log_end_offset == 5
    assert traced() == size, "counted as flushed without a sync"
    reopened.close()
    crashed.close()  # only to release its descriptors
