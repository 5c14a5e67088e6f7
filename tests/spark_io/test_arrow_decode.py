"""spark_io/_arrow.py reads the RecordBatch format exactly as log/records.py does.

Proves with hypothesis that for any batches log.records encodes (null and empty keys and
values, headers, create and log-append timestamps, zstd, offset gaps left by compaction,
control batches) and any range [start, end), `decode_into` yields the records of
log.records.decode_batch in that range, field for field, as Arrow columns in the Spark
schema; that the returned next offset follows the last batch; and that a flipped byte under a
batch's CRC or a cut answer is refused with StorageError instead of reaching Spark.
Then that the decoder's two walks of the records (vectorised and scalar) return the same
rows, or both refuse, on any answer, including sections damaged under a recomputed CRC.
"""

from __future__ import annotations

import struct
from typing import Any

import crc32c
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dmq.errors import StorageError
from log.records import Codec, Header, Record, TimestampType, decode_batch, encode_batch
from log.varint import put_varint
from spark_io import _arrow
from spark_io._arrow import Columns, decode_into
from spark_io.source import arrow_schema, spark_schema

ARROW_SCHEMA = arrow_schema(spark_schema(include_headers=True))

maybe_bytes = st.none() | st.binary(max_size=300)
records = st.lists(
    st.builds(
        Record,
        key=maybe_bytes,
        value=maybe_bytes,
        headers=st.lists(
            st.builds(Header, st.text(max_size=8), st.binary(max_size=20)), max_size=3
        ).map(tuple),
        timestamp_ms=st.integers(0, 2**41),
    ),
    min_size=1,
    max_size=20,
)
batch_specs = st.lists(
    st.tuples(
        records,
        st.sampled_from([Codec.NONE, Codec.ZSTD]),
        st.sampled_from(list(TimestampType)),
        st.booleans(),  # gaps in offset deltas (a compacted batch)
        st.booleans(),  # a control batch
    ),
    min_size=1,
    max_size=5,
)


def build(specs: list[Any]) -> tuple[bytes, list[Record]]:
    """Concatenated batches with increasing base offsets, and the data records in them."""
    body, expected, _ = build_with_spans(specs)
    return body, expected


def build_with_spans(specs: list[Any]) -> tuple[bytes, list[Record], list[range]]:
    """As build, and each batch's bytes covered by its CRC (all but the first 17)."""
    spans: list[range] = []
    body = bytearray()
    expected: list[Record] = []
    base = 0
    for recs, codec, ts_type, gaps, control in specs:
        deltas = [i * 3 if gaps else i for i in range(len(recs))]
        raw = encode_batch(
            recs, base_offset=base, codec=codec, timestamp_type=ts_type,
            offset_deltas=deltas, is_control=control,
        )  # fmt: skip
        if not control:
            expected.extend(decode_batch(raw).records)
        spans.append(range(len(body) + 17, len(body) + len(raw)))
        body += raw
        base += deltas[-1] + 1 + (5 if gaps else 0)
    return bytes(body), expected, spans


def rows(batch: pa.RecordBatch) -> list[dict[str, Any]]:
    return batch.to_pylist()  # type: ignore[no-any-return]


@settings(max_examples=150, suppress_health_check=[HealthCheck.too_slow], deadline=None)
@given(specs=batch_specs, data=st.data())
def test_decode_matches_log_records_in_any_range(specs: list[Any], data: st.DataObject) -> None:
    body, expected = build(specs)
    last = expected[-1].offset if expected else 0
    start = data.draw(st.integers(0, last + 2))
    end = data.draw(st.integers(start, last + 3))
    columns = Columns("orders", 3, with_headers=True)

    next_offset = decode_into(columns, body, start, end)

    wanted = [r for r in expected if start <= r.offset < end]
    got = rows(columns.to_record_batch(ARROW_SCHEMA)) if len(columns) else []
    assert [g["offset"] for g in got] == [r.offset for r in wanted]
    for g, r in zip(got, wanted, strict=True):
        assert (g["key"], g["value"]) == (r.key, r.value)
        assert g["topic"] == "orders" and g["partition"] == 3
        assert g["timestamp"].timestamp() * 1000 == pytest.approx(r.timestamp_ms, abs=0.5)
        headers = [(h["key"], h["value"]) for h in g["headers"] or ()]
        assert headers == [(h.key, h.value) for h in r.headers]
        assert g["headers"] is None or r.headers
    types = {g["timestampType"] for g in got}
    assert types <= {0, 1}
    # The next offset follows the last batch that was walked (decoding stops early at end).
    assert next_offset >= min(end, last + 1) or not wanted


