"""JSON / NDJSON / text bodies to ProduceRecords, and Records to JSON.

Parsing checks the shape and types of every field and names the exact one that is
wrong (`records[3].headers[0].value`); sizes are checked by the Broker.
"""

from __future__ import annotations

import base64
import binascii
import json
from typing import Any, overload

import orjson
from aiohttp import web

from dmq import errors, limits
from dmq.broker import CONSISTENCIES, Consistency, ProduceRecord, ProducerSequence
from dmq.broker.transactions import ISOLATIONS, Isolation
from dmq.config import BrokerConfig
from dmq.types import Header, Record

ENCODINGS = ("string", "base64")


def _bytes(value: Any, where: str, encoding: str) -> bytes | None:
    if value is None:
        return None
    if not isinstance(value, str):
        raise errors.InvalidRequest(f"{where} must be a string or null", field=where)
    if encoding == "string":
        return value.encode("utf-8", "surrogatepass")
    try:
        return base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError):
        raise errors.InvalidRequest(f"{where} is not valid base64", field=where) from None


def _headers(raw: Any, where: str, encoding: str) -> tuple[Header, ...]:
    if raw is None:
        return ()
    if isinstance(raw, dict):
        items = list(raw.items())
    elif isinstance(raw, list):
        items = []
        for j, h in enumerate(raw):
            if not isinstance(h, dict) or set(h) - {"key", "value"} or "key" not in h:
                raise errors.InvalidRequest(
                    f'{where}[{j}] must be an object {{"key": ..., "value": ...}}',
                    field=f"{where}[{j}]",
                )
            items.append((h["key"], h.get("value")))
    else:
        raise errors.InvalidRequest(f"{where} must be a list or an object", field=where)
    out = []
    for j, (k, v) in enumerate(items):
        if not isinstance(k, str):
            raise errors.InvalidRequest(
                f"{where}[{j}].key must be a string", field=f"{where}[{j}].key"
            )
        try:
            k.encode("utf-8")  # header keys are stored as UTF-8; a lone surrogate is not
        except UnicodeEncodeError:
            raise errors.InvalidRequest(
                f"{where}[{j}].key is not valid Unicode text", field=f"{where}[{j}].key"
            ) from None
        value = _bytes(v, f"{where}[{j}].value", encoding)
        out.append(Header(k, b"" if value is None else value))
    return tuple(out)


_RECORD_FIELDS = {"key", "value", "headers", "partition", "timestamp", "deliver_at", "delay_ms"}


def parse_record(
    raw: Any, i: int, encoding: str, default_partition: int | None = None
) -> ProduceRecord:
    """One record of a JSON body; `default_partition` (the query's ?partition=) where the
    record names none: set here, not copied afterwards (a dataclasses.replace per record
    was a sixth of a 1000-record JSON produce's samples, #22)."""
    where = f"records[{i}]"
    if not isinstance(raw, dict):
        raise errors.InvalidRequest(f"{where} must be an object", field=where)
    unknown = set(raw) - _RECORD_FIELDS
    if unknown:
        name = sorted(unknown)[0]
        raise errors.InvalidRequest(
            f"{where} has unknown field {name!r}; known: {', '.join(sorted(_RECORD_FIELDS))}",
            field=f"{where}.{name}",
        )
    partition = raw.get("partition")
    if partition is not None and (isinstance(partition, bool) or not isinstance(partition, int)):
        raise errors.InvalidRequest(
            f"{where}.partition must be an integer", field=f"{where}.partition"
        )
    timestamp = raw.get("timestamp")
    if timestamp is not None and (
        isinstance(timestamp, bool) or not isinstance(timestamp, int) or not 0 <= timestamp < 2**63
    ):
        raise errors.InvalidRequest(
            f"{where}.timestamp must be milliseconds since the epoch (integer >= 0)",
            field=f"{where}.timestamp",
        )
    delays = {}
    for name in ("deliver_at", "delay_ms"):  # delayed records: dmq/broker/delay.py
        value = raw.get(name)
        if value is not None and (
            isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < 2**63
        ):
            raise errors.InvalidRequest(
                f"{where}.{name} must be an integer >= 0 (ms)", field=f"{where}.{name}"
            )
        delays[name] = value
    return ProduceRecord(
        deliver_at_ms=delays["deliver_at"],
        delay_ms=delays["delay_ms"],
        key=_bytes(raw.get("key"), f"{where}.key", encoding),
        value=_bytes(raw.get("value"), f"{where}.value", encoding),
        headers=_headers(raw.get("headers"), f"{where}.headers", encoding),
        partition=default_partition if partition is None else partition,
        timestamp_ms=timestamp,
    )


