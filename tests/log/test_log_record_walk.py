"""Proves that validate_batch's vectorised walk (log/record_walk.py, batches of
VECTORISED_RECORDS_MIN records or more) changes nothing but its cost (#22):

- validate_batch walks a batch in arrays from VECTORISED_RECORDS_MIN records, and below
  that one record at a time;

- on every batch, valid or damaged, validate_batch gives exactly what the scalar walk alone
  (`_check_records`, VECTORISED_RECORDS_MIN patched out of reach) gives: the same header,
  or the same error class, message, `field` and `limit`. Batches of 1 to 300 records, on
  both sides of the threshold, with null, empty and long keys and values, headers,
  timestamp deltas of every varint width up to 10 bytes, uncompressed and zstd; damaged by
  byte flips and splices in the records section, cut records sections, a changed record
  count, all with a correct CRC so the damage reaches the walk; and limits drawn around the
  batch's own sizes;
- a producer's batch (varints of at most 9 bytes) is accepted by the arrays themselves,
  never left to the scalar walk, so the broker's produce path takes the fast way.
"""

from __future__ import annotations

import struct
from unittest import mock

import crc32c
import zstandard
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from log import records
from log.errors import InvalidRecordError
from log.record_walk import records_are_valid
from log.records import (
    CRC_START,
    HEADER_BYTES,
    Codec,
    Header,
    Record,
    RecordLimits,
    encode_batch,
    read_header,
    validate_batch,
)
from log.varint import get_varint, put_varint

PROPERTY = settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
# The arrays are tried from this many records here, well under VECTORISED_RECORDS_MIN (a
# threshold of cost, not of correctness), so that the examples stay small and fast.
THRESHOLD = 32

payloads = st.one_of(st.none(), st.just(b""), st.binary(min_size=1, max_size=150))
header_lists = st.one_of(
    st.just(()),  # most records: the no-header fast path
    st.lists(
        st.builds(Header, st.sampled_from(["", "trace", "ключ", "🔑"]), st.binary(max_size=6)),
        max_size=3,
    ).map(tuple),
)


@st.composite
def batch_records(draw: st.DrawFn, wide: bool, smallest: int = 1) -> list[Record]:
    """smallest to 300 records, often on both sides of the threshold; timestamps that make
    deltas of one to nine varint bytes, or (wide) up to ten."""
    count = draw(st.one_of(st.integers(smallest, THRESHOLD + 8), st.integers(THRESHOLD, 300)))
    bound = 2**62 - 1 if wide else 2**40
    steps = draw(st.lists(st.integers(-bound, bound), min_size=1, max_size=3))
    key = draw(payloads)  # one key for many records: runs of one size, broken by deltas
    template = draw(st.lists(st.tuples(payloads, header_lists), min_size=1, max_size=4))
    return [
        Record(
            key=key if i % 3 else template[i % len(template)][0],
            value=template[i % len(template)][0],
            headers=template[i % len(template)][1],
            timestamp_ms=steps[i % len(steps)] * (1 if wide else i),
        )
        for i in range(count)
    ]


def _reframed(batch: bytes, section: bytes, record_count: int | None = None) -> bytes:
    """batch's header around another (plain) records section, compressed again if the
    batch is, with the length, the count and the CRC made to fit."""
    header = bytearray(batch[:HEADER_BYTES])
    if read_header(batch).codec == Codec.ZSTD:
        section = zstandard.ZstdCompressor().compress(section)
    struct.pack_into(">i", header, 8, HEADER_BYTES - 12 + len(section))
    if record_count is not None:
        struct.pack_into(">i", header, 19, record_count - 1)  # last_offset_delta
        struct.pack_into(">i", header, 53, record_count)
    body = bytes(header) + section
    return body[:13] + struct.pack(">I", crc32c.crc32c(body[CRC_START:])) + body[17:]


def _plain_section(batch: bytes) -> bytes:
    section = batch[HEADER_BYTES:]
    if read_header(batch).codec == Codec.ZSTD:
        return zstandard.ZstdDecompressor().decompress(section)
    return section


def _outcome(batch: bytes, limits: RecordLimits) -> object:
    try:
        return validate_batch(batch, limits)
    except InvalidRecordError as exc:
        return (type(exc), str(exc), exc.field, exc.limit)


def _same_as_the_scalar_walk(batch: bytes, limits: RecordLimits = records.DEFAULT_LIMITS) -> None:
    with mock.patch.object(records, "VECTORISED_RECORDS_MIN", 2**62):
        expected = _outcome(batch, limits)
    with mock.patch.object(records, "VECTORISED_RECORDS_MIN", THRESHOLD):
        assert _outcome(batch, limits) == expected


FIELDS = 6  # varints of a record: length, timestamp and offset deltas, key, value, headers


def _fields(section: bytes) -> list[list[tuple[int, int]]]:
    """Each record's varint fields as (start, end) spans: length, timestamp delta, offset
    delta, key length, value length, header count (read as the format says)."""
    spans: list[list[tuple[int, int]]] = []
    pos = 0
    while pos < len(section):
        length, after = get_varint(section, pos)
        record_end = after + length
        fields = [(pos, after)]
        pos = after + 1  # the attributes
        for skip_payload in (False, False, True, True, False):
            value, after = get_varint(section, pos)
            fields.append((pos, after))
            pos = after + (max(value, 0) if skip_payload else 0)
        spans.append(fields)
        pos = record_end
    return spans


