"""The RecordBatch format (version 1): encode, decode and validate.

A batch is the unit of append, replication, storage and fetch. Its byte layout is
documented field by field in log/README.md ("RecordBatch format"); in short, a
57-byte big-endian header followed by the records section, which is compressed as a
whole when the codec is not `none`. The CRC-32C covers everything after the CRC
field, so the first 17 bytes (base offset, length, magic, CRC) can be rewritten by
the log without touching the CRC: that is how `append` assigns offsets in place.

The broker never recompresses: a zstd batch built by a producer is stored and
served byte for byte as it arrived (end-to-end compression). Only compaction
rewrites records, and it keeps the batch's codec.
"""

from __future__ import annotations

import enum
import struct
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

import zstandard

from log import limits
from log.crc import crc32c
from log.errors import CorruptRecordError, InvalidOffsetError, RecordTooLargeError
from log.varint import get_varint, put_varint

MAGIC = 1  # format version; a reader refuses any other value

# base_offset, batch_length, magic, crc, attributes, last_offset_delta,
# first_timestamp_ms, max_timestamp_ms, producer_id, producer_epoch,
# base_sequence, record_count
_HEADER = struct.Struct(">qibIhiqqqhii")
HEADER_BYTES = _HEADER.size  # 57
LENGTH_PREFIX_BYTES = 12  # base_offset (8) + batch_length (4): not counted in batch_length
CRC_START = 17  # first byte covered by the CRC (attributes)
_CRC_FIELD = struct.Struct(">I")
_BASE_OFFSET = struct.Struct(">q")

NO_PRODUCER_ID = -1
NO_PRODUCER_EPOCH = -1
NO_SEQUENCE = -1

_CODEC_MASK = 0x07
_TIMESTAMP_TYPE_BIT = 0x08
_TRANSACTIONAL_BIT = 0x10
_CONTROL_BIT = 0x20
_KNOWN_ATTRIBUTE_BITS = _CODEC_MASK | _TIMESTAMP_TYPE_BIT | _TRANSACTIONAL_BIT | _CONTROL_BIT


class Codec(enum.IntEnum):
    """Compression of the records section (ids as Kafka's; others are refused)."""

    NONE = 0
    ZSTD = 4


class TimestampType(enum.IntEnum):
    CREATE_TIME = 0  # set by the producer
    LOG_APPEND_TIME = 1  # set by the broker at append; every record takes max_timestamp_ms


@dataclass(frozen=True, slots=True)
class Header:
    """A record header: a UTF-8 key and a byte value; order and duplicates are kept."""

    key: str
    value: bytes


@dataclass(frozen=True, slots=True)
class Record:
    """One record. `key=None` and `value=None` (a tombstone) differ from b"".

    When encoding, `offset` is ignored unless explicit offset deltas are asked for;
    a decoded record carries its absolute offset and timestamp.
    """

    key: bytes | None
    value: bytes | None
    headers: tuple[Header, ...] = ()
    timestamp_ms: int = 0
    offset: int = 0


@dataclass(frozen=True, slots=True)
class BatchHeader:
    base_offset: int
    batch_length: int
    magic: int
    crc: int
    attributes: int
    last_offset_delta: int
    first_timestamp_ms: int
    max_timestamp_ms: int
    producer_id: int
    producer_epoch: int
    base_sequence: int
    record_count: int

    @property
    def size_bytes(self) -> int:
        """Bytes the whole batch occupies on disk and on the wire."""
        return self.batch_length + LENGTH_PREFIX_BYTES

    @property
    def last_offset(self) -> int:
        return self.base_offset + self.last_offset_delta

    @property
    def next_offset(self) -> int:
        return self.base_offset + self.last_offset_delta + 1

    @property
    def codec(self) -> Codec:
        return Codec(self.attributes & _CODEC_MASK)

    @property
    def timestamp_type(self) -> TimestampType:
        return TimestampType(1 if self.attributes & _TIMESTAMP_TYPE_BIT else 0)

    @property
    def is_transactional(self) -> bool:
        return bool(self.attributes & _TRANSACTIONAL_BIT)

    @property
    def is_control(self) -> bool:
        return bool(self.attributes & _CONTROL_BIT)