@settings(max_examples=60, deadline=None)
@given(specs=batch_specs, data=st.data())
def test_a_flipped_byte_or_a_cut_answer_is_refused(specs: list[Any], data: st.DataObject) -> None:
    body, expected, spans = build_with_spans(specs)
    position = data.draw(st.sampled_from(spans).flatmap(st.sampled_from))
    broken = bytearray(body)
    broken[position] ^= 0xFF
    cut = body[: data.draw(st.integers(1, len(body) - 1))]
    for bad in (bytes(broken), cut):
        columns = Columns("orders", 0, with_headers=False)
        try:
            decode_into(columns, bad, 0, 2**62)
        except StorageError as error:
            assert "orders-0" in str(error)
        else:
            # The flipped byte is under a CRC, so only a cut at a batch boundary (a
            # shorter but whole answer) may pass.
            assert bad is cut and len(columns) <= len(expected)


@pytest.mark.parametrize("position", range(17, 23))  # attributes and last_offset_delta
def test_a_flipped_header_field_under_the_crc_is_refused_not_skipped(position: int) -> None:
    """Found by the property above: a flipped high byte of last_offset_delta made the
    delta negative, and the batch was skipped as below start_offset before its CRC was
    checked, so an answer of one corrupt batch decoded to nothing, without a word."""
    broken = bytearray(encode_batch([Record(None, None, (), 0, 0)], base_offset=0))
    broken[position] ^= 0xFF
    with pytest.raises(StorageError, match="orders-0"):
        decode_into(Columns("orders", 0, with_headers=False), bytes(broken), 0, 2**62)


def test_log_append_time_takes_the_batch_max_timestamp() -> None:
    recs = [Record(b"k", b"v", timestamp_ms=5), Record(None, None, timestamp_ms=9)]
    body = encode_batch(recs, base_offset=10, timestamp_type=TimestampType.LOG_APPEND_TIME)
    columns = Columns("t", 0, with_headers=False)
    assert decode_into(columns, body, 0, 100) == 12
    schema = arrow_schema(spark_schema(include_headers=False))
    got = rows(columns.to_record_batch(schema))
    assert [(g["key"], g["value"], g["offset"], g["timestampType"]) for g in got] == [
        (b"k", b"v", 10, 1),
        (None, None, 11, 1),
    ]
    assert {g["timestamp"].timestamp() for g in got} == {0.009}


# --------------------------------------------------------------------------- both walks
# _arrow.py has two walks of the records: _walk_vectorised (numpy over every record of an
# answer, used from VECTORISED_RECORDS_MIN records) and _walk_scalar (one record at a
# time: small answers, and what the vectorised walk leaves to it). The tests below force
# each in turn and prove they return the same rows, or both refuse, on any answer,
# including records sections damaged under a recomputed CRC (so that the damage gets past
# the CRC check and reaches the walks' own checks).

VECTORISED, SCALAR = 0, 2**62  # VECTORISED_RECORDS_MIN forcing each walk


def decode_with(
    threshold: int, body: bytes, start: int, end: int, with_headers: bool
) -> pa.RecordBatch | StorageError:
    """The answer's batch (or the StorageError raised) with VECTORISED_RECORDS_MIN set."""
    columns = Columns("orders", 1, with_headers=with_headers)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(_arrow, "VECTORISED_RECORDS_MIN", threshold)
        try:
            decode_into(columns, body, start, end)
        except StorageError as error:
            return error
    return columns.to_record_batch(arrow_schema(spark_schema(include_headers=with_headers)))


def same_outcome(body: bytes, start: int, end: int, with_headers: bool) -> pa.RecordBatch | None:
    """Both walks' outcome, asserted equal: the batch, or None when both refuse."""
    fast = decode_with(VECTORISED, body, start, end, with_headers)
    slow = decode_with(SCALAR, body, start, end, with_headers)
    if isinstance(slow, StorageError) or isinstance(fast, StorageError):
        assert isinstance(fast, StorageError) and isinstance(slow, StorageError), (fast, slow)
        assert "orders-1" in str(fast)
        return None
    assert fast.equals(slow)
    return fast


