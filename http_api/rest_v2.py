"""Confluent REST Proxy v2 routes, as Redpanda's HTTP proxy offers them (http_api/README.md,
"Confluent REST Proxy v2", has the table of routes and differences).

Thin handlers: check the content types, parse and bound the input, call one service
(`broker.topics`, `broker.produce`, `broker.fetch` or `broker.rest_v2`, the consumer
instances of dmq/broker/rest_v2.py), encode. Errors leave in the proxy's shape,
{"error_code": 40401, "message": "..."}, not dmq's: `_v2` translates them. Consumer-instance
routes are answered by the metadata leader (relayed there, like the /v1 group routes).
"""

from __future__ import annotations

import base64
import binascii
import functools
import json
import math
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web

from dmq import errors, limits
from dmq.broker import Broker, ProduceRecord
from dmq.broker.rest_v2 import ConsumerInstance, FetchedRecord
from dmq.broker.types import PartitionInfo
from http_api import auth, codec
from http_api.auth import may
from http_api.errors import status_for
from http_api.forward import BROKER, is_forwarded
from http_api.groups import _name, _routed, _subscription

V2 = "application/vnd.kafka.v2+json"
V2_JSON = "application/vnd.kafka.json.v2+json"
V2_BINARY = "application/vnd.kafka.binary.v2+json"
# Less specific types the proxy also takes ("if the embedded format is omitted, binary is
# assumed"), and answers in when they are all the client accepts.
_GENERIC = ("application/vnd.kafka+json", "application/json")
_PRODUCE_TYPES = {V2_JSON: "json", V2_BINARY: "binary", V2: "binary"} | dict.fromkeys(
    _GENERIC, "binary"
)
_FORMAT_TYPES = {"binary": V2_BINARY, "json": V2_JSON}
_CONSUMER_CONFIG = ("format", "auto.offset.reset", "auto.commit.enable",
                    "consumer.request.timeout.ms", "fetch.min.bytes")  # fmt: skip
INT32_MAX = 2**31 - 1
INT64_MAX = 2**63 - 1

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


# ---------------------------------------------------------------------- errors


def _error_code(exc: errors.DmqError, status: int) -> int:
    """The proxy's error_code: its own for the cases it names, else the status (as its
    generic errors do), 50003 for a retriable Kafka-side failure, 50002 for others."""
    field = exc.details.get("field")
    specific: tuple[tuple[type[errors.DmqError], int], ...] = (
        (errors.ConsumerInstanceNotFound, 40403),
        (errors.ConsumerInstanceExists, 40902),
        (errors.TopicNotFound, 40401),
        (errors.PartitionNotFound, 40402),
    )
    for cls, code in specific:
        if isinstance(exc, cls):
            return code
    if isinstance(exc, errors.NotAcceptable) and field == "format":
        return 40601  # the Accept header names another embedded format than the instance's
    if isinstance(exc, errors.InvalidRequest) and field in _CONSUMER_CONFIG:
        return 42204  # invalid consumer configuration
    if isinstance(exc, errors.Backpressure):
        return 429
    if isinstance(exc, errors.RetriableError):
        return 50003
    return status if status < 500 else 50002


def error_response(
    status: int, error_code: int, message: str, headers: dict[str, str] | None = None
) -> web.Response:
    body = json.dumps({"error_code": error_code, "message": message})
    return web.Response(status=status, text=body, content_type=V2, headers=headers)


def _response_for(exc: errors.DmqError) -> web.Response:
    status = status_for(exc)
    if type(exc) is errors.InvalidRequest or isinstance(exc, errors.InvalidConfig):
        status = 422  # the proxy answers a body or parameter it cannot use with 422
    headers = None
    if isinstance(exc, errors.RetriableError):
        retry_ms = int(exc.details.get("retry_after_ms", exc.retry_after_ms))
        headers = {"Retry-After": str(max(1, math.ceil(retry_ms / 1000)))}
    return error_response(status, _error_code(exc, status), exc.message, headers)