@dataclass(frozen=True, slots=True)
class RecordLimits:
    """Per-record and per-batch bounds checked by `validate_batch` at the edge."""

    record_bytes_max: int = limits.RECORD_BYTES_MAX
    batch_bytes_max: int = limits.BATCH_BYTES_MAX
    records_per_batch_max: int = limits.RECORDS_PER_BATCH_MAX
    key_bytes_max: int = limits.KEY_BYTES_MAX
    header_count_max: int = limits.HEADER_COUNT_MAX
    header_key_bytes_max: int = limits.HEADER_KEY_BYTES_MAX
    uncompressed_bytes_max: int = limits.BATCH_UNCOMPRESSED_BYTES_MAX


DEFAULT_LIMITS = RecordLimits()


@dataclass(frozen=True, slots=True)
class DecodedBatch:
    header: BatchHeader
    records: list[Record] = field(default_factory=list)


# validate_batch walks the records of a batch of this many or more in numpy arrays
# (log/record_walk.py), fewer one at a time (`_check_records`): the arrays cost ~40-60
# numpy calls of a few us each whatever the count, the scalar walk ~1-1.5 us a record.
# Measured (bench/README.md, "Third slice"): the two cross between 200 and 380 records
# (1 KiB, 100 B with a key, sizes varying 50-500 B), so a cluster_bench batch (128)
# stays scalar and a broker_bench one (1000) is 4-6x cheaper.
VECTORISED_RECORDS_MIN = 384

# --------------------------------------------------------------------------- varints


def _get_zigzag(buf: bytes | memoryview, pos: int) -> tuple[int, int]:
    """Read a varint at pos without undoing the zigzag: (z, next position), z >> 1 is the
    magnitude and z & 1 the sign. `get_varint`'s read, zigzagged back (exact for every
    value): only the rare varints of 3 bytes or more come here."""
    value, pos = get_varint(buf, pos)
    return (value << 1 if value >= 0 else -(value << 1) - 1), pos


def _put_bytes(out: bytearray, data: bytes | None) -> None:
    if data is None:
        put_varint(out, -1)
    else:
        put_varint(out, len(data))
        out += data


# --------------------------------------------------------------------------- encode


def _encode_records(
    records: Sequence[Record], first_timestamp_ms: int, offset_deltas: Sequence[int]
) -> bytes:
    out = bytearray()
    body = bytearray()
    for record, delta in zip(records, offset_deltas, strict=True):
        body.clear()
        body.append(0)  # record attributes: unused, always 0
        put_varint(body, record.timestamp_ms - first_timestamp_ms)
        put_varint(body, delta)
        _put_bytes(body, record.key)
        _put_bytes(body, record.value)
        put_varint(body, len(record.headers))
        for header in record.headers:
            _put_bytes(body, header.key.encode("utf-8"))
            _put_bytes(body, header.value)
        put_varint(out, len(body))
        out += body
    return bytes(out)


