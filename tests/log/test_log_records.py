"""Proves the RecordBatch format (log/records.py): what encode_batch writes, decode_batch reads
back exactly, and anything else is refused with a typed error, never a crash.

- Round trip: every batch hypothesis can build (keys and values None vs b"" vs bytes, headers
  with duplicate and non-ASCII keys, timestamps going backwards, codec none and zstd, producer
  fields, control/transactional flags, log-append time, explicit offset deltas with gaps)
  decodes to the same records at base_offset + delta, and concatenated batches walk apart
  with iter_batches. validate_batch accepts every producer-shaped (dense) batch.
- Golden bytes: one fixed batch encodes to bytes written out by hand in this file, with the
  57-byte header at the documented offsets and a CRC-32C (Castagnoli) over bytes 17..end.
- Limits: validate_batch accepts a batch exactly at each limit and refuses it one below with
  RecordTooLargeError naming `field` and `limit` (record, batch, records per batch, key,
  header count, header key bytes); a zstd section that inflates past uncompressed_bytes_max
  is refused whether or not its frame declares its size.
- Damage: a flipped CRC, every truncation, every single-bit flip outside base_offset (which
  the CRC does not cover, by design) and arbitrary bytes (also behind a correct header and
  CRC, so the record decoder itself is fuzzed) raise CorruptRecordError and nothing else;
  on all of them validate_batch (the produce path's own fast walk of the records) accepts
  exactly what decode_batch with the same limits can decode.
"""

from __future__ import annotations

import contextlib
import struct
from dataclasses import dataclass, replace

import crc32c as crc32c_lib
import pytest
import zstandard
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from log import (
    Codec,
    CorruptRecordError,
    Header,
    InvalidRecordError,
    Record,
    RecordLimits,
    RecordTooLargeError,
    TimestampType,
    decode_batch,
    encode_batch,
    iter_batches,
    validate_batch,
)
from log.crc import crc32c
from log.records import DEFAULT_LIMITS, HEADER_BYTES, read_header

PROPERTY = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])

# --------------------------------------------------------------------------- strategies

payloads = st.one_of(st.none(), st.just(b""), st.binary(min_size=1, max_size=24))
# A small alphabet makes duplicate header keys common; the rest is arbitrary text.
header_keys = st.one_of(st.sampled_from(["", "trace", "ключ", "键", "🔑"]), st.text(max_size=6))
headers = st.lists(st.builds(Header, header_keys, st.binary(max_size=8)), max_size=4).map(tuple)
# Wide enough for negative timestamps and deltas both ways, narrow enough that every delta
# between two timestamps fits the format's signed 64-bit varint.
timestamps = st.integers(min_value=-(2**62), max_value=2**62 - 1)
records_st = st.lists(
    st.builds(Record, key=payloads, value=payloads, headers=headers, timestamp_ms=timestamps),
    min_size=1,
    max_size=8,
)


@st.composite
def offset_deltas_for(draw: st.DrawFn, count: int) -> list[int] | None:
    if draw(st.booleans()):
        return None
    first = draw(st.integers(0, 1000))
    gaps = draw(st.lists(st.integers(1, 2**20), min_size=count - 1, max_size=count - 1))
    deltas = [first]
    for gap in gaps:
        deltas.append(deltas[-1] + gap)
    return deltas


@dataclass(frozen=True)
class BatchSpec:
    """Everything encode_batch takes, as hypothesis draws it."""

    records: list[Record]
    base_offset: int
    codec: Codec
    timestamp_type: TimestampType
    producer_id: int
    producer_epoch: int
    base_sequence: int
    is_transactional: bool
    is_control: bool
    offset_deltas: list[int] | None

    def encode(self) -> bytes:
        return encode_batch(
            self.records,
            base_offset=self.base_offset,
            codec=self.codec,
            timestamp_type=self.timestamp_type,
            producer_id=self.producer_id,
            producer_epoch=self.producer_epoch,
            base_sequence=self.base_sequence,
            is_transactional=self.is_transactional,
            is_control=self.is_control,
            offset_deltas=self.offset_deltas,
        )

    def expected_records(self) -> list[Record]:
        """As decoded: absolute offsets; with log-append time, every record at the max."""
        deltas = self.offset_deltas or list(range(len(self.records)))
        max_ts = max(r.timestamp_ms for r in self.records)
        log_append = self.timestamp_type == TimestampType.LOG_APPEND_TIME
        return [
            replace(
                r,
                offset=self.base_offset + d,
                timestamp_ms=max_ts if log_append else r.timestamp_ms,
            )
            for r, d in zip(self.records, deltas, strict=True)
        ]


