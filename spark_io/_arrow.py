"""Binary fetch answers (application/vnd.dmq.batches) straight into Arrow record batches.

The hot path of the Spark source. The client's `Consumer` decodes every record into a
Python object; here a fetch answer becomes columns without one object per record:

1. walk the stored batches (57-byte big-endian header, log/README.md "RecordBatch format"),
   check each batch's CRC-32C over everything after the CRC field, skip control batches;
2. decompress a zstd records section (bounded by UNCOMPRESSED_BYTES_MAX); the key and
   value columns are spans of one data buffer: the answer, or with a compressed batch in
   it every records section copied into one, in order;
3. walk the records (`_walk_vectorised` from VECTORISED_RECORDS_MIN records in the answer,
   else `_walk_scalar`): the chain of record lengths in Python, checked in runs of one
   size at once (log/record_walk.py `record_chain`); then every other field of every record in numpy (the timestamp and
   offset deltas, key and value lengths: varints of any length up to 9 bytes, one pass
   per byte). Each field must lie inside its record, lengths be -1 (null) or more, the
   headers (when asked for) end where the record does, and nothing follow a batch's last
   record; only the records in [start_offset, end_offset) are kept. What the vectorised
   walk cannot read exactly (a 10-byte varint, values at the edge of int64) goes to the
   scalar walk, which reads everything one record at a time with the same checks;
4. wrap the buffers as Arrow arrays (`pa.Array.from_buffers`, no copy) in the Spark
   schema; keys and values are copied out of the data buffer by one `pc.take` each.

spark_io/ is a client of the HTTP API and imports log/ only for log/record_walk.py (one
exception in tests/test_layering.py ALLOWED): the record chain and the numpy varint reader,
which the broker's produce check (log.records.validate_batch) shares. The rest of the
format is read here a second time; tests/spark_io/test_arrow_decode.py checks it against
log.records with hypothesis.
"""

from __future__ import annotations

import struct
from array import array
from dataclasses import dataclass, field

import crc32c
import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc
import zstandard

from dmq.errors import StorageError
from log.record_walk import I64, NeedsScalarWalk, record_chain, varints
from log.varint import get_varint

_HEADER = struct.Struct(">qibIhiqqqhii")
HEADER_BYTES = _HEADER.size  # 57
LENGTH_PREFIX_BYTES = 12  # base_offset + batch_length, not counted in batch_length
CRC_START = 17
MAGIC = 1
CODEC_MASK = 0x07
CODEC_NONE, CODEC_ZSTD = 0, 4
TIMESTAMP_TYPE_BIT = 0x08
CONTROL_BIT = 0x20
TRANSACTIONAL_BIT = 0x10  # log/records.py: a batch of a transaction
# The broker refuses batches that decompress to more (log/limits.py
# BATCH_UNCOMPRESSED_BYTES_MAX); the same bound keeps a corrupt frame from allocating more.
UNCOMPRESSED_BYTES_MAX = 64 * 1024 * 1024
US_PER_MS = 1000
INT32_MAX = 2**31 - 1  # Arrow binary offsets: the key and value spans of one answer
INT64_MAX = 2**63 - 1
# The largest |timestamp| in ms whose µs fit int64, less a margin for the float64 screen
# of _walk_vectorised (its error is at most ~2**11 ms: two int64s rounded to float64).
TIMESTAMP_MS_SAFE = INT64_MAX // US_PER_MS - 2**16
# Answers of fewer records go through the scalar loop: below this, numpy's fixed cost per
# call (~60 calls per answer, a few µs each) exceeds the loop's ~1-2 µs per record.
VECTORISED_RECORDS_MIN = 32
_NO_RECORDS = np.empty(0, np.int64)


@dataclass(slots=True)
class _Spans:
    """A nullable binary column as spans of the column data, gathered in C at the end.

    `bounds` holds each element's start and end, interleaved: read as Arrow offsets over
    the data buffer, element 2i is record i's bytes and element 2i+1 the bytes between
    it and the next (varints, other fields); `pc.take` of the even elements then copies
    the records' bytes into a compact column. The bounds never decrease and never pass
    the data's end (both walks check that every span lies inside its record, and records
    follow each other through the data), which `pc.take` relies on: Arrow does not check
    offsets built with from_buffers. A null is an empty span, False in `valid` (None when
    there is no null).
    """

    bounds: npt.NDArray[np.int32] = field(default_factory=lambda: np.empty(0, np.int32))
    valid: npt.NDArray[np.bool_] | None = None

    def to_arrow(self, data: pa.Buffer) -> pa.Array:
        n = len(self.bounds) // 2
        if n == 0:
            return pa.array([], pa.binary())
        spread = pa.Array.from_buffers(
            pa.binary(), 2 * n - 1, [None, pa.py_buffer(self.bounds), data]
        )
        packed = pc.take(spread, pa.array(np.arange(0, 2 * n - 1, 2, dtype=np.int32)))
        if self.valid is None:
            return packed
        validity = pa.py_buffer(np.packbits(self.valid, bitorder="little"))
        return pa.Array.from_buffers(
            pa.binary(),
            n,
            [validity, *packed.buffers()[1:]],
            null_count=n - int(np.count_nonzero(self.valid)),
        )