def refresh_crc(batch: bytearray) -> bytes:
    """The batch with its batch_length and CRC-32C made to fit its (changed) bytes."""
    struct.pack_into(">i", batch, 8, len(batch) - 12)
    struct.pack_into(">I", batch, 13, crc32c.crc32c(bytes(batch[17:])))
    return bytes(batch)


# Batches of records of one size (16-byte keys, values of one length) come in runs that
# record_chain checks at once; an odd record or a delta's varint growing a byte (offset
# delta 64, timestamp delta 64 ms) ends a run.
uniform_batches = st.lists(
    st.tuples(
        st.integers(1, 150),  # records
        st.integers(0, 300),  # value bytes
        # Records with another value size; 64 more bytes change only the second byte of
        # the record's length varint, which a run must check too.
        st.dictionaries(st.integers(0, 149), st.sampled_from([7, 64]), max_size=3),
        st.integers(0, 3),  # timestamp step, ms per record
        st.booleans(),  # headers
    ),
    min_size=1,
    max_size=4,
)


def build_uniform(specs: list[Any]) -> tuple[bytes, list[Record]]:
    body = bytearray()
    expected: list[Record] = []
    base = 0
    for count, size, odd, step, with_headers in specs:
        headers = (Header("tag", b"eu"),) if with_headers else ()
        recs = [
            Record(b"%016d" % i, bytes([i % 251]) * (size + odd.get(i, 0)), headers, i * step)
            for i in range(count)
        ]
        raw = encode_batch(recs, base_offset=base)
        expected.extend(decode_batch(raw).records)
        body += raw
        base += count
    return bytes(body), expected


@settings(max_examples=100, suppress_health_check=[HealthCheck.too_slow], deadline=None)
@given(specs=st.one_of(batch_specs, uniform_batches), data=st.data())
def test_both_walks_match_log_records(specs: list[Any], data: st.DataObject) -> None:
    body, expected = build(specs) if isinstance(specs[0][0], list) else build_uniform(specs)
    last = expected[-1].offset if expected else 0
    start = data.draw(st.integers(0, last + 2))
    end = data.draw(st.integers(start, last + 3))
    with_headers = data.draw(st.booleans())
    batch = same_outcome(body, start, end, with_headers)
    assert batch is not None
    wanted = [r for r in expected if start <= r.offset < end]
    got = rows(batch)
    assert [(g["offset"], g["key"], g["value"]) for g in got] == [
        (r.offset, r.key, r.value) for r in wanted
    ]
    assert [round(g["timestamp"].timestamp() * 1000) for g in got] == [
        r.timestamp_ms for r in wanted
    ]
    if with_headers:
        assert [[(h["key"], h["value"]) for h in g["headers"] or ()] for g in got] == [
            [(h.key, h.value) for h in r.headers] for r in wanted
        ]


@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow], deadline=None)
@given(specs=st.one_of(batch_specs, uniform_batches), data=st.data())
def test_both_walks_agree_on_a_damaged_records_section(
    specs: list[Any], data: st.DataObject
) -> None:
    """A byte set, inserted or deleted in an uncompressed records section, batch_length
    and CRC made to fit: both walks refuse it or return the same rows (a changed key or
    value byte is still a well-formed record)."""
    uniform = not isinstance(specs[0][0], list)
    if not uniform:  # damage reaches the walks only in an uncompressed data batch
        specs = [(recs, Codec.NONE, ts, gaps, False) for recs, _, ts, gaps, _ in specs]
    body, _ = build(specs) if not uniform else build_uniform(specs)
    batches = []
    pos = 0
    while pos < len(body):
        size = struct.unpack_from(">i", body, pos + 8)[0] + 12
        batches.append(bytearray(body[pos : pos + size]))
        pos += size
    victim = data.draw(st.integers(0, len(batches) - 1))
    batch = batches[victim]
    at = data.draw(st.integers(57, len(batch) - 1))
    how = data.draw(st.sampled_from(["set", "insert", "delete"]))
    byte = data.draw(st.integers(0, 255))
    if how == "set":
        batch[at] = byte
    elif how == "insert":
        batch.insert(at, byte)
    else:
        del batch[at]
    damaged = b"".join(refresh_crc(b) for b in batches)
    start = data.draw(st.integers(0, 5))
    same_outcome(damaged, start, 2**62, data.draw(st.booleans()))