@st.composite
def limits_around(draw: st.DrawFn, recs: list[Record], batch: bytes) -> list[RecordLimits]:
    """Each limit in turn drawn at or under the largest size of its kind in the batch, so
    that it often breaks on some record, the others at their defaults."""
    section = _plain_section(batch)
    largest = {
        "record_bytes_max": max(get_varint(section, s)[0] for (s, _), *_ in _fields(section)),
        "key_bytes_max": max(len(r.key or b"") for r in recs),
        "header_count_max": max(len(r.headers) for r in recs),
        "header_key_bytes_max": max(
            (len(h.key.encode()) for r in recs for h in r.headers), default=0
        ),
        "records_per_batch_max": len(recs),
        "batch_bytes_max": len(batch),
        "uncompressed_bytes_max": len(section),
    }
    return [
        RecordLimits(**{name: draw(st.integers(0, at_most), label=name)})
        for name, at_most in largest.items()
    ]


@st.composite
def rewritten_field(draw: st.DrawFn, section: bytes, field_no: int) -> bytes:
    """One varint field of one record replaced by another value (possibly of another
    width; -old - 1 has old's magnitude and the other sign), the record's length made to
    fit or not; or (field_no FIELDS) one byte more at the end of a record."""
    spans = _fields(section)
    fields = spans[draw(st.integers(0, len(spans) - 1), label="record")]
    out = bytearray()
    if field_no == len(fields):  # a byte after the header count
        start = end = sum(get_varint(section, fields[0][0]))  # the record's end
        out.append(draw(st.integers(0, 255), label="extra"))
    else:
        start, end = fields[field_no]
        old, _ = get_varint(section, start)
        values = [-2, -1, 0, 1, old - 1, old + 1, -old - 1, 2**20, 2**62]
        put_varint(out, draw(st.sampled_from(values), label="value"))
    rewritten = section[:start] + bytes(out) + section[end:]
    if field_no == 0 or not draw(st.booleans(), label="fix length"):
        return rewritten
    length_start, length_end = fields[0]
    length, _ = get_varint(section, length_start)
    fixed = bytearray()
    put_varint(fixed, length + len(out) - (end - start))
    return rewritten[:length_start] + bytes(fixed) + rewritten[length_end:]


codecs = st.sampled_from(Codec)


@PROPERTY
@given(recs=batch_records(wide=True), codec=codecs, data=st.data())
def test_valid_batches_and_every_limit_as_the_scalar_walk(
    recs: list[Record], codec: Codec, data: st.DataObject
) -> None:
    batch = encode_batch(recs, codec=codec)
    _same_as_the_scalar_walk(batch)
    for limits in data.draw(limits_around(recs, batch), label="limits"):
        _same_as_the_scalar_walk(batch, limits)


@PROPERTY
@given(recs=batch_records(wide=False, smallest=THRESHOLD), codec=codecs, data=st.data())
def test_damaged_records_sections_as_the_scalar_walk(
    recs: list[Record], codec: Codec, data: st.DataObject
) -> None:
    batch = encode_batch(recs, codec=codec)
    section = bytearray(_plain_section(batch))
    for _ in range(data.draw(st.integers(1, 3), label="flips")):
        at = data.draw(st.integers(0, len(section) - 1), label="at")
        section[at] = data.draw(
            st.one_of(st.integers(0, 255), st.just(section[at] ^ 0x80)), label="byte"
        )
    _same_as_the_scalar_walk(_reframed(batch, bytes(section)))
    for field_no in range(FIELDS + 1):  # each field, then a byte after the last
        rewritten = data.draw(rewritten_field(_plain_section(batch), field_no), label="rewrite")
        _same_as_the_scalar_walk(_reframed(batch, rewritten))
    cut = data.draw(st.integers(0, len(section)), label="cut")
    _same_as_the_scalar_walk(_reframed(batch, _plain_section(batch)[:cut]))
    count = read_header(batch).record_count + data.draw(st.sampled_from([-1, 1]), label="count")
    if count >= 1:
        _same_as_the_scalar_walk(_reframed(batch, _plain_section(batch), count))


@PROPERTY
@given(recs=batch_records(wide=False), codec=codecs)
def test_a_producers_batch_is_accepted_by_the_arrays_themselves(
    recs: list[Record], codec: Codec
) -> None:
    batch = encode_batch(recs, codec=codec)
    lim = records.DEFAULT_LIMITS
    section = _plain_section(batch)
    assert records_are_valid(
        section,
        0,
        len(recs),
        lim.record_bytes_max,
        lim.key_bytes_max,
        lambda pos, end, i: records._check_headers(section, pos, end, i, lim),
    )
    assert validate_batch(batch).record_count == len(recs)


def test_the_arrays_walk_batches_from_the_threshold_up() -> None:
    answers: list[bool] = []

    def walk(*args: object) -> bool:
        answers.append(real(*args))
        return answers[-1]

    real = records._records_are_valid
    for count in (records.VECTORISED_RECORDS_MIN - 1, records.VECTORISED_RECORDS_MIN):
        batch = encode_batch([Record(None, b"v%d" % i) for i in range(count)])
        with mock.patch.object(records, "_records_are_valid", walk):
            assert validate_batch(batch).record_count == count
    assert answers == [True]  # the batch at the threshold only, accepted by the arrays
