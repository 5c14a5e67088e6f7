"""The aiohttp application: routes and thin handlers over the services of dmq.broker.Broker.

Each handler parses and bounds its inputs, calls one method of one service
(`broker.topics`, `broker.produce`, `broker.fetch`, `broker.cluster`) and encodes the
answer. The routes and bodies are documented in http_api/README.md and served as
OpenAPI at /openapi.json.
"""

from __future__ import annotations

import json
import warnings
from typing import Any, Literal

from aiohttp import web

from dmq import errors
from dmq.broker import Acks, Broker, Consistency, FetchResult, TopicDescription
from dmq.internal_auth import ReplayCache
from dmq.topics import TOPIC_CONFIG_KEYS
from dmq.types import PARTITION_COUNT_HEADER
from http_api import auth, codec, transactions
from http_api.auth import AUTH_ROUTES, may
from http_api.console import CONSOLE_ROUTES
from http_api.delay import (
    DELAY_ROUTES,
    delay_requested,
    produce_delayed,
    produce_delayed_batch,
)
from http_api.edge import edge_middleware
from http_api.errors import REQUEST_BYTES_MAX
from http_api.features import FEATURE_ROUTES
from http_api.filtering import filtered_batch_response, record_filter
from http_api.forward import (
    BROKER,
    broker_of,
    forwarded_hops,
    is_forwarded,
)
from http_api.groups import GROUP_ROUTES
from http_api.identity import IDENTITY_ROUTES
from http_api.internal_auth import SIGNATURES_SEEN
from http_api.metrics import METRICS_ROUTES
from http_api.openapi import openapi_document
from http_api.operations import OPERATIONS_ROUTES
from http_api.request_guard import Router, expect_100
from http_api.rest_v2 import REST_V2_ROUTES
from http_api.sendfile import FileRangesResponse
from http_api.share import SHARE_ROUTES

BATCH_CONTENT_TYPE = "application/vnd.dmq.batch"
BOOL_CONFIG_KEYS = frozenset(k for k, spec in TOPIC_CONFIG_KEYS.items() if spec.kind == "bool")
BATCHES_CONTENT_TYPE = "application/vnd.dmq.batches"


def _partition_param(request: web.Request) -> int:
    raw = request.match_info["partition"]
    if not (raw.isascii() and raw.isdigit()):  # "²".isdigit() is True; int("²") fails
        raise errors.InvalidRequest(
            f"partition must be a non-negative integer, got {raw!r}", field="partition"
        )
    return int(raw)


async def _json_body(request: web.Request) -> dict[str, Any]:
    return codec.parse_json_object(await request.read())


def _typed_config(config: dict[str, Any]) -> dict[str, Any]:
    """A topic's config with JSON booleans where the key is one. The catalogue keeps
    "true"/"false" strings (its replicated form, unchanged across releases), which made a
    reader of the API compare strings to tell whether tiered storage is on."""
    return {
        key: value == "true" if key in BOOL_CONFIG_KEYS and isinstance(value, str) else value
        for key, value in config.items()
    }


def _description(d: TopicDescription) -> dict[str, Any]:
    return {
        "name": d.name,
        "replication_factor": d.replication_factor,
        "config": _typed_config(dict(d.config)),
        "partitions": [
            {
                "partition": p.partition,
                "leader": p.leader,
                "replicas": list(p.replicas),
                "log_start_offset": p.log_start_offset,
                "high_watermark": p.high_watermark,
                "log_end_offset": p.log_end_offset,
                "status": p.status,
                "remote_end_offset": p.remote_end_offset,
                "local_bytes": p.local_bytes,
                "remote_bytes": p.remote_bytes,
            }
            for p in d.partitions
        ],
    }


def _optional_int(doc: dict[str, Any], name: str) -> int | None:
    value = doc.get(name)
    if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
        raise errors.InvalidRequest(f"{name} must be an integer", field=name)
    return value


# ---------------------------------------------------------------------- probes


async def healthz(request: web.Request) -> web.Response:
    return codec.json_response({"status": "ok"})


async def readyz(request: web.Request) -> web.Response:
    broker = broker_of(request)
    if not broker.ready:
        raise errors.BrokerUnavailable("not ready", retry_after_ms=1000)
    # Ready even with a full disk: it serves reads, deletes and groups (produce gets 507).
    return codec.json_response({"status": "ready", "storage": broker.storage.report()})