def encode_batch(
    records: Sequence[Record],
    *,
    base_offset: int = 0,
    codec: Codec = Codec.NONE,
    timestamp_type: TimestampType = TimestampType.CREATE_TIME,
    producer_id: int = NO_PRODUCER_ID,
    producer_epoch: int = NO_PRODUCER_EPOCH,
    base_sequence: int = NO_SEQUENCE,
    is_transactional: bool = False,
    is_control: bool = False,
    offset_deltas: Sequence[int] | None = None,
    last_offset_delta: int | None = None,
    zstd_level: int = 3,
) -> bytes:
    """Build one batch. Offsets are dense (0, 1, 2...) unless `offset_deltas` is given
    (compaction keeps the original offsets, so its batches have gaps). The header's
    last_offset_delta is the last record's unless `last_offset_delta` (≥ it) is given:
    compaction keeps a thinned batch's original end, as Kafka's v2 batches do."""
    if not records:
        raise InvalidOffsetError("a batch holds at least one record", field="records")
    deltas = list(range(len(records))) if offset_deltas is None else list(offset_deltas)
    if any(b <= a for a, b in zip(deltas, deltas[1:], strict=False)) or deltas[0] < 0:
        raise InvalidOffsetError("offset deltas must increase from 0 or more", field="records")
    end_delta = deltas[-1] if last_offset_delta is None else last_offset_delta
    if end_delta < deltas[-1]:
        raise InvalidOffsetError(
            f"last_offset_delta {end_delta} is below the last record's delta {deltas[-1]}",
            field="last_offset_delta",
        )
    first_timestamp_ms = records[0].timestamp_ms
    max_timestamp_ms = max(r.timestamp_ms for r in records)
    section = _encode_records(records, first_timestamp_ms, deltas)
    if codec == Codec.ZSTD:
        section = zstandard.ZstdCompressor(level=zstd_level).compress(section)
    elif codec != Codec.NONE:
        raise CorruptRecordError(f"unknown codec {codec}", field="attributes.codec")
    attributes = int(codec) | (_TIMESTAMP_TYPE_BIT if timestamp_type else 0)
    attributes |= (_TRANSACTIONAL_BIT if is_transactional else 0) | (
        _CONTROL_BIT if is_control else 0
    )
    header = bytearray(
        _HEADER.pack(
            base_offset,
            HEADER_BYTES - LENGTH_PREFIX_BYTES + len(section),
            MAGIC,
            0,
            attributes,
            end_delta,
            first_timestamp_ms,
            max_timestamp_ms,
            producer_id,
            producer_epoch,
            base_sequence,
            len(records),
        )
    )
    crc = crc32c(bytes(header[CRC_START:]))
    crc = crc32c(section, crc)
    _CRC_FIELD.pack_into(header, 13, crc)
    return bytes(header) + section


# --------------------------------------------------------------------------- decode


def read_header(buf: bytes | bytearray | memoryview, pos: int = 0) -> BatchHeader:
    """Parse and structurally check the header at pos (no CRC check).

    Raises CorruptRecordError if the framing is impossible: unknown magic, a length
    too small to hold the header, negative counts, unknown attribute bits.
    """
    if len(buf) - pos < HEADER_BYTES:
        raise CorruptRecordError(
            f"batch header needs {HEADER_BYTES} bytes, {len(buf) - pos} available",
            field="batch",
        )
    header = BatchHeader(*_HEADER.unpack_from(buf, pos))
    check_header(header)
    return header


def check_header(header: BatchHeader) -> None:
    """Structural checks that need no record bytes."""
    if header.magic > MAGIC:  # not corrupt: written by a newer dmq (dmq/data_formats.py)
        raise CorruptRecordError(
            f"batch format {header.magic} was written by a dmq newer than this one; this dmq "
            f"reads formats up to {MAGIC}: upgrade this broker to the release that wrote it, "
            f"or restore the data directory from a copy taken before that release first "
            f"started on it",
            field="batch.magic",
        )
    if header.magic != MAGIC:
        raise CorruptRecordError(f"unknown batch magic {header.magic}", field="batch.magic")
    if header.batch_length < HEADER_BYTES - LENGTH_PREFIX_BYTES:
        raise CorruptRecordError(
            f"batch_length {header.batch_length} is shorter than the header",
            field="batch.batch_length",
        )
    if header.attributes & ~_KNOWN_ATTRIBUTE_BITS or header.attributes & _CODEC_MASK not in (
        Codec.NONE,
        Codec.ZSTD,
    ):
        raise CorruptRecordError(
            f"unknown batch attributes {header.attributes:#x}", field="batch.attributes"
        )
    if header.record_count < 1 or header.last_offset_delta < header.record_count - 1:
        raise CorruptRecordError(
            f"record_count {header.record_count} does not fit last_offset_delta "
            f"{header.last_offset_delta}",
            field="batch.record_count",
        )
    if header.base_offset < 0:
        raise CorruptRecordError("negative base_offset", field="batch.base_offset")