@st.composite
def batch_specs(draw: st.DrawFn) -> BatchSpec:
    records = draw(records_st)
    return BatchSpec(
        records=records,
        base_offset=draw(st.integers(0, 2**62)),
        codec=draw(st.sampled_from(Codec)),
        timestamp_type=draw(st.sampled_from(TimestampType)),
        producer_id=draw(st.integers(-1, 2**63 - 1)),
        producer_epoch=draw(st.integers(-1, 2**15 - 1)),
        base_sequence=draw(st.integers(-1, 2**31 - 1)),
        is_transactional=draw(st.booleans()),
        is_control=draw(st.booleans()),
        offset_deltas=draw(offset_deltas_for(len(records))),
    )


dense_batches = st.builds(
    lambda records, codec: encode_batch(records, base_offset=0, codec=codec),
    records_st,
    st.sampled_from(Codec),
)


# --------------------------------------------------------------------------- round trip


@PROPERTY
@given(spec=batch_specs(), other=dense_batches)
def test_decode_returns_exactly_what_encode_was_given(spec: BatchSpec, other: bytes) -> None:
    batch = spec.encode()
    decoded = decode_batch(batch)

    assert decoded.records == spec.expected_records()
    h = decoded.header
    assert h.size_bytes == len(batch)
    assert h.base_offset == spec.base_offset
    assert h.record_count == len(spec.records)
    assert h.last_offset == decoded.records[-1].offset
    assert h.first_timestamp_ms == spec.records[0].timestamp_ms
    assert h.max_timestamp_ms == max(r.timestamp_ms for r in spec.records)
    assert (h.codec, h.timestamp_type) == (spec.codec, spec.timestamp_type)
    assert (h.producer_id, h.producer_epoch, h.base_sequence) == (
        spec.producer_id,
        spec.producer_epoch,
        spec.base_sequence,
    )
    assert (h.is_transactional, h.is_control) == (spec.is_transactional, spec.is_control)

    # Batches concatenated as in a segment or a fetch response walk apart again.
    walked = list(iter_batches(batch + other + batch))
    assert [pos for pos, _ in walked] == [0, len(batch), len(batch) + len(other)]
    assert [hdr for _, hdr in walked] == [h, read_header(other), h]

    if [r.offset - h.base_offset for r in decoded.records] == list(range(len(spec.records))):
        assert validate_batch(batch) == h
    else:
        with pytest.raises(CorruptRecordError) as refused:
            validate_batch(batch)  # a producer's batch has dense deltas; gaps are compaction's
        assert refused.value.field == "batch.last_offset_delta"


# --------------------------------------------------------------------------- golden bytes

GOLDEN_RECORDS = [
    Record(key=b"k", value=b"v1", headers=(Header("h", b"x"),), timestamp_ms=1000),
    Record(key=None, value=None, timestamp_ms=999),  # a tombstone, one ms earlier
]
GOLDEN = bytes.fromhex(
    "0000000000000005"  # @0  base_offset i64 = 5
    "00000042"  # @8  batch_length i32 = 66 (78 bytes minus the 12 of base_offset + length)
    "01"  # @12 magic i8 = 1
    "f9f1a171"  # @13 crc u32: CRC-32C of bytes 17..77
    "0000"  # @17 attributes i16: codec none, create time
    "00000001"  # @19 last_offset_delta i32 = 1
    "00000000000003e8"  # @23 first_timestamp i64 = 1000
    "00000000000003e8"  # @31 max_timestamp i64 = 1000
    "0000000000000007"  # @39 producer_id i64 = 7
    "0002"  # @47 producer_epoch i16 = 2
    "00000003"  # @49 base_sequence i32 = 3
    "00000002"  # @53 record_count i32 = 2
    # @57 records; every number is a zigzag varint (n -> 2n, -n -> 2n-1)
    "1a"  # length 13
    "00" "00" "00"  # attributes, timestamp delta 0, offset delta 0
    "02" "6b" "04" "7631"  # key b"k", value b"v1"
    "02" "02" "68" "02" "78"  # one header: key "h", value b"x"
    "0c"  # length 6
    "00" "01" "02"  # attributes, timestamp delta -1, offset delta 1
    "01" "01" "00"  # key null, value null, no headers
)  # fmt: skip