def _v2(handler: Handler) -> Handler:
    """Errors in the proxy's shape. A relay (ForwardRequest) passes on to the middleware."""

    @functools.wraps(handler)
    async def wrapped(request: web.Request) -> web.StreamResponse:
        try:
            return await handler(request)
        except errors.DmqError as exc:
            return _response_for(exc)
        except web.HTTPRequestEntityTooLarge:
            limit = request.app[BROKER].config.request_bytes_max
            return error_response(413, 413, f"request body exceeds request_bytes_max {limit}")

    return wrapped


# ---------------------------------------------------------------------- content types


def _media_types(header: str) -> list[str]:
    return [part.split(";")[0].strip().lower() for part in header.split(",") if part.strip()]


def _answer_type(request: web.Request) -> str:
    """The content type of a metadata answer the client accepts (406 if none)."""
    accepted = _media_types(request.headers.get("Accept", "")) or ["*/*"]
    for kind in accepted:
        if kind in (V2, "*/*", "application/*"):
            return V2
        if kind in _GENERIC:
            return kind
    raise errors.NotAcceptable(f"Accept names none of {V2}, {', '.join(_GENERIC)}", field="Accept")


def _check_body_type(request: web.Request, body: bytes) -> None:
    """Bodies of the consumer routes: the v2 types or plain JSON (415 else). An empty body
    has nothing to read: any type (a relayed empty POST arrives as octet-stream)."""
    if not body:
        return
    if request.content_type not in (V2, V2_JSON, V2_BINARY, *_GENERIC):
        raise errors.UnsupportedMediaType(
            f"Content-Type {request.content_type!r} is not {V2} (or {', '.join(_GENERIC)})",
            field="Content-Type",
        )


def _json(doc: Any, content_type: str = V2, status: int = 200) -> web.Response:
    return web.Response(status=status, text=json.dumps(doc), content_type=content_type)


async def _body(request: web.Request) -> dict[str, Any]:
    raw = await request.read()
    _check_body_type(request, raw)
    return codec.parse_json_object(raw)


# ---------------------------------------------------------------------- topics


def _partition_json(p: PartitionInfo) -> dict[str, Any]:
    return {
        "partition": p.partition,
        "leader": p.leader,
        "replicas": [{"broker": r, "leader": r == p.leader, "in_sync": True} for r in p.replicas],
    }


def _partitions(broker: Broker, topic: str) -> list[PartitionInfo]:
    described = broker.topics.describe_topic(topic).partitions
    return [p for p in described if p.status != "gone"]


def _partition_number(raw: str, topic: str) -> int:
    """The {p} of a path: a partition number, else 404 (40402) as for a missing one."""
    if not (raw.isascii() and raw.isdigit()) or int(raw) > INT32_MAX:
        raise errors.PartitionNotFound(f"partition {raw!r} of topic {topic!r} not found")
    return int(raw)


def _partition(broker: Broker, topic: str, raw: str) -> PartitionInfo:
    partitions = _partitions(broker, topic)  # an unknown topic is 40401 first
    number = _partition_number(raw, topic)
    for p in partitions:
        if p.partition == number:
            return p
    raise errors.PartitionNotFound(f"partition {raw!r} of topic {topic!r} not found")


@_v2
async def list_topics(request: web.Request) -> web.Response:
    kind = _answer_type(request)
    topics = request.app[BROKER].topics.list_topics()
    return _json([t.name for t in topics if may(request, "topic", t.name, "describe")], kind)


@_v2
async def get_topic(request: web.Request) -> web.Response:
    kind = _answer_type(request)
    described = request.app[BROKER].topics.describe_topic(request.match_info["topic"])
    configs = {k: v if isinstance(v, str) else json.dumps(v) for k, v in described.config.items()}
    partitions = [_partition_json(p) for p in described.partitions if p.status != "gone"]
    return _json({"name": described.name, "configs": configs, "partitions": partitions}, kind)


@_v2
async def get_partitions(request: web.Request) -> web.Response:
    kind = _answer_type(request)
    found = _partitions(request.app[BROKER], request.match_info["topic"])
    return _json([_partition_json(p) for p in found], kind)


@_v2
async def get_partition(request: web.Request) -> web.Response:
    kind = _answer_type(request)
    found = _partition(request.app[BROKER], request.match_info["topic"], request.match_info["p"])
    return _json(_partition_json(found), kind)