def record_fields(index: int, key: bytes | None, value: bytes | None, headers: int) -> list[Any]:
    """A record's fields after its length, as log/records.py writes them: ints are
    varints, bytes are written as they are."""
    fields: list[Any] = [0, index, index]  # attributes (a byte: 0 is one), ts and offset delta
    for data in (key, value):
        fields += [-1] if data is None else [len(data), data]
    fields.append(headers)
    for h in range(headers):
        fields += [1, b"h", 1, bytes([h])]
    return fields


def encode_fields(fields: list[Any], length: int | None = None) -> bytes:
    body = bytearray()
    for f in fields:
        if isinstance(f, bytes):
            body += f
        else:
            put_varint(body, f)
    out = bytearray()
    put_varint(out, len(body) if length is None else length)
    return bytes(out + body)


@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow], deadline=None)
@given(
    count=st.integers(1, 80),
    size=st.integers(0, 200),
    nulls=st.booleans(),
    headers=st.integers(0, 2),
    data=st.data(),
)
def test_both_walks_agree_on_a_damaged_record_field(
    count: int, size: int, nulls: bool, headers: int, data: st.DataObject
) -> None:
    """One varint of one record (its length, a delta, a key or value length, its header
    count) set to another value, the record's length made to fit its bytes again unless
    the length is what changed, batch_length and CRC too: both walks refuse it or return
    the same rows."""
    records = [
        record_fields(i, None if nulls and i % 3 == 0 else b"k%03d" % i, b"v" * size, headers)
        for i in range(count)
    ]
    victim = data.draw(st.integers(0, count - 1))
    varints = [j for j, f in enumerate(records[victim]) if isinstance(f, int) and j > 0]
    target = data.draw(st.sampled_from([-1, *varints]))  # -1: the record's length
    old = len(encode_fields(records[victim])) - 1 if target < 0 else records[victim][target]
    new = data.draw(
        st.sampled_from([old - 1, old + 1, old - 64, old + 64, -1, -2, -3, 0, 2**20])
        | st.integers(-(2**40), 2**40)
    )
    section = bytearray()
    for i, fields in enumerate(records):
        if i == victim and target < 0:
            section += encode_fields(fields, length=new)
        elif i == victim:
            section += encode_fields([new if j == target else f for j, f in enumerate(fields)])
        else:
            section += encode_fields(fields)
    header = bytearray(encode_batch([Record(None, None, (), 0)] * count)[:57])
    body = refresh_crc(header + section)
    same_outcome(body, data.draw(st.integers(0, 3)), 2**62, data.draw(st.booleans()))


def test_the_vectorised_walk_reads_ordinary_answers_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    """Runs of one size, records of varied sizes, null keys and values, zstd, log-append
    time: decoded without a fallback to the scalar walk."""
    monkeypatch.setattr(_arrow, "_walk_scalar", no_scalar)
    recs = [
        Record(
            None if i % 7 == 0 else b"k%d" % i,
            None if i % 11 == 0 else b"v" * (1024 if i < 100 else i % 300),
            (),
            1_700_000_000_000 + i * 40,
        )
        for i in range(300)
    ]
    body = encode_batch(recs[:150]) + encode_batch(
        recs[150:], base_offset=150, codec=Codec.ZSTD, timestamp_type=TimestampType.LOG_APPEND_TIME
    )
    columns = Columns("orders", 0, with_headers=False)
    assert decode_into(columns, body, 3, 290) == 300
    got = rows(columns.to_record_batch(arrow_schema(spark_schema(include_headers=False))))
    assert [(g["offset"], g["key"], g["value"]) for g in got] == [
        (i, r.key, r.value) for i, r in enumerate(recs) if 3 <= i < 290
    ]
    assert [g["timestampType"] for g in got] == [0] * 147 + [1] * 140