def test_encode_writes_the_documented_byte_layout() -> None:
    batch = encode_batch(
        GOLDEN_RECORDS, base_offset=5, producer_id=7, producer_epoch=2, base_sequence=3
    )
    assert batch.hex() == GOLDEN.hex()

    def field(offset: int, fmt: str) -> int:
        value: int = struct.unpack_from(">" + fmt, batch, offset)[0]
        return value

    assert HEADER_BYTES == 57
    assert field(0, "q") == 5
    assert field(8, "i") == len(batch) - 12
    assert field(12, "b") == 1
    assert field(13, "I") == crc32c_lib.crc32c(batch[17:])
    assert field(17, "h") == 0
    assert field(19, "i") == 1
    assert field(23, "q") == 1000
    assert field(31, "q") == 1000
    assert field(39, "q") == 7
    assert field(47, "h") == 2
    assert field(49, "i") == 3
    assert field(53, "i") == 2
    # The checksum is CRC-32C (Castagnoli): its standard check value, not zlib's CRC-32.
    assert crc32c(b"123456789") == 0xE3069283
    assert decode_batch(GOLDEN).records == [
        replace(GOLDEN_RECORDS[0], offset=5),
        replace(GOLDEN_RECORDS[1], offset=6),
    ]


# --------------------------------------------------------------------------- limits


SMALL_BATCH = encode_batch([Record(b"a", b"1"), Record(b"b", b"2"), Record(b"c", b"3")])
VALUE_BATCH = encode_batch([Record(None, b"x" * 40)])
KEY_BATCH = encode_batch([Record(b"k" * 30, b"v")])
HEADERS_BATCH = encode_batch(
    [Record(None, b"v", (Header("a", b""), Header("a", b""), Header("b", b"")))]
)
HEADER_KEY_BATCH = encode_batch([Record(None, b"v", (Header("ключ", b""),))])  # 4 chars, 8 bytes

LIMIT_CASES = [
    # (batch, RecordLimits field, the batch's size in that limit's unit, error field)
    # One record's bytes: the batch minus the header and the 1-byte record length varint.
    (VALUE_BATCH, "record_bytes_max", len(VALUE_BATCH) - HEADER_BYTES - 1, "records[0]"),
    (SMALL_BATCH, "batch_bytes_max", len(SMALL_BATCH), "batch"),
    (SMALL_BATCH, "records_per_batch_max", 3, "batch.record_count"),
    (KEY_BATCH, "key_bytes_max", 30, "records[0].key"),
    (HEADERS_BATCH, "header_count_max", 3, "records[0].headers"),
    (HEADER_KEY_BATCH, "header_key_bytes_max", 8, "records[0].headers.key"),
]


@pytest.mark.parametrize(("batch", "limit_name", "size", "error_field"), LIMIT_CASES)
def test_validate_accepts_a_batch_at_each_limit_and_refuses_it_one_below(
    batch: bytes, limit_name: str, size: int, error_field: str
) -> None:
    assert validate_batch(batch, RecordLimits(**{limit_name: size})).record_count >= 1
    with pytest.raises(RecordTooLargeError) as refused:
        validate_batch(batch, RecordLimits(**{limit_name: size - 1}))
    assert refused.value.field == error_field
    assert refused.value.limit == size - 1
    if limit_name not in ("batch_bytes_max", "records_per_batch_max"):  # validate's alone
        decode_batch(batch, record_limits=RecordLimits(**{limit_name: size}))
        with pytest.raises(RecordTooLargeError) as refused:
            decode_batch(batch, record_limits=RecordLimits(**{limit_name: size - 1}))
        assert refused.value.limit == size - 1