@_v2
async def get_partition_offsets(request: web.Request) -> web.Response:
    kind = _answer_type(request)
    broker, topic = request.app[BROKER], request.match_info["topic"]
    p = _partition(broker, topic, request.match_info["p"]).partition
    found = await broker.fetch.partition_offsets(topic, p)
    return _json({"beginning_offset": found.log_start_offset, "end_offset": found.high_watermark},
                 kind)  # fmt: skip


@_v2
async def get_partition_records(request: web.Request) -> web.Response:
    """Redpanda's GET /topics/{topic}/partitions/{p}/records?offset=&timeout=&max_bytes=."""
    broker = request.app[BROKER]
    c = broker.config
    fmt = _accepted_format(request, None)
    topic = request.match_info["topic"]
    p = _partition(broker, topic, request.match_info["p"]).partition
    offset = codec.int_param(request, "offset", None, 0, INT64_MAX)
    if offset is None:
        raise errors.InvalidRequest("offset is required", field="offset")
    wait_ms, max_bytes = _fetch_params(request, c.fetch_wait_ms_max, c.fetch_bytes_max)
    result = await broker.fetch.fetch(
        topic, p, offset=offset, max_bytes=max_bytes, max_records=c.fetch_records_max,
        wait_ms=wait_ms or 0, raw=False, forwarded=is_forwarded(request),
    )  # fmt: skip
    found = [FetchedRecord(topic, p, r) for r in result.records]
    return _json([_record_json(r, fmt) for r in found], _FORMAT_TYPES[fmt])


# ---------------------------------------------------------------------- produce


def _embedded(value: Any, fmt: str, where: str) -> bytes | None:
    if value is None:
        return None
    if fmt == "json":
        return json.dumps(value, separators=(",", ":")).encode()
    if not isinstance(value, str):
        raise errors.InvalidRequest(f"{where} must be a base64 string or null", field=where)
    try:
        return base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError):
        raise errors.InvalidRequest(f"{where} is not valid base64", field=where) from None


def _produce_records(
    doc: dict[str, Any], fmt: str, with_partition: bool, records_max: int
) -> list[ProduceRecord]:
    codec.only_fields(
        doc, {"records", "key_schema", "value_schema", "key_schema_id", "value_schema_id"}
    )
    for name in ("key_schema", "value_schema", "key_schema_id", "value_schema_id"):
        if doc.get(name) is not None:
            raise errors.InvalidRequest(
                f"{name}: schemas need the avro, protobuf or jsonschema formats, which dmq "
                "does not serve; use json or binary",
                field=name,
            )
    raw = doc.get("records")
    if not isinstance(raw, list) or not 1 <= len(raw) <= records_max:
        raise errors.InvalidRequest(
            f"records must be a list of 1 to {records_max} records (produce_records_max)",
            field="records", limit=records_max,
        )  # fmt: skip
    fields = {"key", "value", "partition"} if with_partition else {"key", "value"}
    out = []
    for i, record in enumerate(raw):
        where = f"records[{i}]"
        if not isinstance(record, dict) or set(record) - fields:
            raise errors.InvalidRequest(
                f"{where} must be an object of {', '.join(sorted(fields))}", field=where
            )
        partition = record.get("partition")
        if partition is not None and (
            isinstance(partition, bool)
            or not isinstance(partition, int)
            or not 0 <= partition <= INT32_MAX
        ):
            raise errors.InvalidRequest(
                f"{where}.partition must be an integer in [0, {INT32_MAX}]",
                field=f"{where}.partition", limit=INT32_MAX,
            )  # fmt: skip
        key = _embedded(record.get("key"), fmt, f"{where}.key")
        value = _embedded(record.get("value"), fmt, f"{where}.value")
        out.append(ProduceRecord(key, value, partition=partition))
    return out