async def openapi(request: web.Request) -> web.Response:
    return codec.json_response(openapi_document(broker_of(request).config))


async def cluster(request: web.Request) -> web.Response:
    return codec.json_response(broker_of(request).cluster.cluster())


# ---------------------------------------------------------------------- topics


async def list_topics(request: web.Request) -> web.Response:
    broker = broker_of(request)
    await broker.topics.metadata_barrier(request.query.get("consistency"))
    topics = [t for t in broker.topics.list_topics() if may(request, "topic", t.name, "describe")]
    return codec.json_response(
        {
            "topics": [
                {
                    "name": t.name,
                    "partitions": t.partitions,
                    "replication_factor": t.replication_factor,
                }
                for t in topics
            ]
        }
    )


async def create_topic(request: web.Request) -> web.Response:
    doc = await _json_body(request)
    codec.only_fields(doc, {"name", "partitions", "replication_factor", "config"})
    name = doc.get("name")
    if not isinstance(name, str):
        raise errors.InvalidRequest("name must be a string", field="name")
    description = await broker_of(request).topics.create_topic(
        name,
        partitions=_optional_int(doc, "partitions"),
        replication_factor=_optional_int(doc, "replication_factor"),
        config=doc.get("config"),
    )
    return codec.json_response(_description(description), status=201)


async def describe_topic(request: web.Request) -> web.Response:
    broker = broker_of(request)
    await broker.topics.metadata_barrier(request.query.get("consistency"))
    return codec.json_response(
        _description(broker.topics.describe_topic(request.match_info["topic"]))
    )


async def alter_topic_config(request: web.Request) -> web.Response:
    doc = await _json_body(request)
    if set(doc) != {"config"}:
        raise errors.InvalidRequest('body must be {"config": {...}}', field="config")
    description = await broker_of(request).topics.alter_topic_config(
        request.match_info["topic"], doc["config"]
    )
    return codec.json_response(_description(description))


async def add_partitions(request: web.Request) -> web.Response:
    doc = await _json_body(request)
    count = _optional_int(doc, "count")
    if count is None or set(doc) != {"count"}:
        raise errors.InvalidRequest('body must be {"count": <new total>}', field="count")
    description = await broker_of(request).topics.add_partitions(request.match_info["topic"], count)
    return codec.json_response(_description(description))


async def delete_topic(request: web.Request) -> web.Response:
    name = request.match_info["topic"]
    await broker_of(request).topics.delete_topic(name)
    return codec.json_response({"deleted": name})


# ---------------------------------------------------------------------- produce


def _acks(request: web.Request) -> Acks:
    acks = request.query.get("acks", "all")
    if acks not in ("0", "1", "all", "-1"):
        raise errors.InvalidRequest("acks must be 0, 1 or all", field="acks")
    return "all" if acks == "-1" else acks  # type: ignore[return-value]


def _no_delay_in_transaction(txn: object) -> None:
    """A delayed record is appended at its time, outside any transaction: refused."""
    if txn is not None:
        raise errors.InvalidRequest(
            "delayed records (deliver_at, delay_ms) cannot be part of a transaction",
            field="transactional_id",
        )


