"""One segment: a `.log` file of batches plus its sparse `.index` and `.timeindex`.

Files are named by the segment's base offset, zero-padded to 20 digits, so a
directory listing sorts in offset order. Only the last segment of a log (the active
one) is appended to; the others are closed and immutable until retention deletes
them or compaction replaces them whole.

The indexes of the active segment live in memory only and are written when it
closes: on open, the active segment is always scanned (and its CRCs checked), so
its indexes are rebuilt anyway. A closed segment's index files are loaded and
sanity-checked; a missing or damaged one is rebuilt from the `.log`.

Index entry formats (big-endian):
    .index      relative_offset u32, position u32                       8 bytes
    .timeindex  max_timestamp_ms i64 (of everything up to the batch), relative_offset u32   12 bytes
"""

from __future__ import annotations

import errno
import os
import struct
from array import array
from bisect import bisect_right
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from log import records as fmt
from log.errors import (
    CorruptRecordError,
    CorruptSegmentError,
    InvalidOffsetError,
    StorageWriteError,
)
from log.writeback import PAGE_BYTES

LOG_SUFFIX = ".log"
INDEX_SUFFIX = ".index"
TIMEINDEX_SUFFIX = ".timeindex"
CLEANED_SUFFIX = ".cleaned"  # compaction output not yet swapped in
DURABLE_TRACE_SUFFIX = ".durable"  # <base>.log.durable, test hook only (below)

# Test hook for power-loss tests (log/README.md, "Test hook"): with DMQ_DURABLE_TRACE=1 in
# the environment, every fsync of a segment's .log file appends the length it made durable
# to <base>.log.durable, so a test can cut the file back to what a power cut would keep.
# Read once, here: the log reads no environment anywhere else.
_DURABLE_TRACE = os.environ.get("DMQ_DURABLE_TRACE") == "1"

_INDEX_ENTRY = struct.Struct(">II")
_TIME_ENTRY = struct.Struct(">qI")
_SCAN_CHUNK_BYTES = 64 * 1024
# The errnos that mean "no room" (a full disk, a quota, a file-size limit): StorageWriteError
# says so, and the broker answers 507 rather than 503.
NO_SPACE_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EFBIG})


def segment_name(base_offset: int) -> str:
    return f"{base_offset:020d}"


def fsync_directory(directory: Path) -> None:
    """Make file creations, renames and deletions in `directory` durable."""
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_durably(path: Path, data: bytes) -> None:
    """Replace `path` with `data` atomically and durably: write a temp file, fsync it,
    rename it over `path`. (Callers fsync the directory when the name is new.)"""
    tmp = path.with_name(path.name + ".tmp")
    try:
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
    except OSError:
        # A full disk: leave `path` as it was and no half-written temp file behind.
        tmp.unlink(missing_ok=True)
        raise
    os.replace(tmp, path)


@dataclass(frozen=True, slots=True)
class ScanEntry:
    """One batch found by a scan: where it is and what its header says."""

    position: int
    header: fmt.BatchHeader