def header_fields_after_base_offset(header: BatchHeader) -> tuple[int, ...]:
    """Every header field but base_offset, in order: BatchHeader(new_base, *these)."""
    return (
        header.batch_length,
        header.magic,
        header.crc,
        header.attributes,
        header.last_offset_delta,
        header.first_timestamp_ms,
        header.max_timestamp_ms,
        header.producer_id,
        header.producer_epoch,
        header.base_sequence,
        header.record_count,
    )


def compute_crc(batch: bytes | bytearray | memoryview) -> int:
    return crc32c(memoryview(batch)[CRC_START:])


def verify_crc(batch: bytes | bytearray | memoryview, header: BatchHeader) -> bool:
    return compute_crc(batch) == header.crc


def with_base_offset(batch: bytes | bytearray, base_offset: int) -> bytes:
    """The same batch with another base offset; the CRC does not cover it."""
    return _BASE_OFFSET.pack(base_offset) + bytes(memoryview(batch)[8:])


def _records_section(
    batch: bytes | bytearray | memoryview, header: BatchHeader, uncompressed_bytes_max: int
) -> bytes | memoryview:
    section = memoryview(batch)[HEADER_BYTES : header.size_bytes]
    if header.codec == Codec.NONE:
        return section
    try:
        # decompress() trusts a content size written in the frame header (allocating
        # that much) and ignores max_output_size then, so a declared size is checked
        # here; max_output_size bounds frames that do not declare one.
        declared_bytes = zstandard.frame_content_size(section)
        if declared_bytes > uncompressed_bytes_max:
            raise zstandard.ZstdError(f"the frame declares {declared_bytes} bytes")
        return zstandard.ZstdDecompressor().decompress(
            section, max_output_size=uncompressed_bytes_max
        )
    except zstandard.ZstdError as exc:
        raise CorruptRecordError(
            f"zstd records section does not decompress within "
            f"{uncompressed_bytes_max} bytes: {exc}",
            field="batch.records",
            limit=uncompressed_bytes_max,
        ) from exc