async def produce(request: web.Request) -> web.Response:
    broker = broker_of(request)
    topic = request.match_info["topic"]
    acks = _acks(request)
    partition = codec.int_param(request, "partition", None, 0, 2**31 - 1)
    content_type = request.content_type
    body = await request.read()
    records_max = broker.config.produce_records_max
    encoding = codec.check_encoding(request.query.get("value_encoding"))  # checked for every body
    producer = None
    if not broker.topics.exists(topic):  # auto-created: create on it too, as Kafka's
        auth.require(request, "topic", topic, "create")
    txn = transactions.produce_hook(request, broker)  # ?transactional_id=
    if content_type == BATCH_CONTENT_TYPE and delay_requested(request, []):  # http_api/delay.py
        _no_delay_in_transaction(txn)
        return await produce_delayed_batch(request, topic, body, partition, acks)
    if content_type == BATCH_CONTENT_TYPE:
        offsets = await broker.produce.produce_batch(
            topic, body, partition=partition, acks=acks, before_append=txn
        )
    else:
        if content_type == "application/json":
            records, producer = codec.parse_json_produce(body, records_max, encoding, partition)
        elif content_type == "application/x-ndjson":
            records = codec.parse_ndjson_body(body, records_max, encoding, partition)
        elif content_type == "text/plain":
            records = codec.parse_text_body(body, records_max, partition)
        else:
            raise errors.UnsupportedMediaType(
                f"Content-Type {content_type!r} is not one of application/json, "
                f"application/x-ndjson, text/plain, {BATCH_CONTENT_TYPE}",
                field="Content-Type",
            )
        if delay_requested(request, records):  # delayed records: http_api/delay.py
            _no_delay_in_transaction(txn)
            return await produce_delayed(request, topic, records, acks, producer)
        offsets = await broker.produce.produce(
            topic, records, acks=acks, producer=producer, before_append=txn
        )
    # Formatted by hand: json.dumps of 1000 small dicts costs more than the append.
    entries = []
    for run in offsets:
        prefix = f'{{"partition":{run.partition},"offset":'
        if run.base_offset is None:
            entries.append(",".join([prefix + "null}"] * run.count))
        else:
            start = run.base_offset
            entries.append(",".join([f"{prefix}{o}}}" for o in range(start, start + run.count)]))
    count = broker.routing.partition_count(topic)
    return web.Response(
        status=202 if acks == "0" else 200,
        text='{"offsets":[' + ",".join(entries) + "]}",
        content_type="application/json",
        headers=None if count is None else {PARTITION_COUNT_HEADER: str(count)},
    )


# ---------------------------------------------------------------------- fetch

Format = Literal["json", "ndjson", "binary"]
_ACCEPT_FORMATS = {
    "application/json": "json",
    "application/x-ndjson": "ndjson",
    BATCHES_CONTENT_TYPE: "binary",
}


def _format(request: web.Request) -> Format:
    explicit = request.query.get("format")
    if explicit is not None:
        if explicit not in ("json", "ndjson", "binary"):
            raise errors.InvalidRequest("format must be json, ndjson or binary", field="format")
        return explicit  # type: ignore[return-value]
    for part in request.headers.get("Accept", "").split(","):
        fmt = _ACCEPT_FORMATS.get(part.split(";")[0].strip())
        if fmt is not None:
            return fmt  # type: ignore[return-value]
    return "json"


async def _fetch_offset(
    request: web.Request, broker: Broker, topic: str, partition: int, consistency: Consistency
) -> int:
    timestamp = codec.int_param(request, "timestamp", None, 0, 2**63 - 1)
    raw = request.query.get("offset") or "earliest"  # empty means absent, as in int_param
    offset: int | Literal["earliest", "latest"]
    if raw in ("earliest", "latest"):
        offset = raw  # type: ignore[assignment]
    else:
        # Any int64: one below log_start_offset answers 416 with the valid range (README).
        offset = codec.int_param(request, "offset", 0, -(2**63), 2**63 - 1)
    return await broker.fetch.resolve_offset(
        topic,
        partition,
        offset=offset,
        timestamp_ms=timestamp,
        forwarded=is_forwarded(request),
        consistency=consistency,
    )


async def fetch(request: web.Request) -> web.StreamResponse:
    broker = broker_of(request)
    c = broker.config
    topic = request.match_info["topic"]
    partition = _partition_param(request)
    fmt = _format(request)
    encoding = codec.check_encoding(request.query.get("value_encoding"))
    max_records, max_bytes, wait_ms = codec.fetch_limits(request, c)
    kept = record_filter(request, c)
    consistency = codec.consistency_param(request)
    offset = await _fetch_offset(request, broker, topic, partition, consistency)
    result = await broker.fetch.fetch(
        topic,
        partition,
        offset=offset,
        max_bytes=max_bytes,
        max_records=max_records,
        wait_ms=wait_ms,
        raw=fmt == "binary",
        forwarded=is_forwarded(request),
        record_filter=kept,
        isolation=codec.isolation_param(request),
        consistency=consistency,
    )
    if fmt == "binary" and kept is not None:  # the kept records as one batch
        return filtered_batch_response(result, _offset_headers(result))
    if fmt == "binary":
        return await _send_raw(request, result)
    records = [codec.record_to_json(r, encoding) for r in result.records]
    if fmt == "ndjson":
        text = "".join(json.dumps(r, separators=(",", ":")) + "\n" for r in records)
        return web.Response(
            text=text,
            content_type="application/x-ndjson",
            headers=_offset_headers(result) | transactions.isolation_headers(result),
        )
    return codec.json_response(
        {
            "topic": topic,
            "partition": partition,
            "next_offset": result.next_offset,
            "high_watermark": result.high_watermark,
            "log_start_offset": result.log_start_offset,
            "last_stable_offset": result.last_stable_offset,
            "records": records,
        }
    )