def _interleaved(starts: I64, ends: I64) -> npt.NDArray[np.int32]:
    bounds = np.empty(2 * len(starts), np.int32)
    bounds[0::2] = starts
    bounds[1::2] = ends
    return bounds


def _valid(n: int, nulls: list[int]) -> npt.NDArray[np.bool_] | None:
    if not nulls:
        return None
    valid = np.ones(n, np.bool_)
    valid[nulls] = False
    return valid


@dataclass(slots=True)
class Columns:
    """The columns of one Arrow batch in the making: one fetch answer of one partition.
    decode_into fills every field at once, after every check has passed."""

    topic: str
    partition: int
    with_headers: bool
    # Keys and values are spans of one data buffer: the answer itself, or, when it holds
    # a compressed batch, every records section (decompressed) copied into one, in order.
    data: bytes | bytearray = b""
    keys: _Spans = field(default_factory=_Spans)
    values: _Spans = field(default_factory=_Spans)
    offsets: I64 = field(default_factory=lambda: np.empty(0, np.int64))
    timestamps_us: I64 = field(default_factory=lambda: np.empty(0, np.int64))
    timestamp_types: npt.NDArray[np.int32] = field(default_factory=lambda: np.empty(0, np.int32))
    headers: list[list[tuple[str, bytes]] | None] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.offsets)

    def to_record_batch(self, schema: pa.Schema) -> pa.RecordBatch:
        """The batch in `schema` (the Spark schema's Arrow form, source.arrow_schema)."""
        n = len(self.offsets)
        data = pa.py_buffer(self.data)
        arrays: list[pa.Array] = [
            self.keys.to_arrow(data),
            self.values.to_arrow(data),
            pa.repeat(pa.scalar(self.topic, pa.string()), n),
            pa.repeat(pa.scalar(self.partition, pa.int32()), n),
            pa.Array.from_buffers(pa.int64(), n, [None, pa.py_buffer(self.offsets)]),
            pa.Array.from_buffers(
                schema.field("timestamp").type, n, [None, pa.py_buffer(self.timestamps_us)]
            ),
            pa.Array.from_buffers(pa.int32(), n, [None, pa.py_buffer(self.timestamp_types)]),
        ]
        if self.with_headers:
            arrays.append(pa.array(self.headers, schema.field("headers").type))
        return pa.RecordBatch.from_arrays(arrays, schema=schema)


# A records section in the column data: (start, end, the batch's header).
_Section = tuple[int, int, tuple[int, ...]]


def decode_into(
    columns: Columns,
    body: bytes,
    start_offset: int,
    end_offset: int,
    aborted: tuple[tuple[int, int, int], ...] = (),
) -> int:
    """Fill `columns` (new, empty) with the records of a binary fetch answer whose offsets
    are in [start_offset, end_offset); return the offset after the last batch walked
    (start_offset if the answer holds none).

    Raises StorageError naming the partition when a batch fails its framing or CRC check,
    or its records their bounds: such data is never handed to Spark.
    """
    if columns.data or len(columns):
        raise ValueError("decode_into fills a new Columns")
    try:
        batches, next_offset = _checked_batches(body, start_offset, end_offset, aborted)
        data, sections = _column_data(body, batches)
        records = sum(max(header[11], 0) for _, _, header in sections)
        if records >= VECTORISED_RECORDS_MIN:
            try:
                _walk_vectorised(columns, data, sections, start_offset, end_offset)
                return next_offset
            except NeedsScalarWalk:
                pass
        _walk_scalar(columns, data, sections, start_offset, end_offset)
    except (
        ValueError,
        IndexError,
        OverflowError,
        struct.error,
        UnicodeDecodeError,
        zstandard.ZstdError,
    ) as exc:
        raise StorageError(
            f"a batch fetched from {columns.topic}-{columns.partition} at offset "
            f"{start_offset} fails its checks: {exc}"
        ) from exc
    return next_offset