def _decode_records(
    section: bytes | memoryview, header: BatchHeader, limits_: RecordLimits | None
) -> list[Record]:
    """Decode all records; with limits, also enforce the per-record limits."""
    records: list[Record] = []
    pos = 0
    end = len(section)
    base = header.base_offset
    first_ts = header.first_timestamp_ms
    log_append = header.timestamp_type == TimestampType.LOG_APPEND_TIME
    previous_delta = -1
    for i in range(header.record_count):
        length, pos = get_varint(section, pos)
        if length < 0 or pos + length > end:
            raise ValueError("record length runs past the records section")
        if limits_ is not None and length > limits_.record_bytes_max:
            raise RecordTooLargeError(
                f"record of {length} bytes exceeds record_bytes_max {limits_.record_bytes_max}",
                field=f"records[{i}]",
                limit=limits_.record_bytes_max,
            )
        record_end = pos + length
        pos += 1  # record attributes
        ts_delta, pos = get_varint(section, pos)
        offset_delta, pos = get_varint(section, pos)
        if offset_delta <= previous_delta:
            raise ValueError("offset deltas do not increase")
        previous_delta = offset_delta
        key_len, pos = get_varint(section, pos)
        if key_len >= 0:
            key: bytes | None = bytes(section[pos : pos + key_len])
            pos += key_len
            if limits_ is not None and key_len > limits_.key_bytes_max:
                raise RecordTooLargeError(
                    f"key of {key_len} bytes exceeds key_bytes_max {limits_.key_bytes_max}",
                    field=f"records[{i}].key",
                    limit=limits_.key_bytes_max,
                )
        elif key_len == -1:
            key = None
        else:
            raise ValueError("negative key length")
        value_len, pos = get_varint(section, pos)
        if value_len >= 0:
            value: bytes | None = bytes(section[pos : pos + value_len])
            pos += value_len
        elif value_len == -1:
            value = None
        else:
            raise ValueError("negative value length")
        header_count, pos = get_varint(section, pos)
        if header_count < 0:
            raise ValueError("negative header count")
        if limits_ is not None and header_count > limits_.header_count_max:
            raise RecordTooLargeError(
                f"{header_count} headers exceed header_count_max {limits_.header_count_max}",
                field=f"records[{i}].headers",
                limit=limits_.header_count_max,
            )
        headers: list[Header] = []
        for _ in range(header_count):
            hk_len, pos = get_varint(section, pos)
            if hk_len < 0 or pos + hk_len > record_end:
                raise ValueError("bad header key length")
            if limits_ is not None and hk_len > limits_.header_key_bytes_max:
                raise RecordTooLargeError(
                    f"header key of {hk_len} bytes exceeds header_key_bytes_max "
                    f"{limits_.header_key_bytes_max}",
                    field=f"records[{i}].headers.key",
                    limit=limits_.header_key_bytes_max,
                )
            hkey = bytes(section[pos : pos + hk_len]).decode("utf-8")
            pos += hk_len
            hv_len, pos = get_varint(section, pos)
            if hv_len < 0:
                raise ValueError("bad header value length")
            headers.append(Header(hkey, bytes(section[pos : pos + hv_len])))
            pos += hv_len
        if pos != record_end:
            raise ValueError("record fields do not add up to its length")
        records.append(
            Record(
                key=key,
                value=value,
                headers=tuple(headers),
                timestamp_ms=header.max_timestamp_ms if log_append else first_ts + ts_delta,
                offset=base + offset_delta,
            )
        )
    if pos != end:
        raise ValueError("bytes left after the last record")
    # Below it only in a batch compaction thinned (it keeps the batch's end offset).
    if previous_delta > header.last_offset_delta:
        raise ValueError("last record's offset delta exceeds last_offset_delta")
    return records


def _check_records(section: bytes, header: BatchHeader, lim: RecordLimits, start: int = 0) -> None:
    """Walk every record's framing and enforce the per-record limits without building
    objects: the same checks as _decode_records, several times faster, for the
    produce path where the broker only needs to know the batch is well formed.

    The caller has checked last_offset_delta == record_count - 1, so the offset deltas,
    strictly increasing from 0 or more and ending there, are exactly 0..record_count-1:
    each record's delta is compared with its index (as a zigzag value, 2 * index).
    Varints of one or two bytes (almost all of them) are read inline, as zigzag values
    where only the sign or the magnitude matters, without a call; that and building no
    objects is what makes this fast (#22). `get_varint` handles the rest.
    The records run from `start` to the end of `section` (a whole uncompressed batch is
    walked in place, from HEADER_BYTES, rather than copied).
    """
    pos = start
    end = len(section)
    record_max = lim.record_bytes_max
    key_max = lim.key_bytes_max
    expected_delta = 0  # zigzag of the record's index: 2 * i
    for i in range(header.record_count):
        # length (zigzag varint z; the length is z >> 1, negative when z is odd)
        b = section[pos]
        if b < 0x80:
            z = b
            pos += 1
        else:
            c = section[pos + 1]
            if c < 0x80:
                z = (b & 0x7F) | (c << 7)
                pos += 2
            else:
                z, pos = _get_zigzag(section, pos)
        record_end = pos + (z >> 1)
        if z & 1 or record_end > end:
            raise ValueError("record length runs past the records section")
        if z >> 1 > record_max:
            raise RecordTooLargeError(
                f"record {i} is {z >> 1} bytes; record_bytes_max is {record_max}",
                field=f"records[{i}]",
                limit=record_max,
            )
        # attributes (1 byte), then the timestamp delta (any value: skipped)
        if section[pos + 1] < 0x80:
            pos += 2
        elif section[pos + 2] < 0x80:
            pos += 3
        else:
            _, pos = get_varint(section, pos + 1)
        # offset delta: dense, so exactly the index
        b = section[pos]
        if b < 0x80:
            z = b
            pos += 1
        else:
            c = section[pos + 1]
            if c < 0x80:
                z = (b & 0x7F) | (c << 7)
                pos += 2
            else:
                z, pos = _get_zigzag(section, pos)
        if z != expected_delta:
            raise ValueError("offset deltas are not 0..record_count-1")
        expected_delta += 2
        # key length: -1 (z == 1) is a null key
        b = section[pos]
        if b < 0x80:
            z = b
            pos += 1
        else:
            c = section[pos + 1]
            if c < 0x80:
                z = (b & 0x7F) | (c << 7)
                pos += 2
            else:
                z, pos = _get_zigzag(section, pos)
        if z > 1:
            if z & 1:
                raise ValueError("negative key length")
            if z >> 1 > key_max:
                raise RecordTooLargeError(
                    f"record {i} key is {z >> 1} bytes; key_bytes_max is {key_max}",
                    field=f"records[{i}].key",
                    limit=key_max,
                )
            pos += z >> 1
        # value length: -1 (z == 1) is a tombstone
        b = section[pos]
        if b < 0x80:
            z = b
            pos += 1
        else:
            c = section[pos + 1]
            if c < 0x80:
                z = (b & 0x7F) | (c << 7)
                pos += 2
            else:
                z, pos = _get_zigzag(section, pos)
        if z > 1:
            if z & 1:
                raise ValueError("negative value length")
            pos += z >> 1
        if section[pos] == 0:  # no headers: the common case
            if pos + 1 != record_end:
                raise ValueError("record fields do not add up to its length")
            pos = record_end
            continue
        pos = _check_headers(section, pos, record_end, i, lim)
        if pos != record_end:
            raise ValueError("record fields do not add up to its length")
    if pos != end:
        raise ValueError("bytes left after the last record")


