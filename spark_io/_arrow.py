"""Binary fetch answers (application/vnd.dmq.batches) straight into Arrow record batches.

The hot path of the Spark source. The client's `Consumer` decodes every record into a
Python object; here a fetch answer becomes columns without one object per record:

1. walk the stored batches (57-byte big-endian header, log/README.md "RecordBatch format"),
   check each batch's CRC-32C over everything after the CRC field, skip control batches;
2. decompress a zstd records section (bounded by UNCOMPRESSED_BYTES_MAX);
3. walk the records' varints, appending key and value bytes to one data buffer per column,
   their end positions to an int32 offsets buffer, and offset and timestamp to int64
   buffers; only the records in [start_offset, end_offset) are kept;
4. wrap the buffers as Arrow arrays (`pa.Array.from_buffers`, no copy) in the Spark schema.

spark_io/ may not import log/ (tests/test_layering.py: it is a client of the HTTP API),
so the format is read here a second time; tests/spark_io/test_arrow_decode.py checks it
against log.records with hypothesis.
"""

from __future__ import annotations

import struct
from array import array
from dataclasses import dataclass, field

import crc32c
import pyarrow as pa
import pyarrow.compute as pc
import zstandard

from dmq.errors import StorageError

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


def _varint(buf: bytes | memoryview, pos: int) -> tuple[int, int]:
    """A zigzag varint at pos: (value, next position)."""
    z = 0
    shift = 0
    while True:
        b = buf[pos]
        pos += 1
        z |= (b & 0x7F) << shift
        if b < 0x80:
            return (z >> 1) ^ -(z & 1), pos
        shift += 7
        if shift > 63:
            raise ValueError("varint longer than 10 bytes")


@dataclass(slots=True)
class _Spans:
    """A nullable binary column as spans of the answer's bytes, gathered in C at the end.

    `bounds` holds each element's start and end, interleaved: read as Arrow offsets over
    the data buffer, element 2i is record i's bytes and element 2i+1 the bytes between
    it and the next (varints, other fields); `pc.take` of the even elements then copies
    the records' bytes into a compact column. A null is an empty span listed in `nulls`.
    """

    bounds: array[int] = field(default_factory=lambda: array("i"))
    nulls: list[int] = field(default_factory=list)

    def to_arrow(self, data: pa.Buffer) -> pa.Array:
        n = len(self.bounds) // 2
        if n == 0:
            return pa.array([], pa.binary())
        spread = pa.Array.from_buffers(
            pa.binary(), 2 * n - 1, [None, pa.py_buffer(self.bounds), data]
        )
        packed = pc.take(spread, pa.array(array("i", range(0, 2 * n - 1, 2)), pa.int32()))
        if not self.nulls:
            return packed
        valid = [True] * n
        for i in self.nulls:
            valid[i] = False
        validity = pa.array(valid, pa.bool_()).buffers()[1]
        return pa.Array.from_buffers(
            pa.binary(), n, [validity, *packed.buffers()[1:]], null_count=len(self.nulls)
        )