def _checked_batches(
    body: bytes, start_offset: int, end_offset: int, aborted: tuple[tuple[int, int, int], ...] = ()
) -> tuple[list[tuple[int, int, tuple[int, ...]]], int]:
    """Step 1 of the module docstring: the (section start, section end, header) of each
    data batch holding offsets in [start_offset, end_offset), framing and CRC checked,
    and the offset after the last batch walked."""
    view = memoryview(body)
    batches: list[tuple[int, int, tuple[int, ...]]] = []
    pos = 0
    next_offset = start_offset
    walked_to = 0  # the offset after the previous batch
    while pos < len(body):
        header = _HEADER.unpack_from(body, pos)
        base_offset, batch_length, magic, crc, attributes, last_delta = header[:6]
        size = batch_length + LENGTH_PREFIX_BYTES
        if magic != MAGIC or batch_length < HEADER_BYTES - LENGTH_PREFIX_BYTES:
            raise ValueError(f"bad batch framing at byte {pos} (magic {magic})")
        if pos + size > len(body):
            raise ValueError(f"batch at byte {pos} is cut by the end of the answer")
        if base_offset < walked_to:  # the base offset is not under the CRC
            raise ValueError(f"batch offsets go back from {walked_to} to {base_offset}")
        batch_pos = pos
        pos += size
        walked_to = base_offset + last_delta + 1
        next_offset = max(next_offset, walked_to)
        if base_offset >= end_offset:  # base_offset is checked against walked_to above
            break
        # Checked before last_delta or the control bit is trusted: a flipped bit in
        # either would otherwise skip or hide a data batch without a word.
        if crc32c.crc32c(view[batch_pos + CRC_START : pos]) != crc:
            raise ValueError(f"CRC-32C mismatch in the batch at offset {base_offset}")
        if base_offset + last_delta < start_offset:
            continue
        if attributes & TRANSACTIONAL_BIT and any(
            p == header[8] and f <= base_offset <= m for p, f, m in aborted
        ):
            continue  # read_committed: a batch of an aborted transaction
        if not attributes & CONTROL_BIT:
            batches.append((batch_pos + HEADER_BYTES, pos, header))
    return batches, next_offset


def _column_data(
    body: bytes, batches: list[tuple[int, int, tuple[int, ...]]]
) -> tuple[bytes | bytearray, list[_Section]]:
    """Step 2: the buffer the key and value spans point into, and each batch's records
    section in it. Spans must increase through that buffer: with a compressed batch in
    the answer, every section is copied into a new one in order and the body left out."""
    if not any(header[4] & CODEC_MASK != CODEC_NONE for _, _, header in batches):
        return body, batches
    view = memoryview(body)
    data = bytearray()
    sections: list[_Section] = []
    for section_start, section_end, header in batches:
        at = len(data)
        if header[4] & CODEC_MASK != CODEC_NONE:
            data += _decompressed(view[section_start:section_end], header[4])
        else:
            data += view[section_start:section_end]
        sections.append((at, len(data), header))
    return data, sections


def _decompressed(compressed: memoryview, attributes: int) -> bytes:
    codec = attributes & CODEC_MASK
    if codec != CODEC_ZSTD:
        raise ValueError(f"unknown codec {codec}")
    declared = zstandard.frame_content_size(compressed)
    if declared > UNCOMPRESSED_BYTES_MAX:
        raise ValueError(f"zstd frame declares {declared} bytes")
    section: bytes = zstandard.ZstdDecompressor().decompress(
        compressed, max_output_size=UNCOMPRESSED_BYTES_MAX
    )
    return section