class Segment:
    """A segment file and its in-memory sparse indexes. Single-writer, not thread-safe.

    Invariants (checked where they can break):
      - batches are contiguous from position 0 to size_bytes, offsets increase;
      - base_offset <= every offset in the file < next_offset;
      - index entries are in increasing offset and position order, each pointing at
        the start of a batch whose base offset is the entry's offset.
    """

    def __init__(self, directory: Path, base_offset: int, index_interval_bytes: int) -> None:
        self.directory = directory
        self.base_offset = base_offset
        self.index_interval_bytes = index_interval_bytes
        self.log_path = directory / (segment_name(base_offset) + LOG_SUFFIX)
        self.index_path = directory / (segment_name(base_offset) + INDEX_SUFFIX)
        self.timeindex_path = directory / (segment_name(base_offset) + TIMEINDEX_SUFFIX)
        self.fd = os.open(self.log_path, os.O_RDWR | os.O_CREAT | os.O_APPEND, 0o644)
        self.size_bytes = 0
        self.flushed_bytes = 0  # prefix of the file known to be on stable storage
        self.kicked_bytes = 0  # prefix whose write-back was started (log/writeback.py)
        self.next_offset = base_offset
        self.max_timestamp_ms = -1
        self.first_batch_timestamp_ms: int | None = None
        self.closed = False
        self._index_offsets = array("q")
        self._index_positions = array("q")
        self._time_timestamps = array("q")
        self._time_offsets = array("q")
        self._bytes_since_index = 0
        self._indexed_max_timestamp_ms = -1

    # ------------------------------------------------------------------ state

    @property
    def is_empty(self) -> bool:
        return self.size_bytes == 0

    @property
    def index_entries(self) -> int:
        return len(self._index_offsets)

    @property
    def whole_pages_bytes(self) -> int:
        """The file's length rounded down to whole pages (what write-back may be asked
        for: a page under write-back would hold up the next append into it)."""
        return self.size_bytes - self.size_bytes % PAGE_BYTES

    def _reset_state(self) -> None:
        self.size_bytes = 0
        self.next_offset = self.base_offset
        self.max_timestamp_ms = -1
        self.first_batch_timestamp_ms = None
        self._index_offsets = array("q")
        self._index_positions = array("q")
        self._time_timestamps = array("q")
        self._time_offsets = array("q")
        self._bytes_since_index = 0
        self._indexed_max_timestamp_ms = -1

    def _track(self, position: int, header: fmt.BatchHeader) -> None:
        """Account for the batch at `position` (just appended or just scanned)."""
        if self.first_batch_timestamp_ms is None:
            self.first_batch_timestamp_ms = header.max_timestamp_ms
        if position == 0 or self._bytes_since_index >= self.index_interval_bytes:
            self._index_offsets.append(header.base_offset)
            self._index_positions.append(position)
            self._bytes_since_index = 0
            if self.max_timestamp_ms > self._indexed_max_timestamp_ms:
                # Everything before this batch has timestamps <= max_timestamp_ms.
                self._time_timestamps.append(self.max_timestamp_ms)
                self._time_offsets.append(header.base_offset)
                self._indexed_max_timestamp_ms = self.max_timestamp_ms
        self._bytes_since_index += header.size_bytes
        self.max_timestamp_ms = max(self.max_timestamp_ms, header.max_timestamp_ms)
        self.size_bytes = position + header.size_bytes
        self.next_offset = header.next_offset

    # ------------------------------------------------------------------ write

    def append_parts(self, parts: tuple[bytes | memoryview, ...], header: fmt.BatchHeader) -> int:
        """Write one batch given as parts (one writev, no copy); returns its position."""
        position = self.size_bytes
        expected = header.size_bytes
        try:
            written = os.writev(self.fd, parts)
        except OSError as exc:
            self._undo_partial_write(position)
            raise StorageWriteError(
                f"write to {self.log_path} failed: {exc}", no_space=exc.errno in NO_SPACE_ERRNOS
            ) from exc
        if written != expected:
            # A short write (the disk filled up mid-batch) leaves a torn tail: cut it
            # back to the last good batch, so nothing half-written is ever served.
            self._undo_partial_write(position)
            raise StorageWriteError(
                f"short write to {self.log_path}: {written} of {expected} bytes",
                no_space=True,
            )
        self._track(position, header)
        return position

    def _undo_partial_write(self, position: int) -> None:
        """Cut the file back to `position`, the end of the last good batch. An OSError
        here (the disk is failing, not just full) propagates: the caller fails the log."""
        if os.fstat(self.fd).st_size != position:
            os.ftruncate(self.fd, position)

    def append(self, batch: bytes | memoryview, header: fmt.BatchHeader) -> int:
        """Write one batch (already stamped with its base offset); returns its position."""
        return self.append_parts((batch,), header)

    def flush(self) -> None:
        if self.flushed_bytes != self.size_bytes:
            os.fdatasync(self.fd)
            self.flushed_bytes = self.size_bytes
            self._maybe_trace_durable()

    def _maybe_trace_durable(self) -> bool:
        """The test hook (top of module): record flushed_bytes, now on stable storage."""
        if not _DURABLE_TRACE:
            return False
        trace_path = self.log_path.with_name(self.log_path.name + DURABLE_TRACE_SUFFIX)
        fd = os.open(trace_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        try:
            os.write(fd, b"%d\n" % self.flushed_bytes)
        finally:
            os.close(fd)
        return True

    def close_for_appends(self) -> None:
        """Seal the segment: flush the data and write both index files durably."""
        self.flush()
        self._write_indexes()
        self.closed = True

    def _write_indexes(self) -> None:
        write_durably(self.index_path, self._encode_offset_index())
        write_durably(self.timeindex_path, self._encode_time_index())

    def _encode_offset_index(self) -> bytes:
        out = bytearray()
        for offset, position in zip(self._index_offsets, self._index_positions, strict=True):
            out += _INDEX_ENTRY.pack(offset - self.base_offset, position)
        return bytes(out)

    def _encode_time_index(self) -> bytes:
        out = bytearray()
        for ts, offset in zip(self._time_timestamps, self._time_offsets, strict=True):
            out += _TIME_ENTRY.pack(ts, offset - self.base_offset)
        return bytes(out)

    def close_files(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def delete(self) -> None:
        self.close_files()
        for path in (self.log_path, self.index_path, self.timeindex_path):
            path.unlink(missing_ok=True)
        self.log_path.with_name(self.log_path.name + DURABLE_TRACE_SUFFIX).unlink(missing_ok=True)

    # ------------------------------------------------------------------ scan

    def scan(
        self, start_position: int = 0, *, end_position: int | None = None
    ) -> Iterator[ScanEntry]:
        """Walk batch headers from start_position (which must start a batch).

        Structural checks only (magic, lengths, increasing offsets, inside the file);
        a failure raises CorruptSegmentError naming this file and the position.
        """
        end = self.size_bytes if end_position is None else end_position
        position = start_position
        previous_last = -1
        buffer = b""
        buffer_start = position
        while position < end:
            if position + fmt.HEADER_BYTES > buffer_start + len(buffer):
                buffer_start = position
                buffer = os.pread(self.fd, _SCAN_CHUNK_BYTES, position)
            try:
                header = fmt.read_header(buffer, position - buffer_start)
            except CorruptRecordError as exc:
                raise CorruptSegmentError(str(self.log_path), position, str(exc)) from exc
            if header.base_offset <= previous_last or header.base_offset < self.base_offset:
                raise CorruptSegmentError(
                    str(self.log_path), position, f"offset {header.base_offset} out of order"
                )
            if position + header.size_bytes > end:
                raise CorruptSegmentError(
                    str(self.log_path), position, "batch runs past the end of the segment"
                )
            yield ScanEntry(position, header)
            previous_last = header.last_offset
            position += header.size_bytes

    def read_batch(self, entry: ScanEntry, *, verify: bool = True) -> bytes:
        data = os.pread(self.fd, entry.header.size_bytes, entry.position)
        if len(data) != entry.header.size_bytes or (
            verify and not fmt.verify_crc(data, entry.header)
        ):
            raise CorruptSegmentError(str(self.log_path), entry.position, "CRC-32C mismatch")
        return data

    def position_for(self, offset: int) -> int:
        """Position of the last indexed batch whose base offset <= offset (0 if none)."""
        i = bisect_right(self._index_offsets, offset)
        return self._index_positions[i - 1] if i else 0

    def skip_target(self, position_max: int, offset_max: int) -> tuple[int, int]:
        """Where a bounded read may jump to without walking headers.

        Takes the last index entry E with position <= position_max and offset <=
        offset_max, and returns (position, offset) of the entry before it: the batch
        there ends by E's position and its offsets are below E's, so it surely fits
        the read, and a walk from it sets the read's next offset exactly. (0,
        base_offset) when there is no such entry.
        """
        i = min(
            bisect_right(self._index_positions, position_max),
            bisect_right(self._index_offsets, offset_max),
        )
        if i < 2:
            return 0, self.base_offset
        return self._index_positions[i - 2], self._index_offsets[i - 2]

    def find_batch(self, offset: int) -> ScanEntry | None:
        """The first batch holding an offset >= `offset`, or None past the end."""
        for entry in self.scan(self.position_for(offset)):
            if entry.header.last_offset >= offset:
                return entry
        return None

    def time_position(self, timestamp_ms: int) -> int:
        """A position from which a scan finds the first record with ts >= timestamp_ms."""
        i = bisect_right(self._time_timestamps, timestamp_ms - 1)
        if i == 0:
            return 0
        return self.position_for(self._time_offsets[i - 1])

    # ------------------------------------------------------------------ recovery

    def recover(self) -> int:
        """Validate every batch (framing + CRC); truncate at the first bad one.

        Rebuilds the in-memory indexes. Returns how many bytes were cut off.
        """
        file_bytes = os.fstat(self.fd).st_size
        self._reset_state()
        position = 0
        expected_min_offset = self.base_offset
        while position < file_bytes:
            prefix = os.pread(self.fd, fmt.HEADER_BYTES, position)
            try:
                header = fmt.read_header(prefix)
            except CorruptRecordError:
                break
            if header.base_offset < expected_min_offset or (
                position + header.size_bytes > file_bytes
            ):
                break
            data = os.pread(self.fd, header.size_bytes, position)
            if not fmt.verify_crc(data, header):
                break
            self._track(position, header)
            expected_min_offset = header.next_offset
            position += header.size_bytes
        cut = file_bytes - position
        if cut:
            os.ftruncate(self.fd, position)
        # A crashed process's writes may sit in the page cache only: make them durable
        # before counting them as flushed (the applied checkpoint vouches for them next,
        # and a power cut after it would otherwise leave the log shorter than it says).
        os.fsync(self.fd)
        self.flushed_bytes = self.size_bytes
        self.kicked_bytes = self.whole_pages_bytes  # synced: clean
        self._maybe_trace_durable()
        return cut

    def load_closed(self) -> bool:
        """Load a closed segment's state from its index files and last batch.

        Returns False (after rebuilding by a scan) if an index was missing or damaged.
        """
        self.size_bytes = os.fstat(self.fd).st_size
        self.flushed_bytes = self.size_bytes
        self.closed = True
        if self._load_indexes():
            return True
        self.rebuild_indexes()
        self._write_indexes()
        return False

    def _load_indexes(self) -> bool:
        try:
            raw_index = self.index_path.read_bytes()
            raw_time = self.timeindex_path.read_bytes()
        except FileNotFoundError:
            return False
        if not raw_index or len(raw_index) % _INDEX_ENTRY.size or len(raw_time) % _TIME_ENTRY.size:
            return False
        offsets = array("q")
        positions = array("q")
        for rel, pos in _INDEX_ENTRY.iter_unpack(raw_index):
            if (offsets and (rel + self.base_offset <= offsets[-1] or pos <= positions[-1])) or (
                pos >= self.size_bytes
            ):
                return False
            offsets.append(rel + self.base_offset)
            positions.append(pos)
        if positions[0] != 0:
            return False
        timestamps = array("q")
        time_offsets = array("q")
        for ts, rel in _TIME_ENTRY.iter_unpack(raw_time):
            if timestamps and (ts <= timestamps[-1] or rel + self.base_offset < time_offsets[-1]):
                return False
            timestamps.append(ts)
            time_offsets.append(rel + self.base_offset)
        # A time entry is written together with an offset entry for the same batch (see
        # _track); one naming any other offset would send lookups past matching records.
        indexed = set(offsets)
        if any(offset not in indexed for offset in time_offsets):
            return False
        # The index agrees with the file if its last entry points at a batch with that
        # base offset, and the batches after it run exactly to the end of the file.
        self._index_offsets, self._index_positions = offsets, positions
        self._time_timestamps, self._time_offsets = timestamps, time_offsets
        try:
            tail = list(self.scan(positions[-1]))
        except CorruptSegmentError:
            return False
        if not tail or tail[0].header.base_offset != offsets[-1]:
            return False
        last = tail[-1].header
        self.next_offset = last.next_offset
        first_entry = next(self.scan(0))
        self.first_batch_timestamp_ms = first_entry.header.max_timestamp_ms
        self.max_timestamp_ms = max(
            [e.header.max_timestamp_ms for e in tail] + ([timestamps[-1]] if timestamps else [])
        )
        return True

    def rebuild_indexes(self) -> None:
        """Rebuild indexes and state by scanning headers (closed segments only)."""
        size = self.size_bytes
        entries = list(self.scan(0, end_position=size))
        self._reset_state()
        for entry in entries:
            self._track(entry.position, entry.header)
        if self.size_bytes != size:
            raise CorruptSegmentError(str(self.log_path), self.size_bytes, "trailing bytes")

    def truncate_to(self, offset: int) -> None:
        """Remove every batch at or after `offset`, which must start a batch (or be the end)."""
        if offset >= self.next_offset:
            return
        cut_position = self.size_bytes
        for entry in self.scan(self.position_for(offset)):
            if entry.header.last_offset < offset:
                continue
            if entry.header.base_offset < offset:
                raise InvalidOffsetError(
                    f"offset {offset} is inside the batch at {entry.header.base_offset}"
                    f"..{entry.header.last_offset}; truncation is by whole batches",
                    field="offset",
                )
            cut_position = entry.position  # starts here, or the first batch after a gap
            break
        os.ftruncate(self.fd, cut_position)
        os.fsync(self.fd)
        self.size_bytes = cut_position
        self.rebuild_indexes()
        self.flushed_bytes = self.size_bytes
        self.kicked_bytes = min(self.kicked_bytes, self.whole_pages_bytes)
        self._maybe_trace_durable()
        self.closed = False
        self.index_path.unlink(missing_ok=True)
        self.timeindex_path.unlink(missing_ok=True)