async def _produce(request: web.Request, partition: int | None) -> web.Response:
    broker = request.app[BROKER]
    kind = _answer_type(request)
    fmt = _PRODUCE_TYPES.get(request.content_type)
    if fmt is None:
        raise errors.UnsupportedMediaType(
            f"Content-Type {request.content_type!r} is not {V2_JSON} or {V2_BINARY} (avro, "
            "protobuf and jsonschema are not served)",
            field="Content-Type",
        )
    doc = codec.parse_json_object(await request.read())
    records = _produce_records(doc, fmt, partition is None, broker.config.produce_records_max)
    if partition is not None:
        records = [ProduceRecord(r.key, r.value, partition=partition) for r in records]
    topic = request.match_info["topic"]
    if not broker.topics.exists(topic):  # auto-created: create on it too, as Kafka's
        auth.require(request, "topic", topic, "create")
    runs = await broker.produce.produce(topic, records, acks="all")
    offsets = [
        {"partition": run.partition, "offset": (run.base_offset or 0) + i,
         "error_code": None, "error": None}
        for run in runs
        for i in range(run.count)
    ]  # fmt: skip
    return _json({"offsets": offsets, "key_schema_id": None, "value_schema_id": None}, kind)


@_v2
async def produce_topic(request: web.Request) -> web.Response:
    return await _produce(request, None)


@_v2
async def produce_partition(request: web.Request) -> web.Response:
    number = _partition_number(request.match_info["p"], request.match_info["topic"])
    return await _produce(request, number)


# ---------------------------------------------------------------------- consumers


def _names(request: web.Request) -> tuple[str, str]:
    group = _name(request.match_info["group"], "group")
    return group, _name(request.match_info["instance"], "instance")


def _choice(doc: dict[str, Any], field: str, default: str, allowed: tuple[str, ...]) -> str:
    value = doc.get(field)
    if value is None:
        return default
    if isinstance(value, bool):  # "auto.commit.enable": true as well as "true"
        value = "true" if value else "false"
    if value not in allowed:
        raise errors.InvalidRequest(f"{field} must be one of {', '.join(allowed)}", field=field)
    return str(value)


def _int_setting(doc: dict[str, Any], field: str, default: int, high: int) -> int:
    value = doc.get(field)
    if value is None:
        return default
    text = str(value)
    if isinstance(value, bool) or not (text.isascii() and text.isdigit()) or int(text) > high:
        raise errors.InvalidRequest(
            f"{field} must be an integer in [0, {high}]", field=field, limit=high
        )
    return int(text)


@_v2
async def create_consumer(request: web.Request) -> web.Response:
    group = _name(request.match_info["group"], "group")
    kind = _answer_type(request)
    doc = await _body(request)
    codec.only_fields(doc, {"name", *_CONSUMER_CONFIG})
    name = doc.get("name")
    name = "" if name is None else _name(name, "name", limits.GROUP_NAME_CHARS_MAX)
    fmt: Any = _choice(doc, "format", "binary", ("binary", "json"))
    reset: Any = _choice(doc, "auto.offset.reset", "latest", ("earliest", "latest", "none"))
    commit = _choice(doc, "auto.commit.enable", "false", ("true", "false"))
    broker = _routed(request)
    timeout_ms = _int_setting(
        doc, "consumer.request.timeout.ms", limits.REST_V2_REQUEST_TIMEOUT_MS_DEFAULT,
        broker.config.fetch_wait_ms_max,
    )  # fmt: skip
    _int_setting(doc, "fetch.min.bytes", 0, INT32_MAX)  # taken, not used: fetches never wait
    instance = await broker.rest_v2.create(group, name, fmt, reset, commit == "true", timeout_ms)
    base_uri = f"{request.scheme}://{request.host}/consumers/{group}/instances/{instance.name}"
    return _json({"instance_id": instance.name, "base_uri": base_uri}, kind)


@_v2
async def delete_consumer(request: web.Request) -> web.Response:
    group, name = _names(request)
    await _routed(request).rest_v2.delete(group, name)
    return web.Response(status=204)


@_v2
async def subscribe(request: web.Request) -> web.Response:
    group, name = _names(request)
    doc = await _body(request)
    codec.only_fields(doc, {"topics", "topic_pattern"})
    topics, pattern = _subscription(doc)
    await _routed(request).rest_v2.subscribe(group, name, topics, pattern)
    return web.Response(status=204)


@_v2
async def get_subscription(request: web.Request) -> web.Response:
    group, name = _names(request)
    kind = _answer_type(request)
    broker = _routed(request)
    instance = broker.rest_v2.instance(group, name)
    topics = list(instance.topics)
    if instance.topic_pattern:  # the topics the pattern matches now, as Kafka answers
        keep = auth.readable(request)
        topics = sorted({t for t, _ in broker.rest_v2.assignment(group, name) if keep(t)})
    return _json({"topics": topics}, kind)