def _walk_vectorised(
    columns: Columns,
    data: bytes | bytearray,
    sections: list[_Section],
    start_offset: int,
    end_offset: int,
) -> None:
    """Step 3, vectorised: one Python loop over the record-length chain only (one varint
    per record: where each record starts and ends), then every other field of every
    record of the answer in numpy, each varint in one pass per byte of its longest
    instance. The checks are the scalar walk's, over whole arrays: each field inside its
    record, lengths -1 (null) or more, nothing after a batch's last record. Raises
    NeedsScalarWalk where only the scalar walk reads exactly (a 10-byte varint, int64
    edges)."""
    buf = np.frombuffer(data, np.uint8)
    starts: list[I64] = []  # per record: its first byte (its length varint)
    walked: list[int] = []  # the same, of records walked one by one, not yet in starts
    counts = [
        record_chain(data, buf, start, end, h[11], starts, walked) for start, end, h in sections
    ]
    if walked:
        starts.append(np.array(walked, np.int64))
    section_end = np.repeat(np.array([end for _, end, _ in sections], np.int64), counts)
    length, fields_at = varints(buf, np.concatenate(starts) if starts else _NO_RECORDS, section_end)
    record_end = fields_at + length  # the chain checked each record against its section
    # Per batch, spread to its records: base offset, first timestamp, log-append time.
    base = np.repeat(np.array([h[0] for _, _, h in sections], np.int64), counts)
    log_append = np.repeat(
        np.array([bool(h[4] & TIMESTAMP_TYPE_BIT) for _, _, h in sections], np.bool_), counts
    )
    pos = fields_at + 1  # after the record attributes (unused)
    ts_delta, pos = varints(buf, pos, record_end)
    offset_delta, pos = varints(buf, pos, record_end)
    if np.any(offset_delta > INT64_MAX - base):  # base >= 0 (_checked_batches)
        raise NeedsScalarWalk
    offsets = base + offset_delta
    keep = (offsets >= start_offset) & (offsets < end_offset)
    batch_of = np.repeat(np.arange(len(sections)), counts)
    if not keep.all():
        offsets, pos, record_end = offsets[keep], pos[keep], record_end[keep]
        ts_delta, log_append, batch_of = ts_delta[keep], log_append[keep], batch_of[keep]
    key_len, pos = varints(buf, pos, record_end)
    key_start, key_valid, pos = _span(key_len, pos, "key")
    key_end = pos
    value_len, pos = varints(buf, pos, record_end)
    value_start, value_valid, pos = _span(value_len, pos, "value")
    if np.any(pos >= record_end):
        raise ValueError("record fields run past the record's length")
    if len(pos) and int(pos[-1]) > INT32_MAX:  # the largest bound: spans increase
        raise ValueError(f"the records of one answer pass {INT32_MAX} bytes")
    first_ms = np.array([h[6] for _, _, h in sections], np.int64)[batch_of]
    max_ms = np.array([h[7] for _, _, h in sections], np.int64)[batch_of]
    # ms to µs must fit int64, as the scalar walk's array("q") requires: screened in
    # float64 (exact to within a few ms at that size), the rare edge left to the scalar walk.
    approx_ms = np.where(log_append, max_ms, first_ms.astype(np.float64) + ts_delta)
    if len(approx_ms) and np.abs(approx_ms).max() > TIMESTAMP_MS_SAFE:
        raise NeedsScalarWalk
    timestamps_ms = np.where(log_append, max_ms, first_ms + ts_delta)
    headers: list[list[tuple[str, bytes]] | None] = []
    if columns.with_headers:
        headers = [
            _headers(data, p, e) for p, e in zip(pos.tolist(), record_end.tolist(), strict=True)
        ]
    columns.data = data
    columns.keys = _Spans(_interleaved(key_start, key_end), key_valid)
    columns.values = _Spans(_interleaved(value_start, pos), value_valid)
    columns.offsets = offsets
    columns.timestamps_us = timestamps_ms * US_PER_MS
    columns.timestamp_types = log_append.astype(np.int32)
    columns.headers = headers


def _span(length: I64, pos: I64, name: str) -> tuple[I64, npt.NDArray[np.bool_] | None, I64]:
    """A key or value of `length` bytes (-1: null) at pos: (its start, validity or None
    when none is null, the position after it)."""
    if np.any(length < -1):
        raise ValueError(f"{name} length {int(length[length < -1][0])}")
    nulls = length == -1
    if not nulls.any():
        return pos, None, pos + length
    return pos, ~nulls, pos + np.maximum(length, 0)