def padded_key_length(varint_bytes: int) -> bytes:
    """40 records of key b"abc"; the first one's key length (3) written as a varint of
    varint_bytes bytes (zero bits carried on: valid, not the shortest form)."""
    body = bytearray(encode_batch([Record(b"abc", b"v", (), 0) for _ in range(40)]))
    # The first record: length (1 byte), attributes, ts delta, offset delta, key length.
    key_at = 57 + 4
    assert body[key_at] == 6 and body[57] == 2 * 10
    padded = bytes([0x86, *[0x80] * (varint_bytes - 2), 0x00])
    body[key_at : key_at + 1] = padded
    body[57] = 2 * (10 + varint_bytes - 1)
    return refresh_crc(body)


def no_scalar(*args: object) -> None:
    raise AssertionError("fell back to the scalar walk")


def test_a_nine_byte_varint_is_read_by_the_vectorised_walk(monkeypatch: pytest.MonkeyPatch) -> None:
    body = padded_key_length(9)
    expected = decode_with(SCALAR, body, 0, 100, with_headers=False)
    monkeypatch.setattr(_arrow, "_walk_scalar", no_scalar)
    batch = decode_with(VECTORISED, body, 0, 100, with_headers=False)
    assert isinstance(batch, pa.RecordBatch) and batch.equals(expected)
    assert batch.column("key").to_pylist() == [b"abc"] * 40


def test_a_ten_byte_varint_falls_back_to_the_scalar_walk() -> None:
    """Only the scalar walk reads a 10-byte varint (Python's unbounded ints): the
    vectorised walk hands the answer over, and the rows are the same."""
    batch = same_outcome(padded_key_length(10), 0, 100, with_headers=False)
    assert batch is not None
    assert batch.column("key").to_pylist() == [b"abc"] * 40
    assert batch.column("offset").to_pylist() == list(range(40))


@pytest.mark.parametrize("threshold", [VECTORISED, SCALAR])
def test_headers_must_end_where_their_record_does(threshold: int) -> None:
    """A record whose header count claims more headers than it holds, or fewer (bytes
    left in the record), is refused, not read into the next record."""
    recs = [Record(b"k", b"v", (Header("a", b"1"),), 0) for _ in range(40)]
    body = bytearray(encode_batch(recs))
    # The first record: length, attributes, ts delta, offset delta, key (2), value (2),
    # then the header count (zigzag 1 = 2) at byte 57 + 1 + 1 + 1 + 1 + 2 + 2.
    count_at = 57 + 8
    assert body[count_at] == 2
    for count in (2 * 2, 0, 1):  # 2 headers, 0 headers (1 left over), -1
        body[count_at] = count
        outcome = decode_with(threshold, refresh_crc(bytearray(body)), 0, 100, with_headers=True)
        assert isinstance(outcome, StorageError), count


def test_a_record_too_short_for_its_deltas_is_refused_even_when_filtered_out() -> None:
    """Record 0 holds only its attributes and timestamp delta: its offset delta would be
    read from record 1's length. Both walks refuse the answer, even though that offset
    (record 1's length, 13) is past the range asked for, [0, 10)."""
    section = bytearray(encode_fields([0, 0], length=2))
    for i in range(1, 40):
        section += encode_fields(record_fields(i, b"k%03d" % i, b"vvv", 0))
    assert section[3] == 2 * 13
    header = bytearray(encode_batch([Record(None, None, (), 0)] * 40)[:57])
    body = refresh_crc(header + section)
    for threshold in (VECTORISED, SCALAR):
        outcome = decode_with(threshold, body, 0, 10, with_headers=False)
        assert isinstance(outcome, StorageError), threshold


@pytest.mark.parametrize("threshold", [VECTORISED, SCALAR])
@pytest.mark.parametrize("last_ms", [(2**63 - 1) // 1000, (2**63 - 1) // 1000 + 1])
def test_a_timestamp_at_the_edge_of_int64_microseconds(threshold: int, last_ms: int) -> None:
    """The last ms whose µs fit int64 is read exactly by both walks (the vectorised one
    hands it to the scalar one); one ms more is refused, not wrapped around."""
    recs = [Record(b"k", b"v", (), last_ms - 39 + i) for i in range(40)]
    outcome = decode_with(threshold, encode_batch(recs), 0, 100, with_headers=False)
    if last_ms * 1000 > 2**63 - 1:
        assert isinstance(outcome, StorageError)
    else:
        assert isinstance(outcome, pa.RecordBatch)
        got = outcome.column("timestamp").cast(pa.int64()).to_pylist()
        assert got == [(last_ms - 39 + i) * 1000 for i in range(40)]
