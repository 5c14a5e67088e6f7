"""PartitionLog: the append-only, segmented log of one partition replica.

Single writer, not thread-safe: exactly one owner (the partition's replica in the
broker) calls every method, one at a time. The only work that may run on another
thread is the build phase of compaction (see log/compaction.py), which reads closed,
immutable segment files through descriptors of its own.

Offsets (half-open ranges throughout):
    log_start_offset <= high_watermark <= log_end_offset
    [log_start_offset, log_end_offset)  offsets that may hold records (gaps after compaction)
    [log_start_offset, high_watermark)  what readers see: set by the caller once committed
"""

from __future__ import annotations

import contextlib
import os
import struct
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from log import limits
from log import records as fmt
from log.config import LogConfig
from log.errors import (
    CorruptRecordError,
    CorruptSegmentError,
    InvalidOffsetError,
    OffsetOutOfRangeError,
    RecordTooLargeError,
    StorageError,
    StorageWriteError,
)
from log.segment import (
    CLEANED_SUFFIX,
    DURABLE_TRACE_SUFFIX,
    INDEX_SUFFIX,
    LOG_SUFFIX,
    NO_SPACE_ERRNOS,
    TIMEINDEX_SUFFIX,
    Segment,
    fsync_directory,
    write_durably,
)
from log.writeback import WRITEBACK_BYTES, Kick

_BASE_OFFSET = struct.Struct(">q")
LOG_START_CHECKPOINT = "log-start-offset"
TRUNCATE_FULLY_MARKER = "truncate-fully-to"


_LOG_APPEND_FIELDS = struct.Struct(">h")  # attributes, rewritten for log-append time
_TIMESTAMPS = struct.Struct(">qq")  # first_timestamp_ms, max_timestamp_ms at byte 23


def monotonic_ms() -> int:
    return time.monotonic_ns() // 1_000_000


def invariant(condition: bool, message: str) -> None:
    """An invariant check that `python -O` cannot strip: a broken one stops the node."""
    if not condition:
        raise StorageError(f"invariant violated: {message}")


@dataclass(frozen=True, slots=True)
class AppendResult:
    base_offset: int
    last_offset: int  # inclusive
    position: int  # byte position of the batch in its segment file
    size_bytes: int
    max_timestamp_ms: int
    flushed: bool  # this append was fsynced before returning


@dataclass(frozen=True, slots=True)
class FileRange:
    """A run of whole batches in a segment file: send with os.sendfile(fd, position, length).

    `fd` is a private duplicate owned by the ReadResult: it stays valid even if
    retention deletes or compaction replaces the file after the read.
    """

    fd: int
    path: str
    position: int
    length: int


@dataclass(slots=True)
class ReadResult:
    """Whole batches covering offsets from the requested start, below the high watermark.

    The first batch may begin before the requested offset (batches are not split);
    readers skip records below it. Close it (or use `with`) to release descriptors.
    """

    ranges: list[FileRange]
    start_offset: int
    next_offset: int  # where the next read continues
    high_watermark: int
    log_start_offset: int

    @property
    def size_bytes(self) -> int:
        return sum(r.length for r in self.ranges)

    def read_bytes(self) -> bytes:
        parts = []
        for r in self.ranges:
            data = os.pread(r.fd, r.length, r.position)
            if len(data) != r.length:
                raise StorageError(f"{r.path} shrank under a read at {r.position}")
            parts.append(data)
        return b"".join(parts)

    def close(self) -> None:
        for r in self.ranges:
            os.close(r.fd)
        self.ranges = []

    def __enter__(self) -> ReadResult:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


@dataclass(frozen=True, slots=True)
class Retained:
    """What one retention pass deleted: `segments` whole segments holding the offsets
    [start_offset, end_offset); `by_age` of them older than retention_ms, the others
    (`segments - by_age`) over retention_bytes."""

    segments: int = 0
    by_age: int = 0
    start_offset: int = 0
    end_offset: int = 0


@dataclass(frozen=True, slots=True)
class _Span:
    segment: Segment
    position: int
    length: int