def _walk_scalar(
    columns: Columns,
    data: bytes | bytearray,
    sections: list[_Section],
    start_offset: int,
    end_offset: int,
) -> None:
    """Step 3, one record at a time: for answers of few records, where numpy's fixed cost
    per call would exceed the work, and for what _walk_vectorised leaves to it. One- and
    two-byte varints (nearly all of them) are decoded inline, and the key and value are
    not copied here (_Spans): this loop is one long function because a call per field per
    record would cost more than the field's decoding."""
    key_bounds, value_bounds = array("i"), array("i")
    key_nulls: list[int] = []
    value_nulls: list[int] = []
    offsets, timestamps, types = array("q"), array("q"), array("i")
    headers: list[list[tuple[str, bytes]] | None] = []
    with_headers = columns.with_headers
    buf = data
    for pos, end, header in sections:
        base_offset, attributes = header[0], header[4]
        first_ts, max_ts, record_count = header[6], header[7], header[11]
        log_append = 1 if attributes & TIMESTAMP_TYPE_BIT else 0
        for _ in range(record_count):
            b = buf[pos]
            if b < 0x80:
                length = (b >> 1) ^ -(b & 1)
                pos += 1
            elif buf[pos + 1] < 0x80:
                z = (b & 0x7F) | (buf[pos + 1] << 7)
                length = (z >> 1) ^ -(z & 1)
                pos += 2
            else:
                length, pos = get_varint(buf, pos)
            record_end = pos + length
            if length < 0 or record_end > end:
                raise ValueError("record length runs past the records section")
            b = buf[pos + 1]  # after the record attributes: the timestamp delta
            if b < 0x80:
                ts_delta = (b >> 1) ^ -(b & 1)
                pos += 2
            else:
                ts_delta, pos = get_varint(buf, pos + 1)
            b = buf[pos]
            if b < 0x80:
                offset = base_offset + ((b >> 1) ^ -(b & 1))
                pos += 1
            elif buf[pos + 1] < 0x80:
                z = (b & 0x7F) | (buf[pos + 1] << 7)
                offset = base_offset + ((z >> 1) ^ -(z & 1))
                pos += 2
            else:
                delta, pos = get_varint(buf, pos)
                offset = base_offset + delta
            if pos > record_end:
                raise ValueError("record fields run past the record's length")
            if offset < start_offset or offset >= end_offset:
                pos = record_end
                continue
            b = buf[pos]
            if b < 0x80:
                key_len = (b >> 1) ^ -(b & 1)
                pos += 1
            else:
                key_len, pos = get_varint(buf, pos)
            key_bounds.append(pos)
            if key_len >= 0:
                pos += key_len
            elif key_len == -1:
                key_nulls.append(len(offsets))
            else:
                raise ValueError(f"key length {key_len}")
            key_bounds.append(pos)
            b = buf[pos]
            if b < 0x80:
                value_len = (b >> 1) ^ -(b & 1)
                pos += 1
            elif buf[pos + 1] < 0x80:
                z = (b & 0x7F) | (buf[pos + 1] << 7)
                value_len = (z >> 1) ^ -(z & 1)
                pos += 2
            else:
                value_len, pos = get_varint(buf, pos)
            value_bounds.append(pos)
            if value_len >= 0:
                pos += value_len
            elif value_len == -1:
                value_nulls.append(len(offsets))
            else:
                raise ValueError(f"value length {value_len}")
            value_bounds.append(pos)
            if pos >= record_end:
                raise ValueError("record fields run past the record's length")
            if with_headers:
                headers.append(_headers(buf, pos, record_end))
            pos = record_end
            offsets.append(offset)
            timestamps.append((max_ts if log_append else first_ts + ts_delta) * US_PER_MS)
            types.append(log_append)
        if pos != end:
            raise ValueError("bytes left after the last record")
    n = len(offsets)
    columns.data = data
    columns.keys = _Spans(np.frombuffer(key_bounds, np.int32), _valid(n, key_nulls))
    columns.values = _Spans(np.frombuffer(value_bounds, np.int32), _valid(n, value_nulls))
    columns.offsets = np.frombuffer(offsets, np.int64)
    columns.timestamps_us = np.frombuffer(timestamps, np.int64)
    columns.timestamp_types = np.frombuffer(types, np.int32)
    columns.headers = headers


def _headers(
    section: bytes | bytearray, pos: int, record_end: int
) -> list[tuple[str, bytes]] | None:
    """A record's headers, which must end where the record does; None when it has none
    (as Spark's Kafka source)."""
    count, pos = get_varint(section, pos)
    if count < 0:
        raise ValueError(f"header count {count}")
    headers: list[tuple[str, bytes]] = []
    for _ in range(count):
        key_len, pos = get_varint(section, pos)
        if key_len < 0 or pos + key_len > record_end:
            raise ValueError(f"header key length {key_len}")
        key = bytes(section[pos : pos + key_len]).decode("utf-8")
        pos += key_len
        value_len, pos = get_varint(section, pos)
        if value_len < 0 or pos + value_len > record_end:
            raise ValueError(f"header value length {value_len}")
        headers.append((key, bytes(section[pos : pos + value_len])))
        pos += value_len
    if pos != record_end:
        raise ValueError("a record's headers do not end where the record does")
    return headers or None