@dataclass(slots=True)
class Columns:
    """The columns of one Arrow batch in the making: one fetch answer of one partition."""

    topic: str
    partition: int
    with_headers: bool
    # Keys and values are spans of one data buffer: the answer itself (body), or, when it
    # holds a compressed batch, `extra`: every records section, decompressed, in order.
    body: bytes = b""
    extra: bytearray = field(default_factory=bytearray)
    keys: _Spans = field(default_factory=_Spans)
    values: _Spans = field(default_factory=_Spans)
    offsets: array[int] = field(default_factory=lambda: array("q"))
    timestamps_us: array[int] = field(default_factory=lambda: array("q"))
    timestamp_types: array[int] = field(default_factory=lambda: array("i"))
    headers: list[list[tuple[str, bytes]] | None] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.offsets)

    def to_record_batch(self, schema: pa.Schema) -> pa.RecordBatch:
        """The batch in `schema` (the Spark schema's Arrow form, source.arrow_schema)."""
        n = len(self.offsets)
        data = pa.py_buffer(self.extra if self.extra else self.body)
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

    Raises StorageError naming the partition when a batch fails its framing or CRC check:
    such data is never handed to Spark.
    """
    if columns.body or len(columns):
        raise ValueError("decode_into fills a new Columns")
    try:
        batches, next_offset = _checked_batches(body, start_offset, end_offset, aborted)
        # Spans must increase through the data buffer: with a compressed batch in the
        # answer, every section is copied into `extra` in order and the body left out.
        copy = any(header[4] & CODEC_MASK != CODEC_NONE for _, _, header in batches)
        columns.body = b"" if copy else body
        view = memoryview(body)
        for section_start, section_end, header in batches:
            if header[4] & CODEC_MASK != CODEC_NONE:
                section = _decompressed(columns, view[section_start:section_end], header[4])
            elif copy:
                shift = len(columns.extra) - section_start
                columns.extra += view[section_start:section_end]
                section = _Section(body, section_start, section_end, shift)
            else:
                section = _Section(body, section_start, section_end, 0)
            _decode_records(columns, section, header, start_offset, end_offset)
    except (ValueError, IndexError, struct.error, UnicodeDecodeError, zstandard.ZstdError) as exc:
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


@dataclass(frozen=True, slots=True)
class _Section:
    """A records section: buf[start:end]; its bytes sit at buf position + shift in the
    column data (the body, or extra)."""

    buf: bytes
    start: int
    end: int
    shift: int


def _decompressed(columns: Columns, compressed: memoryview, attributes: int) -> _Section:
    codec = attributes & CODEC_MASK
    if codec != CODEC_ZSTD:
        raise ValueError(f"unknown codec {codec}")
    declared = zstandard.frame_content_size(compressed)
    if declared > UNCOMPRESSED_BYTES_MAX:
        raise ValueError(f"zstd frame declares {declared} bytes")
    section = zstandard.ZstdDecompressor().decompress(
        compressed, max_output_size=UNCOMPRESSED_BYTES_MAX
    )
    shift = len(columns.extra)
    columns.extra += section
    return _Section(section, 0, len(section), shift)


def _decode_records(
    columns: Columns,
    section: _Section,
    header: tuple[int, ...],
    start_offset: int,
    end_offset: int,
) -> None:
    """Step 3 of the module docstring for one batch: record spans, offsets, timestamps.
    One- and two-byte varints (nearly all of them) are decoded inline, and the key
    and value are not copied here (_Spans): this loop is the per-record cost of the
    source, which is why it is one long function (a call per field per record would cost
    more than the field's decoding)."""
    base_offset, attributes = header[0], header[4]
    first_ts, max_ts, record_count = header[6], header[7], header[11]
    log_append = 1 if attributes & TIMESTAMP_TYPE_BIT else 0
    key_bounds, value_bounds = columns.keys.bounds, columns.values.bounds
    offsets = columns.offsets
    timestamps, types, headers = columns.timestamps_us, columns.timestamp_types, columns.headers
    with_headers = columns.with_headers
    buf, pos, end, shift = section.buf, section.start, section.end, section.shift
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
            length, pos = _varint(buf, pos)
        record_end = pos + length
        if length < 0 or record_end > end:
            raise ValueError("record length runs past the records section")
        b = buf[pos + 1]  # after the record attributes: the timestamp delta
        if b < 0x80:
            ts_delta = (b >> 1) ^ -(b & 1)
            pos += 2
        else:
            ts_delta, pos = _varint(buf, pos + 1)
        b = buf[pos]
        if b < 0x80:
            offset = base_offset + ((b >> 1) ^ -(b & 1))
            pos += 1
        elif buf[pos + 1] < 0x80:
            z = (b & 0x7F) | (buf[pos + 1] << 7)
            offset = base_offset + ((z >> 1) ^ -(z & 1))
            pos += 2
        else:
            delta, pos = _varint(buf, pos)
            offset = base_offset + delta
        if offset < start_offset or offset >= end_offset:
            pos = record_end
            continue
        b = buf[pos]
        if b < 0x80:
            key_len = (b >> 1) ^ -(b & 1)
            pos += 1
        else:
            key_len, pos = _varint(buf, pos)
        key_bounds.append(pos + shift)
        if key_len >= 0:
            pos += key_len
        elif key_len == -1:
            columns.keys.nulls.append(len(offsets))
        else:
            raise ValueError(f"key length {key_len}")
        key_bounds.append(pos + shift)
        b = buf[pos]
        if b < 0x80:
            value_len = (b >> 1) ^ -(b & 1)
            pos += 1
        elif buf[pos + 1] < 0x80:
            z = (b & 0x7F) | (buf[pos + 1] << 7)
            value_len = (z >> 1) ^ -(z & 1)
            pos += 2
        else:
            value_len, pos = _varint(buf, pos)
        value_bounds.append(pos + shift)
        if value_len >= 0:
            pos += value_len
        elif value_len == -1:
            columns.values.nulls.append(len(offsets))
        else:
            raise ValueError(f"value length {value_len}")
        value_bounds.append(pos + shift)
        if pos >= record_end:
            raise ValueError("record fields run past the record's length")
        if with_headers:
            headers.append(_headers(buf, pos))
        pos = record_end
        offsets.append(offset)
        timestamps.append((max_ts if log_append else first_ts + ts_delta) * US_PER_MS)
        types.append(log_append)
    if pos != end:
        raise ValueError("bytes left after the last record")


def _headers(section: bytes, pos: int) -> list[tuple[str, bytes]] | None:
    """A record's headers; None when it has none (as Spark's Kafka source)."""
    count, pos = _varint(section, pos)
    if count == 0:
        return None
    headers: list[tuple[str, bytes]] = []
    for _ in range(count):
        key_len, pos = _varint(section, pos)
        key = bytes(section[pos : pos + key_len]).decode("utf-8")
        pos += key_len
        value_len, pos = _varint(section, pos)
        headers.append((key, bytes(section[pos : pos + value_len])))
        pos += value_len
    return headers