def _offset_headers(result: FetchResult) -> dict[str, str]:
    return {
        "X-Dmq-Next-Offset": str(result.next_offset),
        "X-Dmq-High-Watermark": str(result.high_watermark),
        "X-Dmq-Log-Start-Offset": str(result.log_start_offset),
    }


async def _send_raw(request: web.Request, result: FetchResult) -> web.StreamResponse:
    raw = result.raw
    headers = _offset_headers(result) | transactions.isolation_headers(result)
    if raw is None:  # a wait cut short by a shutdown or a moved replica: no batches
        return web.Response(body=b"", content_type=BATCHES_CONTENT_TYPE, headers=headers)
    # aiohttp calls prepare() after the handler returns; the response closes the
    # read's descriptors once the body is sent (or the connection is gone).
    return FileRangesResponse(
        raw.ranges,
        content_type=BATCHES_CONTENT_TYPE,
        headers=headers,
        on_done=raw.close,
    )


async def init_producer(request: web.Request) -> web.Response:
    doc = codec.parse_json_object(await request.read())
    tid = doc.get("transactional_id")
    if set(doc) - {"transactional_id"}:
        raise errors.InvalidRequest("the body takes only transactional_id", field="body")
    if tid is not None and (not isinstance(tid, str) or not 1 <= len(tid) <= 249):
        raise errors.InvalidRequest(
            "transactional_id must be a string of 1-249 characters", field="transactional_id"
        )
    broker = broker_of(request)
    broker.groups.route(forwarded_hops(request))  # the metadata leader answers, as for groups
    producer_id, epoch = await broker.produce.init_producer(tid or "")
    return codec.json_response({"producer_id": producer_id, "producer_epoch": epoch}, status=201)


async def list_offsets(request: web.Request) -> web.Response:
    partition = _partition_param(request)
    timestamp = codec.int_param(request, "timestamp", None, 0, 2**63 - 1)
    result = await broker_of(request).fetch.list_offsets(
        request.match_info["topic"],
        partition,
        timestamp,
        forwarded=is_forwarded(request),
        consistency=codec.consistency_param(request),
    )
    return codec.json_response(
        {
            "partition": result.partition,
            "log_start_offset": result.log_start_offset,
            "high_watermark": result.high_watermark,
            "offset": result.offset,
            "last_stable_offset": result.last_stable_offset,
        }
    )


# ---------------------------------------------------------------------- cluster


async def cluster_status(request: web.Request) -> web.Response:
    return codec.json_response(await broker_of(request).cluster.cluster_status())


# Internal routes: one broker calling another (dmq/peers.py). Not for clients.


async def internal_status(request: web.Request) -> web.Response:
    return codec.json_response(broker_of(request).cluster.local_status())


async def internal_append(request: web.Request) -> web.Response:
    partition = _partition_param(request)
    topic_id = codec.int_param(request, "topic_id", None, 1, 2**62)
    if topic_id is None:
        raise errors.InvalidRequest("topic_id is required", field="topic_id")
    append_time = codec.int_param(request, "log_append_time_ms", None, 0, 2**63 - 1)
    base_offset = await broker_of(request).produce.append_forwarded(
        request.match_info["topic"],
        topic_id,
        partition,
        await request.read(),
        acks=_acks(request),
        log_append_time_ms=append_time,
    )
    return codec.json_response({"base_offset": base_offset})


async def internal_batches(request: web.Request) -> web.Response:
    broker = broker_of(request)
    start = codec.int_param(request, "start_offset", None, 0, 2**63 - 1)
    end = codec.int_param(request, "end_offset", None, 0, 2**63 - 1)
    if start is None or end is None:
        raise errors.InvalidRequest(
            "start_offset and end_offset are required", field="start_offset"
        )
    data, next_offset = await broker.fetch.read_batches(
        request.match_info["topic"], _partition_param(request), start, end
    )
    return web.Response(
        body=data,
        content_type=BATCHES_CONTENT_TYPE,
        headers={"X-Dmq-Next-Offset": str(next_offset)},
    )