def _check_headers(section: bytes, pos: int, record_end: int, i: int, lim: RecordLimits) -> int:
    """Record i's header count at pos and its headers: counts, lengths, limits, UTF-8
    keys; return the position after them (the caller checks it is record_end). Shared by
    the scalar walk and the vectorised one (log/record_walk.py)."""
    header_count, pos = get_varint(section, pos)
    if header_count < 0:
        raise ValueError("negative header count")
    headers_max = lim.header_count_max
    if header_count > headers_max:
        raise RecordTooLargeError(
            f"record {i} has {header_count} headers; header_count_max is {headers_max}",
            field=f"records[{i}].headers",
            limit=headers_max,
        )
    header_key_max = lim.header_key_bytes_max
    for _ in range(header_count):
        hk_len, pos = get_varint(section, pos)
        if hk_len < 0 or pos + hk_len > record_end:
            raise ValueError("bad header key length")
        if hk_len > header_key_max:
            raise RecordTooLargeError(
                f"record {i} header key is {hk_len} bytes; header_key_bytes_max is "
                f"{header_key_max}",
                field=f"records[{i}].headers.key",
                limit=header_key_max,
            )
        section[pos : pos + hk_len].decode("utf-8")
        pos += hk_len
        hv_len, pos = get_varint(section, pos)
        if hv_len < 0:
            raise ValueError("bad header value length")
        pos += hv_len
    return pos


def decode_batch(
    batch: bytes | bytearray | memoryview,
    *,
    verify: bool = True,
    record_limits: RecordLimits | None = None,
) -> DecodedBatch:
    """Decode one whole batch (exactly its bytes, or a buffer starting with it).

    With `verify`, checks the CRC first; with `record_limits`, enforces them too.
    Raises CorruptRecordError (naming what is wrong) on any inconsistency.
    """
    header = read_header(batch)
    if len(batch) < header.size_bytes:
        raise CorruptRecordError(
            f"batch of {header.size_bytes} bytes is cut at {len(batch)}", field="batch"
        )
    view = memoryview(batch)[: header.size_bytes]
    if verify and not verify_crc(view, header):
        raise CorruptRecordError("batch CRC-32C does not match its contents", field="batch.crc")
    uncompressed_max = (
        record_limits.uncompressed_bytes_max
        if record_limits is not None
        else limits.BATCH_UNCOMPRESSED_BYTES_MAX
    )
    section = _records_section(view, header, uncompressed_max)
    try:
        records = _decode_records(section, header, record_limits)
    except (ValueError, IndexError, UnicodeDecodeError) as exc:
        raise CorruptRecordError(
            f"malformed records section: {exc}", field="batch.records"
        ) from exc
    return DecodedBatch(header, records)


