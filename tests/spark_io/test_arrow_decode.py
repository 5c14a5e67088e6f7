"""spark_io/_arrow.py reads the RecordBatch format exactly as log/records.py does.

Proves with hypothesis that for any batches log.records encodes (null and empty keys and
values, headers, create and log-append timestamps, zstd, offset gaps left by compaction,
control batches) and any range [start, end), `decode_into` yields the records of
log.records.decode_batch in that range, field for field, as Arrow columns in the Spark
schema; that the returned next offset follows the last batch; and that a flipped byte under a
batch's CRC or a cut answer is refused with StorageError instead of reaching Spark.
"""

from __future__ import annotations

from typing import Any

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dmq.errors import StorageError
from log.records import Codec, Header, Record, TimestampType, decode_batch, encode_batch
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