def _frame(section: bytes, *, codec: Codec, record_count: int) -> bytes:
    """A batch around a given records section, built field by field with a correct CRC."""
    body = (
        struct.pack(">h", int(codec))
        + struct.pack(">i", record_count - 1)
        + struct.pack(">qq", 0, 0)
        + struct.pack(">qhi", -1, -1, -1)
        + struct.pack(">i", record_count)
        + section
    )
    prefix = struct.pack(">qib", 0, len(body) + 5, 1)
    return prefix + struct.pack(">I", crc32c_lib.crc32c(body)) + body


@pytest.mark.parametrize("declares_size", [True, False], ids=["sized-frame", "unsized-frame"])
def test_zstd_section_that_inflates_past_the_limit_is_refused(declares_size: bool) -> None:
    records = [Record(None, b"\0" * 100_000), Record(None, b"\0" * 100_000)]
    plain_section = encode_batch(records)[HEADER_BYTES:]
    compressor = zstandard.ZstdCompressor(write_content_size=declares_size)
    batch = _frame(compressor.compress(plain_section), codec=Codec.ZSTD, record_count=2)
    assert len(batch) < 200  # a tiny batch that claims 200 kB once inflated

    exact = RecordLimits(uncompressed_bytes_max=len(plain_section))
    assert [r.value for r in decode_batch(batch, record_limits=exact).records] == [
        r.value for r in records
    ]
    assert validate_batch(batch, exact).record_count == 2

    too_small = RecordLimits(uncompressed_bytes_max=len(plain_section) - 1)
    with pytest.raises(CorruptRecordError) as refused:
        decode_batch(batch, record_limits=too_small)
    assert refused.value.limit == len(plain_section) - 1
    with pytest.raises(CorruptRecordError):
        validate_batch(batch, too_small)


# --------------------------------------------------------------------------- damage


def test_a_flipped_crc_or_payload_bit_is_refused_as_a_crc_mismatch() -> None:
    for position in (13, 16, len(GOLDEN) - 1):  # first and last CRC byte, last payload byte
        damaged = bytearray(GOLDEN)
        damaged[position] ^= 0x01
        for check in (decode_batch, validate_batch):
            with pytest.raises(CorruptRecordError) as refused:
                check(bytes(damaged))
            assert refused.value.field == "batch.crc"


def _only_corrupt_record_error(buf: bytes, *, verify: bool = True) -> None:
    """Decoding buf either succeeds or raises CorruptRecordError; nothing else escapes.

    validate_batch (the produce path's fast check) and decode_batch with the same limits
    (what consumers and compaction run) must agree: the broker must never accept a batch
    that it cannot decode later, nor refuse one it could.
    """
    with contextlib.suppress(CorruptRecordError):
        decode_batch(buf, verify=verify)
    with contextlib.suppress(CorruptRecordError):
        list(iter_batches(buf))
    try:
        validate_batch(buf)
        accepted = True
    except InvalidRecordError:  # validate may also name a limit (RecordTooLargeError)
        accepted = False
    try:
        decode_batch(buf, record_limits=DEFAULT_LIMITS)
        decodes = read_header(buf).last_offset_delta == read_header(buf).record_count - 1
        decodes = decodes and read_header(buf).size_bytes == len(buf)
    except InvalidRecordError:
        decodes = False
    assert accepted == decodes


@PROPERTY
@given(batch=dense_batches)
def test_every_truncation_of_a_batch_is_refused(batch: bytes) -> None:
    for cut in range(len(batch)):
        with pytest.raises(CorruptRecordError):
            decode_batch(batch[:cut])
        if cut:  # a whole batch then a cut one (an empty buffer holds no batch at all)
            with pytest.raises(CorruptRecordError):
                list(iter_batches(batch + batch[:cut]))