@_v2
async def unsubscribe(request: web.Request) -> web.Response:
    group, name = _names(request)
    await _routed(request).rest_v2.unsubscribe(group, name)
    return web.Response(status=204)


@_v2
async def get_assignments(request: web.Request) -> web.Response:
    group, name = _names(request)
    kind = _answer_type(request)
    assigned = _routed(request).rest_v2.assignment(group, name)
    keep = auth.readable(request)  # a pattern matches only topics it may read
    rows = [{"topic": t, "partition": p} for t, p in assigned if keep(t)]
    return _json({"partitions": rows}, kind)


def _accepted_format(request: web.Request, instance: ConsumerInstance | None) -> str:
    """The embedded format of a records answer: the instance's (406 40601 if Accept names
    only the other one); without an instance, the one Accept names (binary by default)."""
    accepted = _media_types(request.headers.get("Accept", "")) or ["*/*"]
    wanted = instance.format if instance is not None else None
    for kind in accepted:
        if kind in ("*/*", "application/*", V2, *_GENERIC):
            return wanted or "binary"
        for fmt, fmt_type in _FORMAT_TYPES.items():
            if kind == fmt_type and wanted in (None, fmt):
                return fmt
    if any(kind in _FORMAT_TYPES.values() for kind in accepted):
        raise errors.NotAcceptable(
            f"the consumer instance's format is {wanted}: Accept {_FORMAT_TYPES[str(wanted)]}",
            field="format",
        )
    raise errors.NotAcceptable(f"Accept names none of {V2_BINARY}, {V2_JSON}", field="Accept")


def _fetch_params(request: web.Request, wait_max: int, bytes_max: int) -> tuple[int | None, int]:
    """timeout and max_bytes, capped by the broker's limits as the proxy caps them by its
    consumer.request.timeout.ms and consumer.request.max.bytes."""
    wait_ms = codec.int_param(request, "timeout", None, 0, INT64_MAX)
    max_bytes = codec.int_param(request, "max_bytes", bytes_max, 1, INT64_MAX)
    return None if wait_ms is None else min(wait_ms, wait_max), min(max_bytes, bytes_max)


def _record_json(r: FetchedRecord, fmt: str) -> dict[str, Any]:
    def embedded(data: bytes | None, what: str) -> Any:
        if data is None:
            return None
        if fmt == "binary":
            return base64.b64encode(data).decode("ascii")
        try:
            return json.loads(data)
        except ValueError:
            raise errors.NotAcceptable(
                f"the {what} at {r.topic}/{r.partition} offset {r.record.offset} is not JSON: "
                "consume it with format binary",
                field="format",
            ) from None

    return {
        "topic": r.topic,
        "key": embedded(r.record.key, "key"),
        "value": embedded(r.record.value, "value"),
        "partition": r.partition,
        "offset": r.record.offset,
    }


@_v2
async def get_records(request: web.Request) -> web.Response:
    group, name = _names(request)
    broker = _routed(request)
    c = broker.config
    instance = broker.rest_v2.instance(group, name)
    fmt = _accepted_format(request, instance)
    wait_ms, max_bytes = _fetch_params(request, c.fetch_wait_ms_max, c.fetch_bytes_max)
    for topic in instance.topics:  # named at the subscription: an ACL removed since
        auth.require(request, "topic", topic, "read")
    found = await broker.rest_v2.fetch(
        group, name, wait_ms, max_bytes, lambda r: _record_json(r, fmt), auth.readable(request)
    )
    return _json(found, _FORMAT_TYPES[fmt])


def _topic_partitions(
    doc: dict[str, Any], field: str, with_offset: bool
) -> tuple[tuple[str, int, int], ...]:
    items = doc.get(field)
    limit = limits.OFFSETS_PER_COMMIT_MAX
    shape = "{topic, partition, offset}" if with_offset else "{topic, partition}"
    if not isinstance(items, list) or not 1 <= len(items) <= limit:
        raise errors.InvalidRequest(
            f"{field} must be a list of 1 to {limit} {shape}", field=field, limit=limit
        )
    out = []
    for i, item in enumerate(items):
        where = f"{field}[{i}]"
        required = {"topic", "partition", "offset"} if with_offset else {"topic", "partition"}
        known = required | {"metadata"} if with_offset else required
        if not isinstance(item, dict) or set(item) - known or required - set(item):
            raise errors.InvalidRequest(f"{where} must be {shape}", field=where)
        topic = _name(item["topic"], f"{where}.topic", limits.TOPIC_NAME_CHARS_MAX)
        partition = _int_setting(item, "partition", 0, INT32_MAX)
        offset = _int_setting(item, "offset", 0, INT64_MAX - 1) if with_offset else 0
        out.append((topic, partition, offset))
    return tuple(out)