def check_encoding(value: str | None, default: str = "string") -> str:
    encoding = default if value is None else value
    if encoding not in ENCODINGS:
        raise errors.InvalidRequest(
            f"value_encoding must be one of {', '.join(ENCODINGS)}", field="value_encoding"
        )
    return encoding


def _check_count(n: int, records_max: int) -> None:
    if n == 0:
        raise errors.InvalidRequest("the request holds no records", field="records")
    if n > records_max:
        raise errors.RecordTooLarge(
            f"{n} records in one request; produce_records_max is {records_max}",
            field="records",
            limit=records_max,
        )


def _loads(text: bytes, where: str) -> Any:
    """orjson first (1.7x the stdlib on a 1000-record body); what it refuses goes to
    json.loads, so the bodies accepted (NaN, integers past 64 bits, lone surrogates) and
    the error messages are the stdlib's, as before."""
    try:
        return orjson.loads(text)
    except orjson.JSONDecodeError:
        pass
    try:
        return json.loads(text)
    except (ValueError, UnicodeDecodeError) as exc:
        raise errors.InvalidRequest(f"{where} is not valid JSON: {exc}", field=where) from None


def parse_json_object(body: bytes, where: str = "body") -> dict[str, Any]:
    """A request body that must be one JSON object (an empty body is {})."""
    doc = _loads(body, where) if body else {}
    if not isinstance(doc, dict):
        raise errors.InvalidRequest(f"{where} must be a JSON object", field=where)
    return doc


def parse_json_body(
    body: bytes, records_max: int, default_encoding: str = "string"
) -> list[ProduceRecord]:
    """The body's own `value_encoding` wins; else the query's (`default_encoding`)."""
    records, producer = parse_json_produce(body, records_max, default_encoding)
    if producer is not None:
        raise errors.InvalidRequest("producer fields are not accepted here", field="producer_id")
    return records


PRODUCER_FIELDS = ("producer_id", "producer_epoch", "base_sequence")


def parse_json_produce(
    body: bytes,
    records_max: int,
    default_encoding: str = "string",
    default_partition: int | None = None,
) -> tuple[list[ProduceRecord], ProducerSequence | None]:
    """A JSON produce body: its records, and the idempotent producer's fields when given
    (all three of producer_id, producer_epoch, base_sequence, or none)."""
    doc = _loads(body, "body")
    if not isinstance(doc, dict) or not isinstance(doc.get("records"), list):
        raise errors.InvalidRequest('body must be {"records": [...]}', field="records")
    unknown = set(doc) - {"records", "value_encoding", *PRODUCER_FIELDS}
    if unknown:
        raise errors.InvalidRequest(
            f"unknown body field {sorted(unknown)[0]!r}", field=sorted(unknown)[0]
        )
    encoding = check_encoding(doc.get("value_encoding"), default_encoding)
    _check_count(len(doc["records"]), records_max)
    records = [
        parse_record(r, i, encoding, default_partition) for i, r in enumerate(doc["records"])
    ]
    given = [f for f in PRODUCER_FIELDS if doc.get(f) is not None]
    if not given:
        return records, None
    bounds = {"producer_id": 2**63 - 1, "producer_epoch": 2**15 - 1, "base_sequence": 2**31 - 1}
    for name in PRODUCER_FIELDS:
        value = doc.get(name)
        if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= bounds[name]:
            raise errors.InvalidRequest(
                f"{name} must be an integer in [0, {bounds[name]}] (give all of "
                f"{', '.join(PRODUCER_FIELDS)} or none)",
                field=name,
                limit=bounds[name],
            )
    return records, ProducerSequence(
        doc["producer_id"], doc["producer_epoch"], doc["base_sequence"]
    )


def parse_ndjson_body(
    body: bytes, records_max: int, encoding: str, default_partition: int | None = None
) -> list[ProduceRecord]:
    lines = [line for line in body.split(b"\n") if line.strip()]
    _check_count(len(lines), records_max)
    return [
        parse_record(_loads(line, f"line {i + 1}"), i, encoding, default_partition)
        for i, line in enumerate(lines)
    ]