def iter_batches(buf: bytes | bytearray | memoryview) -> Iterator[tuple[int, BatchHeader]]:
    """Walk concatenated batches (a raw fetch response); yields (position, header).

    Stops at the end of the buffer; a batch cut by the end raises CorruptRecordError.
    """
    pos = 0
    end = len(buf)
    while pos < end:
        header = read_header(buf, pos)
        if pos + header.size_bytes > end:
            raise CorruptRecordError(
                f"batch at position {pos} is cut by the end of the buffer", field="batch"
            )
        yield pos, header
        pos += header.size_bytes


def _records_are_valid(section: bytes, start: int, record_count: int, lim: RecordLimits) -> bool:
    """log/record_walk.py's vectorised check: True only if `_check_records` would accept.
    Imported at the first batch that needs it, so that importing log (as every client
    does) does not import numpy."""
    from log.record_walk import records_are_valid

    return records_are_valid(
        section,
        start,
        record_count,
        lim.record_bytes_max,
        lim.key_bytes_max,
        lambda pos, record_end, i: _check_headers(section, pos, record_end, i, lim),
    )


def validate_batch(
    batch: bytes | bytearray | memoryview, record_limits: RecordLimits = DEFAULT_LIMITS
) -> BatchHeader:
    """Full check of a batch that arrives from a producer, before it is proposed.

    Exactly one batch, within the byte and count limits, CRC correct, dense offset
    deltas from 0 (the log assigns offsets; a producer's batch has no gaps), every
    record within its limits. Returns the header.
    """
    if len(batch) > record_limits.batch_bytes_max:
        raise RecordTooLargeError(
            f"batch of {len(batch)} bytes exceeds batch_bytes_max {record_limits.batch_bytes_max}",
            field="batch",
            limit=record_limits.batch_bytes_max,
        )
    header = read_header(batch)
    if header.size_bytes != len(batch):
        raise CorruptRecordError(
            f"batch_length says {header.size_bytes} bytes, body has {len(batch)}",
            field="batch.batch_length",
        )
    if header.record_count > record_limits.records_per_batch_max:
        raise RecordTooLargeError(
            f"{header.record_count} records exceed records_per_batch_max "
            f"{record_limits.records_per_batch_max}",
            field="batch.record_count",
            limit=record_limits.records_per_batch_max,
        )
    if header.last_offset_delta != header.record_count - 1:
        raise CorruptRecordError(
            "a produced batch must have dense offset deltas 0..record_count-1",
            field="batch.last_offset_delta",
        )
    if not verify_crc(batch, header):
        raise CorruptRecordError("batch CRC-32C does not match its contents", field="batch.crc")
    # An uncompressed batch is walked in place: its records section is the rest of it (the
    # length was checked above), and a copy of it cost as much as the CRC (#22).
    data: bytes
    if header.codec == Codec.NONE and isinstance(batch, bytes):
        data, start = batch, HEADER_BYTES
    else:
        data = bytes(_records_section(batch, header, record_limits.uncompressed_bytes_max))
        start = 0
    try:
        if header.record_count < VECTORISED_RECORDS_MIN or not _records_are_valid(
            data, start, header.record_count, record_limits
        ):
            _check_records(data, header, record_limits, start)
    except (ValueError, IndexError, UnicodeDecodeError) as exc:
        raise CorruptRecordError(
            f"malformed records section: {exc}", field="batch.records"
        ) from exc
    return header