class PartitionLog:
    """See the module docstring; the on-disk layout and invariants are in log/README.md."""

    def __init__(
        self, directory: Path, config: LogConfig, clock_ms: Callable[[], int] = monotonic_ms
    ) -> None:
        self.directory = directory
        self.config = config
        self._clock_ms = clock_ms
        self.segments: list[Segment] = []
        self._log_start_offset = 0
        self._high_watermark = 0
        self._unflushed_records = 0
        self._last_flush_ms = clock_ms()
        self.recovered_bytes_truncated = 0
        self.closed = False
        # log/writeback.py: given by the owner (the broker's Writeback.kick), the active
        # segment's write-back is started each WRITEBACK_BYTES it receives, so that sealing
        # it (an fdatasync on the writer's thread) finds little left to write. None: never.
        self.writeback: Kick | None = None
        # Set after a failed write or fsync: the page cache can no longer be trusted
        # to hold what was written (fsync errors are not sticky), so the log stops
        # taking writes and the node must restart and recover from disk.
        self._failed: str | None = None

    # ------------------------------------------------------------------ open / close

    @classmethod
    def open(
        cls,
        directory: Path | str,
        config: LogConfig | None = None,
        *,
        clock_ms: Callable[[], int] = monotonic_ms,
        initial_offset: int = 0,
    ) -> PartitionLog:
        """Open (recovering) or create the log in `directory`.

        Recovery: leftovers of an interrupted compaction or index write are removed;
        closed segments load their indexes (rebuilt if missing or damaged); the active
        segment is scanned batch by batch and a torn or corrupt tail is truncated.
        The high watermark starts at log_start_offset: the caller sets it.
        """
        log = cls(Path(directory), config or LogConfig(), clock_ms)
        log.directory.mkdir(parents=True, exist_ok=True)
        log._remove_leftovers()
        marker = log.directory / TRUNCATE_FULLY_MARKER
        if marker.exists():  # a truncate_fully_and_start_at was interrupted: finish it
            start = int(marker.read_text().strip())
            for path in log.directory.iterdir():
                if path.name.endswith(
                    (LOG_SUFFIX, INDEX_SUFFIX, TIMEINDEX_SUFFIX, LOG_SUFFIX + DURABLE_TRACE_SUFFIX)
                ):
                    path.unlink()
            initial_offset = start
            log._set_log_start_offset(start)
            marker.unlink()
            fsync_directory(log.directory)
        bases = sorted(
            int(p.name[: -len(LOG_SUFFIX)])
            for p in log.directory.iterdir()
            if p.name.endswith(LOG_SUFFIX) and p.name[: -len(LOG_SUFFIX)].isdigit()
        )
        for base in bases:
            log.segments.append(Segment(log.directory, base, log.config.index_interval_bytes))
        if not log.segments:
            log.segments.append(
                Segment(log.directory, initial_offset, log.config.index_interval_bytes)
            )
            fsync_directory(log.directory)
        for segment in log.segments[:-1]:
            segment.load_closed()
        log.recovered_bytes_truncated = log.segments[-1].recover()
        log._drop_empty_closed_segments()
        log._check_segment_order()
        checkpoint = log._read_log_start_checkpoint()
        if checkpoint < 0:
            # Record where the log starts before compaction can empty the first segment:
            # from then on the checkpoint, not the first segment, says so (it may lie
            # below the first segment's base offset).
            checkpoint = log.segments[0].base_offset
            log._set_log_start_offset(checkpoint)
            fsync_directory(log.directory)
        log._log_start_offset = checkpoint
        log._high_watermark = log.log_start_offset
        return log

    def _remove_leftovers(self) -> None:
        for path in self.directory.iterdir():
            if path.name.endswith((CLEANED_SUFFIX, ".tmp")):
                path.unlink()
            elif path.name.endswith((INDEX_SUFFIX, TIMEINDEX_SUFFIX)):
                stem = path.name.rsplit(".", 1)[0]
                if not (self.directory / (stem + LOG_SUFFIX)).exists():
                    path.unlink()

    def _drop_empty_closed_segments(self) -> None:
        for segment in [s for s in self.segments[:-1] if s.is_empty]:
            segment.delete()
            self.segments.remove(segment)

    def _check_segment_order(self) -> None:
        for before, after in zip(self.segments, self.segments[1:], strict=False):
            invariant(
                before.next_offset <= after.base_offset,
                f"segment {before.log_path} ends at {before.next_offset} after the next "
                f"one starts at {after.base_offset}",
            )

    def _fail(self, reason: str) -> StorageError:
        self._failed = reason
        return StorageError(reason)

    def close(self) -> None:
        if self.closed:
            return
        if self._failed is None:
            self.flush()
        for segment in self.segments:
            segment.close_files()
        self.closed = True

    # ------------------------------------------------------------------ offsets

    @property
    def active(self) -> Segment:
        return self.segments[-1]

    @property
    def log_start_offset(self) -> int:
        """The first offset a reader may ask for. Persisted in a checkpoint file so that
        compaction emptying the first segment does not move it."""
        return self._log_start_offset

    def _read_log_start_checkpoint(self) -> int:
        try:
            return int((self.directory / LOG_START_CHECKPOINT).read_text().strip())
        except (FileNotFoundError, ValueError):
            return -1

    def _set_log_start_offset(self, offset: int) -> None:
        """Write the checkpoint durably *before* removing the data below it, so a crash
        in between leaves a log start at or above the first segment, never below."""
        write_durably(self.directory / LOG_START_CHECKPOINT, f"{offset}\n".encode())
        self._log_start_offset = offset

    @property
    def log_end_offset(self) -> int:
        """The next offset append will assign."""
        return self.active.next_offset

    @property
    def high_watermark(self) -> int:
        return self._high_watermark

    def set_high_watermark(self, offset: int) -> None:
        """Readers see [log_start_offset, offset). Called by whoever knows what is committed."""
        if not self.log_start_offset <= offset <= self.log_end_offset:
            raise InvalidOffsetError(
                f"high watermark {offset} outside [{self.log_start_offset}, {self.log_end_offset}]",
                field="high_watermark",
            )
        self._high_watermark = offset

    @property
    def size_bytes(self) -> int:
        return sum(s.size_bytes for s in self.segments)

    @property
    def flushed_offset(self) -> int:
        """Every offset below this is on stable storage (fdatasync returned)."""
        active = self.active
        if active.flushed_bytes == active.size_bytes:
            return active.next_offset
        last = active.base_offset
        for entry in active.scan(0, end_position=active.flushed_bytes):
            last = entry.header.next_offset
        return last

    # ------------------------------------------------------------------ append

    def append(
        self,
        batch: bytes,
        *,
        assign_offsets: bool = True,
        log_append_time_ms: int | None = None,
    ) -> AppendResult:
        """Append one batch and return where it went.

        With `assign_offsets` (the normal path) the batch gets base offset =
        log_end_offset. Without it (copying a leader's segment data) its own offsets
        are kept and must start at or after log_end_offset. With `log_append_time_ms`
        the batch is stamped with that time (timestamp type LOG_APPEND_TIME).
        Framing and CRC are checked here; per-record limits at the edge
        (records.validate_batch), before the batch is replicated.
        """
        if self._failed is not None:
            raise StorageError(f"the log refuses writes after an I/O failure: {self._failed}")
        header = self._check_incoming(batch)
        if assign_offsets:
            base_offset = self.log_end_offset
        else:
            base_offset = header.base_offset
            if base_offset < self.log_end_offset:
                raise InvalidOffsetError(
                    f"batch base offset {base_offset} is below log_end_offset "
                    f"{self.log_end_offset}",
                    field="batch.base_offset",
                )
        if base_offset + header.last_offset_delta > limits.OFFSET_MAX:
            raise InvalidOffsetError("offset space exhausted", field="batch.base_offset")
        if log_append_time_ms is not None:
            batch = self._stamp_log_append_time(batch, log_append_time_ms)
            header = fmt.read_header(batch)
        # One header object with the assigned offset (dataclasses.replace costs more
        # than the write of a small batch).
        header = fmt.BatchHeader(base_offset, *fmt.header_fields_after_base_offset(header))
        self._maybe_roll(header)
        segment = self.active
        invariant(base_offset >= segment.next_offset, "append would reuse an offset")
        try:
            # The base offset is written in place of the producer's; the CRC does not cover it.
            position = segment.append_parts(
                (_BASE_OFFSET.pack(base_offset), memoryview(batch)[8:]), header
            )
        except StorageWriteError:
            raise  # undone: the log is as before this call, and takes writes again
        except OSError as exc:  # the undo itself failed: the file's tail is unknown
            raise self._fail(f"write to {segment.log_path} failed: {exc}") from exc
        self._unflushed_records += header.record_count
        flushed = self._maybe_flush_after_append()
        if self.writeback is not None and not flushed:
            # Whole pages only: the next append would wait for a page under write-back.
            end = segment.whole_pages_bytes
            if end - segment.kicked_bytes >= WRITEBACK_BYTES:
                self.writeback(segment.fd, segment.kicked_bytes, end - segment.kicked_bytes)
                segment.kicked_bytes = end
        return AppendResult(
            base_offset=base_offset,
            last_offset=header.last_offset,
            position=position,
            size_bytes=header.size_bytes,
            max_timestamp_ms=header.max_timestamp_ms,
            flushed=flushed,
        )

    def _check_incoming(self, batch: bytes) -> fmt.BatchHeader:
        if len(batch) > self.config.batch_bytes_max:
            raise RecordTooLargeError(
                f"batch of {len(batch)} bytes exceeds batch_bytes_max "
                f"{self.config.batch_bytes_max}",
                field="batch",
                limit=self.config.batch_bytes_max,
            )
        header = fmt.read_header(batch)
        if header.size_bytes != len(batch):
            raise CorruptRecordError(
                f"batch_length says {header.size_bytes} bytes, got {len(batch)}",
                field="batch.batch_length",
            )
        if not fmt.verify_crc(batch, header):
            raise CorruptRecordError("batch CRC-32C does not match", field="batch.crc")
        return header

    @staticmethod
    def _stamp_log_append_time(batch: bytes, now_ms: int) -> bytes:
        data = bytearray(batch)
        (attributes,) = _LOG_APPEND_FIELDS.unpack_from(data, 17)
        _LOG_APPEND_FIELDS.pack_into(data, 17, attributes | 0x08)
        _TIMESTAMPS.pack_into(data, 23, now_ms, now_ms)
        struct.pack_into(">I", data, 13, fmt.compute_crc(data))
        return bytes(data)

    def _maybe_roll(self, incoming: fmt.BatchHeader) -> bool:
        """Start a new active segment if the incoming batch should not join this one."""
        active = self.active
        if active.is_empty:
            if incoming.last_offset - active.base_offset > limits.RELATIVE_OFFSET_MAX:
                self.roll(incoming.base_offset)  # replaces the empty segment
                return True
            return False
        first_ts = active.first_batch_timestamp_ms
        too_old = first_ts is not None and incoming.max_timestamp_ms - first_ts > (
            self.config.segment_ms
        )
        if not (
            active.size_bytes + incoming.size_bytes > self.config.segment_bytes
            or active.index_entries >= self.config.index_entries_max
            or incoming.last_offset - active.base_offset > limits.RELATIVE_OFFSET_MAX
            or too_old
        ):
            return False
        self.roll(incoming.base_offset)
        return True

    def roll(self, base_offset: int | None = None) -> None:
        """Seal the active segment and start a new one at base_offset (default: LEO)."""
        new_base = self.log_end_offset if base_offset is None else base_offset
        invariant(new_base >= self.log_end_offset, "a new segment may not overlap the last")
        old = self.active
        try:
            old.flush()
        except OSError as exc:  # a failed fsync is never retried (module README: "Faults")
            raise self._fail(f"sealing {old.log_path} failed: {exc}") from exc
        try:
            old.close_for_appends()
        except OSError as exc:
            # The index files could not be written (a full disk): the segment stays the
            # active one, unchanged, and the roll is tried again by the next append.
            raise StorageWriteError(
                f"sealing {old.log_path} failed: {exc}", no_space=exc.errno in NO_SPACE_ERRNOS
            ) from exc
        self._unflushed_records = 0
        self._last_flush_ms = self._clock_ms()
        if old.is_empty and new_base == old.base_offset:
            # Nothing to seal: the empty segment goes on as the active one, as a new one
            # at the same base would (no file to create, so nothing to fail).
            old.index_path.unlink(missing_ok=True)
            old.timeindex_path.unlink(missing_ok=True)
            old.closed = False
            return
        try:
            segment = Segment(self.directory, new_base, self.config.index_interval_bytes)
        except OSError as exc:  # no inode or directory block left: the old one stays active
            raise StorageWriteError(
                f"creating a segment in {self.directory} failed: {exc}",
                no_space=exc.errno in NO_SPACE_ERRNOS,
            ) from exc
        if old.is_empty:
            old.delete()
            self.segments.pop()
        self.segments.append(segment)
        fsync_directory(self.directory)

    # ------------------------------------------------------------------ flush

    def _maybe_flush_after_append(self) -> bool:
        policy = self.config.flush
        if (
            policy.interval_records is not None
            and self._unflushed_records >= policy.interval_records
        ):
            self.flush()
            return True
        return self.maybe_flush()

    def maybe_flush(self) -> bool:
        """Flush if the time trigger of the flush policy has fired. Returns whether it did."""
        interval = self.config.flush.interval_ms
        if interval is None or self._unflushed_records == 0:
            return False
        if self._clock_ms() - self._last_flush_ms < interval:
            return False
        self.flush()
        return True

    def flush(self) -> None:
        if self._failed is not None:
            # A later fsync that succeeds says nothing about the writes the failed one
            # lost: never report them as flushed.
            raise StorageError(f"the log refuses to flush after an I/O failure: {self._failed}")
        try:
            self.active.flush()
        except OSError as exc:
            raise self._fail(f"fsync of {self.active.log_path} failed: {exc}") from exc
        self._unflushed_records = 0
        self._last_flush_ms = self._clock_ms()

    # ------------------------------------------------------------------ read

    def _check_read_offset(self, offset: int) -> None:
        if not self.log_start_offset <= offset <= self.log_end_offset:
            raise OffsetOutOfRangeError(offset, self.log_start_offset, self.log_end_offset)

    def _read_end(self, end_offset: int | None) -> int:
        """Where a read stops: never past the high watermark."""
        return self._high_watermark if end_offset is None else min(end_offset, self._high_watermark)

    def _segment_index_for(self, offset: int) -> int:
        lo, hi = 0, len(self.segments)
        while lo < hi:  # last segment whose base_offset <= offset
            mid = (lo + hi) // 2
            if self.segments[mid].base_offset <= offset:
                lo = mid + 1
            else:
                hi = mid
        return max(lo - 1, 0)

    def _spans(self, start_offset: int, max_bytes: int, end_offset: int) -> tuple[list[_Span], int]:
        """Whole batches from the one holding start_offset, within max_bytes (at least one
        batch), each batch entirely below end_offset. Returns the spans and next offset."""
        spans: list[_Span] = []
        total = 0
        next_offset = start_offset
        for i in range(self._segment_index_for(start_offset), len(self.segments)):
            segment = self.segments[i]
            entry = segment.find_batch(next_offset)
            if entry is None:
                continue
            span_start = entry.position
            span_end = span_start
            scan_from = span_start
            # Jump with the sparse index over batches that surely fit (see
            # Segment.skip_target): only the last stretch is walked header by header.
            if total:  # the first batch of a read is always taken whole, so never skip it
                budget_end = span_start + max_bytes - total
            else:
                first = entry.header
                budget_end = span_start + max(max_bytes, first.size_bytes)
            jump_position, _ = segment.skip_target(budget_end, end_offset)
            if jump_position > span_start and entry.header.last_offset < end_offset:
                total += jump_position - span_start
                span_end = scan_from = jump_position
            for scanned in segment.scan(scan_from):
                h = scanned.header
                if h.last_offset >= end_offset or (total and total + h.size_bytes > max_bytes):
                    break
                span_end = scanned.position + h.size_bytes
                total += h.size_bytes
                next_offset = h.next_offset
            if span_end > span_start:
                spans.append(_Span(segment, span_start, span_end - span_start))
            if span_end == span_start or span_end < segment.size_bytes or total >= max_bytes:
                break
        return spans, next_offset

    def read(
        self, start_offset: int, max_bytes: int, *, end_offset: int | None = None
    ) -> ReadResult:
        """Raw batches for [start_offset, min(end_offset, high_watermark)), up to
        max_bytes (always at least one whole batch, so a consumer makes progress).

        Framing is checked as batches are walked (a broken one raises
        CorruptSegmentError naming file and position); CRCs are checked by the
        decoding reader and by consumers, end to end.
        """
        self._check_read_offset(start_offset)
        end = self._read_end(end_offset)
        spans, next_offset = (
            self._spans(start_offset, max(max_bytes, 1), end)
            if start_offset < end
            else ([], start_offset)
        )
        ranges = [
            FileRange(os.dup(s.segment.fd), str(s.segment.log_path), s.position, s.length)
            for s in spans
        ]
        return ReadResult(
            ranges=ranges,
            start_offset=start_offset,
            next_offset=next_offset,
            high_watermark=self._high_watermark,
            log_start_offset=self.log_start_offset,
        )

    def read_for_copy(
        self, start_offset: int, end_offset: int, max_bytes: int
    ) -> tuple[bytes, int]:
        """For a replica copying [start_offset, end_offset) from this log: whole raw
        batches from start_offset (within max_bytes, at least one), none starting at or
        past end_offset, and the offset this log vouches for: below it, the committed log
        holds nothing more than the batches returned. Past the last batch, that spans the
        gaps compaction left (batches it removed whole), up to min(end_offset, HW).
        """
        with self.read(start_offset, max_bytes) as raw:
            data = raw.read_bytes()
        cut, covered = 0, start_offset
        for position, header in fmt.iter_batches(data):
            if header.base_offset >= end_offset:  # committed: below it lie only gaps
                return data[:cut], end_offset
            cut, covered = position + header.size_bytes, header.next_offset
        cap = min(end_offset, self._high_watermark)
        if covered < cap:
            with self.read(covered, 1) as more:
                if not more.ranges:  # nothing committed from there on: a gap up to the HW
                    covered = cap
        return data[:cut], covered

    def read_batches(
        self, start_offset: int, max_bytes: int, *, end_offset: int | None = None
    ) -> Iterator[fmt.DecodedBatch]:
        """Decoded, CRC-checked batches for the same range as `read`."""
        self._check_read_offset(start_offset)
        end = self._read_end(end_offset)
        if start_offset >= end:
            return
        spans, _ = self._spans(start_offset, max(max_bytes, 1), end)
        for span in spans:
            data = os.pread(span.segment.fd, span.length, span.position)
            position = 0
            try:
                for position, header in fmt.iter_batches(data):
                    raw = memoryview(data)[position : position + header.size_bytes]
                    yield fmt.decode_batch(raw, verify=True)
            except CorruptRecordError as exc:
                # Stored data that fails its checks is the disk's fault, not the caller's.
                raise CorruptSegmentError(
                    str(span.segment.log_path), span.position + position, str(exc)
                ) from exc

    def read_records(
        self,
        start_offset: int,
        max_bytes: int,
        *,
        max_records: int | None = None,
        end_offset: int | None = None,
    ) -> list[fmt.Record]:
        """Decoded records with start_offset <= offset < min(end_offset, high_watermark).
        A stored batch that fails its checks ends the answer there: the records before it
        are returned, and a read that begins at it raises CorruptSegmentError (as a
        Kafka consumer gets the records before a corrupt batch, then the error)."""
        end = self._read_end(end_offset)
        out: list[fmt.Record] = []
        try:
            for batch in self.read_batches(start_offset, max_bytes, end_offset=end):
                if batch.header.is_control:
                    continue
                for record in batch.records:
                    if start_offset <= record.offset < end:
                        out.append(record)
                        if max_records is not None and len(out) >= max_records:
                            return out
        except CorruptSegmentError:
            if not out:
                raise
        return out

    def offset_for_timestamp(self, timestamp_ms: int) -> int | None:
        """The first offset whose record timestamp >= timestamp_ms, below the high
        watermark; None if there is none."""
        for segment in self.segments:
            if (
                segment.max_timestamp_ms < timestamp_ms
                or segment.base_offset >= self._high_watermark
            ):
                continue
            for entry in segment.scan(segment.time_position(timestamp_ms)):
                h = entry.header
                if h.base_offset >= self._high_watermark:
                    return None
                if h.max_timestamp_ms < timestamp_ms or h.is_control:
                    continue
                decoded = fmt.decode_batch(segment.read_batch(entry), verify=False)
                for record in decoded.records:
                    if record.timestamp_ms >= timestamp_ms and record.offset < self._high_watermark:
                        return record.offset
        return None

    # ------------------------------------------------------------------ truncate

    def truncate_to(self, offset: int) -> None:
        """Remove every record at or after `offset` (a batch boundary, or a gap).

        Replicas use this to drop an uncommitted suffix. log_start_offset <= offset <=
        log_end_offset; the high watermark comes down with it if needed.
        """
        if not self.log_start_offset <= offset <= self.log_end_offset:
            raise InvalidOffsetError(
                f"truncate offset {offset} outside [{self.log_start_offset}, "
                f"{self.log_end_offset}]",
                field="offset",
            )
        if offset == self.log_end_offset:
            return
        keep = self._segment_index_for(offset)
        # Check the cut point before deleting anything, so a bad offset changes nothing.
        target = self.segments[keep]
        if target.base_offset < offset:
            entry = target.find_batch(offset)
            if entry is not None and entry.header.base_offset < offset:
                raise InvalidOffsetError(
                    f"offset {offset} is inside the batch at {entry.header.base_offset}.."
                    f"{entry.header.last_offset}; truncation is by whole batches",
                    field="offset",
                )
        for segment in self.segments[keep + 1 :]:
            segment.delete()
        del self.segments[keep + 1 :]
        target.truncate_to(offset)
        fsync_directory(self.directory)
        self._high_watermark = min(self._high_watermark, self.log_end_offset)
        self._unflushed_records = 0

    def truncate_fully_and_start_at(self, offset: int) -> None:
        """Drop everything and continue at `offset` (a replica installing a snapshot)."""
        if offset < 0:
            raise InvalidOffsetError("offset must be >= 0", field="offset")
        # A marker makes the operation atomic: if a crash interrupts it, open() sees
        # the marker and finishes it instead of mixing old segments with the new start.
        marker = self.directory / TRUNCATE_FULLY_MARKER
        write_durably(marker, f"{offset}\n".encode())
        fsync_directory(self.directory)
        for segment in self.segments:
            segment.delete()
        self.segments = [Segment(self.directory, offset, self.config.index_interval_bytes)]
        self._set_log_start_offset(offset)
        marker.unlink()
        fsync_directory(self.directory)
        self._high_watermark = offset
        self._unflushed_records = 0

    # ------------------------------------------------------------------ retention

    def maybe_delete_segments(self, now_ms: int) -> int:
        """Retention (`apply_retention`); returns how many segments were deleted."""
        return self.apply_retention(now_ms).segments

    def apply_retention(self, now_ms: int) -> Retained:
        """Retention: delete whole closed segments by age and total size, oldest first,
        never past the high watermark. Says what went, and why (the broker logs it)."""
        start = self.log_start_offset
        if not self.config.deletes:
            return Retained(start_offset=start, end_offset=start)
        retention_ms = self.config.retention_ms
        active = self.active
        if (
            retention_ms is not None
            and not active.is_empty
            and active.next_offset <= self._high_watermark
            and active.max_timestamp_ms < now_ms - retention_ms
        ):
            # The active segment is all expired: seal it so it can go. On a full disk the
            # seal may fail (StorageWriteError): the closed segments still go, this one later.
            with contextlib.suppress(StorageWriteError):
                self.roll()
        total = self.size_bytes
        by_age = 0

        def goes(oldest: Segment) -> bool:
            nonlocal total, by_age
            expired = retention_ms is not None and oldest.max_timestamp_ms < now_ms - retention_ms
            oversize = (
                self.config.retention_bytes is not None
                and total - oldest.size_bytes >= self.config.retention_bytes
            )
            if expired or oversize:
                total -= oldest.size_bytes
                by_age += expired
                return True
            return False

        deleted = self._delete_oldest_while(goes)
        return Retained(deleted, by_age, start, self.log_start_offset)

    def delete_oldest_segments(self, count: int) -> int:
        """Delete up to `count` of the oldest closed segments (never the active one, never
        past the high watermark), moving log_start_offset past them. The caller decides
        which may go (tiered storage: only segments uploaded and recorded, past local
        retention: dmq/partition/remote_manifest.py). Returns how many were deleted."""
        left = count

        def goes(_: Segment) -> bool:
            nonlocal left
            left -= 1
            return left >= 0

        return self._delete_oldest_while(goes)

    def _delete_oldest_while(self, goes: Callable[[Segment], bool]) -> int:
        """Delete the oldest closed segment while `goes(it)` says so (never the active one,
        never one past the high watermark), moving log_start_offset past each; one
        directory fsync at the end. Returns how many were deleted."""
        deleted = 0
        while len(self.segments) > 1:
            oldest = self.segments[0]
            if oldest.next_offset > self._high_watermark or not goes(oldest):
                break
            self._set_log_start_offset(self.segments[1].base_offset)
            oldest.delete()
            self.segments.pop(0)
            deleted += 1
        if deleted:
            fsync_directory(self.directory)
            self._high_watermark = max(self._high_watermark, self.log_start_offset)
        return deleted
