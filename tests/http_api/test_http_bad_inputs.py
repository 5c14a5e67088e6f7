"""Bad requests get a precise 4xx, never a 500, and leave the broker serving.

Proves, against one live broker with small limits, a table of malformed, mistyped,
out-of-range and oversize requests: each answers the expected status and error code,
names the offending field in `details.field` (`records[1].value`, `config.colour`,
`batch.crc`...), and where a limit applies states it in `details.limit` and in the
message. Fetches outside the log answer 416 with the valid range. After the table the
broker still produces and fetches normally, and its log holds no traceback.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest

from log.records import Record, encode_batch
from tests_support import BrokerProcess

RECORD_BYTES_MAX = 1024
REQUEST_BYTES_MAX = 64 * 1024
PRODUCE_RECORDS_MAX = 10
FETCH_WAIT_MS_MAX = 1000
TOPIC_NAME_CHARS_MAX = 249
PARTITIONS_PER_TOPIC_MAX = 1000
INT64_MAX = 2**63 - 1
TOPIC = "bad"  # 2 partitions; partition 0 holds offsets [0, 3)
RECORDS = f"/v1/topics/{TOPIC}/records"
FETCH = f"/v1/topics/{TOPIC}/partitions/0/records"
OFFSETS = f"/v1/topics/{TOPIC}/partitions/0/offsets"
BATCH = "application/vnd.dmq.batch"
NDJSON = "application/x-ndjson"


@dataclass(frozen=True)
class Row:
    id: str
    method: str
    path: str
    body: bytes | dict[str, Any] | None
    status: int
    code: str
    field: str | None
    limit: int | None = None
    content_type: str = "application/json"
    details: dict[str, Any] = field(default_factory=dict)  # further details expected
    headers: tuple[str, ...] = ()  # response headers that must be present


def _produce(*records: dict[str, Any], **extra: Any) -> dict[str, Any]:
    return {"records": list(records), **extra}


def _corrupt_batch() -> bytes:
    batch = bytearray(encode_batch([Record(b"k", b"value", (), 1_700_000_000_000)]))
    batch[-1] ^= 0xFF  # a byte of the last record: only the CRC can tell
    return bytes(batch)


def _range(offset: int) -> dict[str, int]:
    return {"offset": offset, "log_start_offset": 0, "log_end_offset": 3}


ROWS = [
    # Malformed JSON and wrong shapes.
    Row("produce-malformed-json", "POST", RECORDS, b'{"records": [', 400, "invalid_request",
        "body"),
    Row("create-malformed-json", "POST", "/v1/topics", b'{"name": ', 400, "invalid_request",
        "body"),
    Row("create-body-not-object", "POST", "/v1/topics", b"[]", 400, "invalid_request", "body"),
    Row("records-not-a-list", "POST", RECORDS, {"records": {}}, 400, "invalid_request", "records"),
    Row("no-records", "POST", RECORDS, _produce(), 400, "invalid_request", "records"),
    Row("unknown-body-field", "POST", RECORDS, _produce({}, acks=1), 400, "invalid_request",
        "acks"),
    Row("unknown-record-field", "POST", RECORDS, _produce({"valu": "x"}), 400, "invalid_request",
        "records[0].valu"),
    Row("value-as-number", "POST", RECORDS, _produce({"value": 5}), 400, "invalid_request",
        "records[0].value"),
    Row("key-as-list", "POST", RECORDS, _produce({"value": "v"}, {"key": ["k"]}), 400,
        "invalid_request", "records[1].key"),
    Row("partition-as-string", "POST", RECORDS, _produce({"partition": "0"}), 400,
        "invalid_request", "records[0].partition"),
    Row("timestamp-negative", "POST", RECORDS, _produce({"timestamp": -1}), 400,
        "invalid_request", "records[0].timestamp"),
    # orjson refuses these bodies; the stdlib's json.loads, its fallback, parses them, so the
    # field is still named (#22).
    Row("timestamp-past-64-bits", "POST", RECORDS, b'{"records": [{"timestamp": 1%s}]}' % (b"0" * 30),
        400, "invalid_request", "records[0].timestamp"),
    Row("timestamp-nan", "POST", RECORDS, b'{"records": [{"timestamp": NaN}]}', 400,
        "invalid_request", "records[0].timestamp"),
    Row("headers-a-string", "POST", RECORDS, _produce({"headers": "h=x"}), 400,
        "invalid_request", "records[0].headers"),
    Row("header-not-an-object", "POST", RECORDS, _produce({"headers": ["h"]}), 400,
        "invalid_request", "records[0].headers[0]"),
    Row("header-value-number", "POST", RECORDS, _produce({"headers": {"h": 1}}), 400,
        "invalid_request", "records[0].headers[0].value"),
    Row("header-key-lone-surrogate", "POST", RECORDS, _produce({"headers": {"\ud800": "x"}}), 400,
        "invalid_request", "records[0].headers[0].key"),
    Row("ndjson-bad-line", "POST", RECORDS, b'{"value": "a"}\n{oops\n', 400, "invalid_request",
        "line 2", content_type=NDJSON),
    Row("text-not-utf8", "POST", RECORDS, b"\xff\xfe\n", 400, "invalid_request", "body",
        content_type="text/plain"),
    # Bad base64 names the field.
    Row("base64-value", "POST", RECORDS, _produce({"value": "!!!"}, value_encoding="base64"), 400,
        "invalid_request", "records[0].value"),
    Row("base64-header-value", "POST", RECORDS,
        _produce({"headers": [{"key": "h", "value": "a"}]}, value_encoding="base64"), 400,
        "invalid_request", "records[0].headers[0].value"),
    Row("base64-ndjson-key", "POST", RECORDS + "?value_encoding=base64", b'{"key": "***"}\n', 400,
        "invalid_request", "records[0].key", content_type=NDJSON),
    # Query parameters of produce.
    Row("acks-7", "POST", RECORDS + "?acks=7", _produce({}), 400, "invalid_request", "acks"),
    Row("value-encoding-unknown", "POST", RECORDS + "?value_encoding=hex", _produce({}), 400,
        "invalid_request", "value_encoding"),
    Row("produce-partition-negative", "POST", RECORDS + "?partition=-1", _produce({}), 400,
        "invalid_request", "partition", limit=0),
    Row("content-type-xml", "POST", RECORDS, b"<records/>", 415, "unsupported_media_type",
        "Content-Type", content_type="application/xml"),
    # Sizes and counts over their limits.
    Row("record-too-large", "POST", RECORDS,
        _produce({"value": "small"}, {"value": "x" * (RECORD_BYTES_MAX + 1)}), 413,
        "record_too_large", "records[1].value", limit=RECORD_BYTES_MAX),
    Row("body-too-large", "POST", RECORDS,
        b'{"records": [{"value": "' + b"x" * REQUEST_BYTES_MAX + b'"}]}', 413,
        "record_too_large", "body", limit=REQUEST_BYTES_MAX),
    Row("too-many-records", "POST", RECORDS, _produce(*[{}] * (PRODUCE_RECORDS_MAX + 1)), 413,
        "record_too_large", "records", limit=PRODUCE_RECORDS_MAX),
    # Binary batches are checked before they are stored.
    Row("batch-crc", "POST", RECORDS + "?partition=0", _corrupt_batch(), 400, "invalid_request",
        "batch.crc", content_type=BATCH),
    Row("batch-truncated", "POST", RECORDS + "?partition=0", _corrupt_batch()[:-1], 400,
        "invalid_request", "batch.batch_length", content_type=BATCH),
    Row("batch-empty", "POST", RECORDS + "?partition=0", b"", 400, "invalid_request", "batch",
        content_type=BATCH),
    # Unknown topics and partitions.
    Row("fetch-unknown-topic", "GET", "/v1/topics/nope/partitions/0/records", None, 404,
        "topic_not_found", "topic"),
    Row("fetch-unknown-partition", "GET", f"/v1/topics/{TOPIC}/partitions/2/records", None, 404,
        "partition_not_found", "partition", limit=1),
    Row("offsets-unknown-partition", "GET", f"/v1/topics/{TOPIC}/partitions/99/offsets", None,
        404, "partition_not_found", "partition", limit=1),
    Row("produce-unknown-partition", "POST", RECORDS, _produce({"partition": 7}), 404,
        "partition_not_found", "records[0].partition", limit=1),
    Row("describe-unknown-topic", "GET", "/v1/topics/nope", None, 404, "topic_not_found", "topic"),
    Row("partition-not-a-number", "GET", f"/v1/topics/{TOPIC}/partitions/x/records", None, 400,
        "invalid_request", "partition"),
    Row("partition-unicode-digit", "GET", f"/v1/topics/{TOPIC}/partitions/%C2%B2/records", None,
        400, "invalid_request", "partition"),
    # Fetch offsets and bounds.
    Row("offset-negative", "GET", FETCH + "?offset=-1", None, 416, "offset_out_of_range", None,
        details=_range(-1)),
    Row("offset-past-end", "GET", FETCH + "?offset=4", None, 416, "offset_out_of_range", None,
        details=_range(4)),
    Row("offset-huge", "GET", f"{FETCH}?offset={INT64_MAX}", None, 416, "offset_out_of_range",
        None, details=_range(INT64_MAX)),
    Row("offset-beyond-int64", "GET", f"{FETCH}?offset={INT64_MAX + 1}", None, 400,
        "invalid_request", "offset", limit=INT64_MAX),
    Row("offset-not-a-number", "GET", FETCH + "?offset=abc", None, 400, "invalid_request",
        "offset"),
    Row("wait-ms-over-max", "GET", f"{FETCH}?wait_ms={FETCH_WAIT_MS_MAX + 1}", None, 400,
        "invalid_request", "wait_ms", limit=FETCH_WAIT_MS_MAX),
    Row("max-records-zero", "GET", FETCH + "?max_records=0", None, 400, "invalid_request",
        "max_records", limit=1),
    Row("format-unknown", "GET", FETCH + "?format=xml", None, 400, "invalid_request", "format"),
    Row("fetch-value-encoding-unknown", "GET", FETCH + "?value_encoding=hex", None, 400,
        "invalid_request", "value_encoding"),
    Row("offsets-timestamp-negative", "GET", OFFSETS + "?timestamp=-5", None, 400,
        "invalid_request", "timestamp", limit=0),
    # Topic administration.
    Row("create-bad-name", "POST", "/v1/topics", {"name": "bad name!"}, 400, "invalid_request",
        "name", limit=TOPIC_NAME_CHARS_MAX),
    Row("create-name-too-long", "POST", "/v1/topics", {"name": "a" * (TOPIC_NAME_CHARS_MAX + 1)},
        400, "invalid_request", "name", limit=TOPIC_NAME_CHARS_MAX),
    Row("create-name-not-string", "POST", "/v1/topics", {"name": 5}, 400, "invalid_request",
        "name"),
    Row("create-unknown-field", "POST", "/v1/topics", {"name": "n1", "partition": 3}, 400,
        "invalid_request", "partition"),
    Row("create-zero-partitions", "POST", "/v1/topics", {"name": "n2", "partitions": 0}, 400,
        "invalid_request", "partitions", limit=PARTITIONS_PER_TOPIC_MAX),
    Row("create-duplicate", "POST", "/v1/topics", {"name": TOPIC}, 409, "topic_already_exists",
        "name"),
    Row("create-unknown-config-key", "POST", "/v1/topics", {"name": "n3", "config": {"colour": 1}},
        400, "invalid_config", "config.colour"),
    Row("create-config-not-object", "POST", "/v1/topics", {"name": "n4", "config": False}, 400,
        "invalid_config", "config"),
    Row("alter-unknown-config-key", "PATCH", f"/v1/topics/{TOPIC}/config",
        {"config": {"colour": "red"}}, 400, "invalid_config", "config.colour"),
    Row("alter-config-out-of-range", "PATCH", f"/v1/topics/{TOPIC}/config",
        {"config": {"segment_bytes": 10}}, 400, "invalid_config", "config.segment_bytes",
        limit=1024),
    Row("alter-config-bad-choice", "PATCH", f"/v1/topics/{TOPIC}/config",
        {"config": {"cleanup_policy": "shred"}}, 400, "invalid_config", "config.cleanup_policy"),
    Row("alter-without-config", "PATCH", f"/v1/topics/{TOPIC}/config", {"retention_ms": 1}, 400,
        "invalid_request", "config"),
    Row("add-partitions-smaller", "POST", f"/v1/topics/{TOPIC}/partitions", {"count": 1}, 400,
        "invalid_request", "count", limit=PARTITIONS_PER_TOPIC_MAX),
    Row("add-partitions-not-int", "POST", f"/v1/topics/{TOPIC}/partitions", {"count": "3"}, 400,
        "invalid_request", "count"),
    # Routing.
    Row("method-not-allowed", "PUT", "/v1/topics", b"{}", 405, "method_not_allowed", None,
        headers=("Allow",)),
    Row("unknown-route", "GET", "/v2/topics", None, 404, "not_found", None),
]  # fmt: skip


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    limits = {
        "record-bytes-max": RECORD_BYTES_MAX,
        "batch-bytes-max": REQUEST_BYTES_MAX,  # the relations checked at start-up hold
        "request-bytes-max": REQUEST_BYTES_MAX,
        "fetch-bytes-max": REQUEST_BYTES_MAX,
        "produce-records-max": PRODUCE_RECORDS_MAX,
        "fetch-wait-ms-max": FETCH_WAIT_MS_MAX,
        "segment-bytes": 1024 * 1024,
    }
    extra_args = [arg for name, value in limits.items() for arg in (f"--{name}", str(value))]
    proc = BrokerProcess(tmp_path_factory.mktemp("bad_inputs") / "broker", extra_args=extra_args)
    try:
        proc.start()
        assert proc.json("POST", "/v1/topics", {"name": TOPIC, "partitions": 2})[0] == 201
        records = _produce(*[{"value": f"v{i}", "partition": 0} for i in range(3)])
        assert proc.json("POST", RECORDS, records) == (
            200, {"offsets": [{"partition": 0, "offset": i} for i in range(3)]}
        )  # fmt: skip
        yield proc
    finally:
        proc.stop()


@pytest.mark.parametrize("row", ROWS, ids=[row.id for row in ROWS])
def test_bad_request_answers_its_error_naming_the_field(live: BrokerProcess, row: Row) -> None:
    status, headers, raw = live.request(row.method, row.path, row.body, row.content_type)
    body = json.loads(raw)
    assert status == row.status, body
    error = body["error"]
    assert set(error) == {"code", "message", "details"}
    assert error["code"] == row.code, body
    details = error["details"]
    if row.field is not None:
        assert details.get("field") == row.field, body
    if row.limit is not None:
        assert details.get("limit") == row.limit, body
        assert str(row.limit) in error["message"], body
    assert details.items() >= row.details.items(), body
    for name in row.headers:
        assert name in headers, headers


def test_query_partition_goes_to_records_naming_none(live: BrokerProcess) -> None:
    """?partition= is every record's partition unless the record names its own."""
    body = _produce({"value": "a"}, {"value": "b", "partition": 0}, {"value": "c"})
    status, produced = live.json("POST", RECORDS + "?partition=1", body)
    assert status == 200, produced
    assert [o["partition"] for o in produced["offsets"]] == [1, 0, 1]
    status, _, raw = live.request("POST", RECORDS + "?partition=1", b"x\ny\n", "text/plain")
    assert status == 200 and {o["partition"] for o in json.loads(raw)["offsets"]} == {1}


def test_broker_still_serves_after_the_bad_requests(live: BrokerProcess) -> None:
    status, produced = live.json(
        "POST", RECORDS, _produce({"key": "k", "value": "after", "partition": 1})
    )
    assert status == 200
    offset = produced["offsets"][0]["offset"]
    status, fetched = live.json("GET", f"/v1/topics/{TOPIC}/partitions/1/records?offset={offset}")
    assert status == 200
    assert [(r["key"], r["value"]) for r in fetched["records"]] == [("k", "after")]
    assert "Traceback" not in live.log(), live.log()