@_v2
async def commit_offsets(request: web.Request) -> web.Response:
    """An empty body commits every record fetched; given offsets are those of the last
    records processed, and the group's committed offset becomes offset + 1 (as the proxy
    commits them: the next record to read)."""
    group, name = _names(request)
    doc = await _body(request)
    codec.only_fields(doc, {"offsets", "partitions"})  # Redpanda documents "partitions"
    field = "partitions" if "partitions" in doc else "offsets"
    offsets = None
    if doc:
        given = _topic_partitions(doc, field, with_offset=True)
        offsets = tuple((t, p, o + 1) for t, p, o in given)
    await _routed(request).rest_v2.commit(group, name, offsets)
    return web.Response(status=200)


@_v2
async def get_offsets(request: web.Request) -> web.Response:
    group, name = _names(request)
    kind = _answer_type(request)
    doc = await _body(request)
    codec.only_fields(doc, {"partitions"})
    partitions = tuple((t, p) for t, p, _ in _topic_partitions(doc, "partitions", False))
    found = await _routed(request).rest_v2.committed(group, name, partitions)
    rows = [{"topic": t, "partition": p, "offset": o, "metadata": ""}
            for t, p, o in found if o is not None]  # fmt: skip
    return _json({"offsets": rows}, kind)


@_v2
async def seek(request: web.Request) -> web.Response:
    group, name = _names(request)
    doc = await _body(request)
    codec.only_fields(doc, {"offsets"})
    offsets = _topic_partitions(doc, "offsets", with_offset=True)
    await _routed(request).rest_v2.seek(group, name, offsets)
    return web.Response(status=204)


def _seek_edge(edge: str) -> Handler:
    @_v2
    async def handler(request: web.Request) -> web.Response:
        group, name = _names(request)
        doc = await _body(request)
        codec.only_fields(doc, {"partitions"})
        partitions = tuple((t, p) for t, p, _ in _topic_partitions(doc, "partitions", False))
        await _routed(request).rest_v2.seek_edge(group, name, partitions, edge)  # type: ignore[arg-type]
        return web.Response(status=204)

    return handler


_INSTANCE = "/consumers/{group}/instances/{instance}"

REST_V2_ROUTES: tuple[tuple[str, str, Any], ...] = (
    ("GET", "/topics", list_topics),
    ("GET", "/topics/{topic}", get_topic),
    ("POST", "/topics/{topic}", produce_topic),
    ("GET", "/topics/{topic}/partitions", get_partitions),
    ("GET", "/topics/{topic}/partitions/{p}", get_partition),
    ("POST", "/topics/{topic}/partitions/{p}", produce_partition),
    ("GET", "/topics/{topic}/partitions/{p}/offsets", get_partition_offsets),
    ("GET", "/topics/{topic}/partitions/{p}/records", get_partition_records),
    ("POST", "/consumers/{group}", create_consumer),
    ("DELETE", _INSTANCE, delete_consumer),
    ("POST", _INSTANCE + "/subscription", subscribe),
    ("GET", _INSTANCE + "/subscription", get_subscription),
    ("DELETE", _INSTANCE + "/subscription", unsubscribe),
    ("GET", _INSTANCE + "/assignments", get_assignments),
    ("GET", _INSTANCE + "/records", get_records),
    ("POST", _INSTANCE + "/offsets", commit_offsets),
    ("GET", _INSTANCE + "/offsets", get_offsets),
    ("POST", _INSTANCE + "/positions", seek),
    ("POST", _INSTANCE + "/positions/beginning", _seek_edge("beginning")),
    ("POST", _INSTANCE + "/positions/end", _seek_edge("end")),
)