@PROPERTY
@given(batch=dense_batches, data=st.data())
def test_every_single_bit_flip_outside_base_offset_is_refused(
    batch: bytes, data: st.DataObject
) -> None:
    bit = data.draw(st.integers(0, len(batch) * 8 - 1), label="bit")
    damaged = bytearray(batch)
    damaged[bit // 8] ^= 0x80 >> (bit % 8)
    if bit >= 64:
        with pytest.raises(CorruptRecordError):
            decode_batch(bytes(damaged))
    else:
        # base_offset sits outside the CRC so the log can stamp offsets in place: a flip
        # there is either refused (negative offset) or reads as the same batch moved.
        try:
            moved = decode_batch(bytes(damaged))
        except CorruptRecordError:
            assert bit == 0  # only the sign bit makes the header invalid
        else:
            delta = read_header(damaged).base_offset
            assert [r.offset - delta for r in moved.records] == [
                r.offset for r in decode_batch(batch).records
            ]


@PROPERTY
@given(buf=st.binary(max_size=300))
def test_arbitrary_bytes_raise_only_corrupt_record_error(buf: bytes) -> None:
    _only_corrupt_record_error(buf)
    _only_corrupt_record_error(buf, verify=False)


@PROPERTY
@given(
    section=st.binary(max_size=200),
    codec=st.sampled_from(Codec),
    compress=st.booleans(),
    record_count=st.integers(1, 5),
)
def test_garbage_records_behind_a_valid_header_and_crc_raise_only_corrupt_record_error(
    section: bytes, codec: Codec, compress: bool, record_count: int
) -> None:
    # Past the CRC check the record decoder sees the garbage itself; wrapping it in a real
    # zstd frame also sends garbage through decompression into the decoder.
    if codec == Codec.ZSTD and compress:
        section = zstandard.ZstdCompressor().compress(section)
    _only_corrupt_record_error(_frame(section, codec=codec, record_count=record_count))


@PROPERTY
@given(batch=dense_batches, data=st.data())
def test_garbage_spliced_into_a_batch_with_a_fixed_crc_raises_only_corrupt_record_error(
    batch: bytes, data: st.DataObject
) -> None:
    # Overwrite some record bytes, then repair the CRC, so the damage reaches the decoder.
    damaged = bytearray(batch)
    start = data.draw(st.integers(HEADER_BYTES, len(batch) - 1), label="start")
    junk = data.draw(st.binary(min_size=1, max_size=len(batch) - start), label="junk")
    damaged[start : start + len(junk)] = junk
    struct.pack_into(">I", damaged, 13, crc32c_lib.crc32c(bytes(damaged[17:])))
    _only_corrupt_record_error(bytes(damaged))


# Enough records that offset deltas pass 63 (two-byte varints), values past 63 bytes, and
# timestamp deltas of every width both ways: the widths validate_batch reads inline (#22).
long_dense_batches = st.builds(
    lambda count, value, key, steps, codec: encode_batch(
        [
            Record(key=key, value=value, timestamp_ms=steps[i % len(steps)] * i)
            for i in range(count)
        ],
        codec=codec,
    ),
    st.integers(60, 140),
    st.one_of(st.none(), st.binary(min_size=0, max_size=200)),
    st.one_of(st.none(), st.binary(min_size=60, max_size=70)),
    st.lists(st.integers(-(2**40), 2**40), min_size=1, max_size=3),
    st.sampled_from(Codec),
)


@PROPERTY
@given(batch=long_dense_batches, data=st.data())
def test_long_batches_with_wide_varints_validate_as_they_decode(
    batch: bytes, data: st.DataObject
) -> None:
    assert validate_batch(batch).record_count == len(decode_batch(batch).records)
    damaged = bytearray(batch)
    start = data.draw(st.integers(HEADER_BYTES, len(batch) - 1), label="start")
    junk = data.draw(st.binary(min_size=1, max_size=3), label="junk")
    damaged[start : start + len(junk)] = junk
    struct.pack_into(">I", damaged, 13, crc32c_lib.crc32c(bytes(damaged[17:])))
    _only_corrupt_record_error(bytes(damaged))