async def internal_metadata_propose(request: web.Request) -> web.Response:
    version = await broker_of(request).cluster.propose_metadata_forwarded(await request.read())
    return codec.json_response({"metadata_version": version})


async def internal_metadata(request: web.Request) -> web.Response:
    broker = broker_of(request)
    after = codec.int_param(request, "after_version", -1, -1, 2**63 - 1)
    wait_ms = codec.int_param(request, "wait_ms", 0, 0, broker.config.fetch_wait_ms_max)
    return codec.json_response(
        await broker.cluster.metadata_state_after(after, wait_ms, request.query.get("consistency"))
    )


async def internal_metadata_voters(request: web.Request) -> web.Response:
    return codec.json_response(await broker_of(request).cluster.metadata_voters_view())


# ---------------------------------------------------------------------- app

ROUTES: tuple[tuple[str, str, Any], ...] = (
    ("GET", "/healthz", healthz),
    ("GET", "/readyz", readyz),
    ("GET", "/openapi.json", openapi),
    *METRICS_ROUTES,  # Prometheus text format, outside /v1 and OpenAPI (http_api/metrics.py)
    ("GET", "/v1/cluster", cluster),
    ("GET", "/v1/cluster/status", cluster_status),
    ("GET", "/v1/topics", list_topics),
    ("POST", "/v1/topics", create_topic),
    ("GET", "/v1/topics/{topic}", describe_topic),
    ("DELETE", "/v1/topics/{topic}", delete_topic),
    ("PATCH", "/v1/topics/{topic}/config", alter_topic_config),
    ("POST", "/v1/topics/{topic}/partitions", add_partitions),
    ("POST", "/v1/topics/{topic}/records", produce),
    ("GET", "/v1/topics/{topic}/partitions/{partition}/records", fetch),
    ("GET", "/v1/topics/{topic}/partitions/{partition}/offsets", list_offsets),
    *GROUP_ROUTES,
    *SHARE_ROUTES,
    *DELAY_ROUTES,
    *transactions.TRANSACTION_ROUTES,
    ("POST", "/v1/producers", init_producer),
    ("GET", "/v1/internal/status", internal_status),
    ("POST", "/v1/internal/partitions/{topic}/{partition}/append", internal_append),
    ("GET", "/v1/internal/partitions/{topic}/{partition}/batches", internal_batches),
    ("POST", "/v1/internal/metadata/propose", internal_metadata_propose),
    ("GET", "/v1/internal/metadata", internal_metadata),
    ("GET", "/v1/internal/metadata/voters", internal_metadata_voters),
    *OPERATIONS_ROUTES,
    *IDENTITY_ROUTES,
    *FEATURE_ROUTES,  # feature levels, finalize (http_api/features.py)
    *CONSOLE_ROUTES,  # the web console's static files at /ui/ (http_api/console/)
    *REST_V2_ROUTES,  # Confluent REST Proxy v2, outside /v1 (http_api/rest_v2.py)
    *AUTH_ROUTES,  # users, ACLs, quotas (http_api/auth.py)
)


def make_app(broker: Broker) -> web.Application:
    with warnings.catch_warnings():
        # aiohttp 3 marks `router` deprecated (a 4.0 may drop it: a TypeError here then says
        # so); it is the one way to answer Expect on a request that matches no route.
        warnings.simplefilter("ignore", DeprecationWarning)
        app = web.Application(
            router=Router(),  # no route, no aiohttp Expect answer (http_api/request_guard.py)
            # Metrics, errors, internal signatures, auth (--auth on: credentials, ACLs,
            # quotas), the cluster id, relaying: one middleware, in that order (edge.py).
            middlewares=[edge_middleware],
            client_max_size=broker.config.request_bytes_max,
        )
    app[BROKER] = broker
    app[REQUEST_BYTES_MAX] = broker.config.request_bytes_max
    app[SIGNATURES_SEEN] = ReplayCache(broker.config.signature_replay_entries_max)
    for method, path, handler in ROUTES:
        # aiohttp's own Expect answer can fail with a 500 (http_api/request_guard.py)
        app.router.add_route(method, path, handler, expect_handler=expect_100)
    return app