def parse_text_body(
    body: bytes, records_max: int, default_partition: int | None = None
) -> list[ProduceRecord]:
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError:
        raise errors.InvalidRequest("text/plain body must be UTF-8", field="body") from None
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()  # a trailing newline ends the last line; it is not an empty record
    lines = [line[:-1] if line.endswith("\r") else line for line in lines]
    _check_count(len(lines), records_max)
    return [
        ProduceRecord(key=None, value=line.encode("utf-8"), partition=default_partition)
        for line in lines
    ]


def _text(data: bytes | None, offset: int, where: str, encoding: str) -> str | None:
    if data is None:
        return None
    if encoding == "base64":
        return base64.b64encode(data).decode("ascii")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        raise errors.NotAcceptable(
            f"the {where} of the record at offset {offset} is not UTF-8; ask with "
            "value_encoding=base64",
            field="value_encoding",
        ) from None


def record_to_json(record: Record, encoding: str) -> dict[str, Any]:
    return {
        "offset": record.offset,
        "timestamp": record.timestamp_ms,
        "key": _text(record.key, record.offset, "key", encoding),
        "value": _text(record.value, record.offset, "value", encoding),
        "headers": [
            {"key": h.key, "value": _text(h.value, record.offset, "header value", encoding)}
            for h in record.headers
        ],
    }


def json_response(payload: Any, status: int = 200) -> web.Response:
    """A compact JSON answer: every JSON route of http_api/ answers through this."""
    return web.Response(
        status=status,
        text=json.dumps(payload, separators=(",", ":")),
        content_type="application/json",
    )


@overload
def int_param(request: web.Request, name: str, default: int, minimum: int, maximum: int) -> int: ...
@overload
def int_param(
    request: web.Request, name: str, default: None, minimum: int, maximum: int
) -> int | None: ...
def int_param(
    request: web.Request, name: str, default: int | None, minimum: int, maximum: int
) -> int | None:
    """Query parameter `name` as an integer in [minimum, maximum]; `default` when absent
    (so never None with an int default: the overloads tell the type checker)."""
    raw = request.query.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = int(raw)
    except ValueError:
        raise errors.InvalidRequest(f"{name} must be an integer, got {raw!r}", field=name) from None
    if not minimum <= value <= maximum:
        raise errors.InvalidRequest(
            f"{name}={value} is outside [{minimum}, {maximum}]",
            field=name,
            limit=maximum if value > maximum else minimum,
        )
    return value


def only_fields(doc: dict[str, Any], known: set[str]) -> None:
    """Refuse a body with a field outside `known` (400 naming the first one)."""
    unknown = sorted(set(doc) - known)
    if unknown:
        raise errors.InvalidRequest(f"unknown field {unknown[0]!r}", field=unknown[0])


def fetch_limits(request: web.Request, config: BrokerConfig) -> tuple[int, int, int]:
    """A fetch's `max_records`, `max_bytes` and `wait_ms` query parameters, defaulted and
    bounded by the broker's config (partition fetches and group fetches alike)."""
    max_records = int_param(
        request,
        "max_records",
        min(limits.FETCH_RECORDS_DEFAULT, config.fetch_records_max),
        1,
        config.fetch_records_max,
    )
    max_bytes = int_param(
        request,
        "max_bytes",
        min(limits.FETCH_BYTES_DEFAULT, config.fetch_bytes_max),
        1,
        config.fetch_bytes_max,
    )
    wait_ms = int_param(request, "wait_ms", 0, 0, config.fetch_wait_ms_max)
    return max_records, max_bytes, wait_ms


def consistency_param(request: web.Request) -> Consistency:
    """`?consistency=linearizable|leader` of a fetch or an offsets read (default
    linearizable): dmq/README.md, "Read consistency"."""
    value = request.query.get("consistency") or "linearizable"
    if value not in CONSISTENCIES:
        raise errors.InvalidRequest(
            f"consistency must be one of {', '.join(CONSISTENCIES)}", field="consistency"
        )
    return value


def isolation_param(request: web.Request) -> Isolation:
    """`?isolation=read_uncommitted|read_committed` of a fetch (default read_uncommitted,
    as Kafka's): dmq/broker/transactions.py."""
    value = request.query.get("isolation") or "read_uncommitted"
    if value not in ISOLATIONS:
        raise errors.InvalidRequest(
            f"isolation must be one of {', '.join(ISOLATIONS)}", field="isolation"
        )
    return value  # type: ignore[return-value]
