"""The OpenAPI 3.1 document of every route in http_api.app.ROUTES.

The document is built from the broker's configuration, so the bounds it states are
the ones the handlers enforce (max_records, wait_ms, records per request, the largest
max_record_bytes...). tests/http_api/test_http_openapi.py checks that it is a valid
OpenAPI 3.1 document and that its paths and methods are exactly the router's; the
schemathesis test then holds the running broker to it.

Shape: `openapi_document(config)` is one dict literal; small helpers build the
repeated parts (parameters, JSON bodies, error responses) and `_schemas` holds the
named schemas under components.
"""

from __future__ import annotations

from typing import Any

from dmq import __version__, limits
from dmq.config import BrokerConfig
from dmq.topics import TOPIC_CONFIG_KEYS
from http_api.operations import METADATA_VOTERS_LIST_MAX

JSON = "application/json"
NDJSON = "application/x-ndjson"
TEXT = "text/plain"
BATCH = "application/vnd.dmq.batch"  # http_api.app.BATCH_CONTENT_TYPE (app imports us)
BATCHES = "application/vnd.dmq.batches"  # http_api.app.BATCHES_CONTENT_TYPE

INT64_MAX = 2**63 - 1
INT32_MAX = 2**31 - 1

# Status -> (description, the error codes it carries, whether it carries Retry-After).
# The codes are the `code` of the dmq.errors classes that http_api.errors.STATUS_TABLE
# maps to the status (a test checks the two agree), plus the middleware's own codes.
ERROR_STATUSES: dict[int, tuple[str, tuple[str, ...], bool]] = {
    400: (
        "malformed body or parameter",
        ("invalid_request", "invalid_config", "client_error"),
        False,
    ),
    404: (
        "no such topic, partition, group or route",
        ("topic_not_found", "partition_not_found", "group_not_found", "not_found"),
        False,
    ),
    401: (
        "an internal route without a valid broker signature (X-Dmq-Signature)",
        ("unauthenticated",),
        False,
    ),
    405: ("method not allowed on this path", ("method_not_allowed",), False),
    406: ("data that is not UTF-8 asked for as a string", ("not_acceptable",), False),
    409: (
        "the topic already exists; or a group member must rejoin (unknown_member), catch up "
        "(stale_generation), the group must be empty, or use the group's assignor",
        (
            "topic_already_exists",
            "group_conflict",
            "unknown_member",
            "stale_generation",
            "group_not_empty",
            "inconsistent_assignor",
            "producer_fenced",
            "out_of_order_sequence",
            "partition_decommissioned",
            "operation_conflict",
        ),
        False,
    ),
    410: (
        "the partition was decommissioned and removed (its number is never reused)",
        ("partition_gone",),
        False,
    ),
    413: (
        "record, key, headers, batch, record count or body over its limit",
        ("record_too_large",),
        False,
    ),
    415: ("unsupported Content-Type", ("unsupported_media_type",), False),
    416: ("offset outside [log_start_offset, log_end_offset]", ("offset_out_of_range",), False),
    429: ("a bounded queue is full; retry after Retry-After", ("backpressure",), True),
    500: ("the broker's data is broken, or a bug", ("storage_error", "internal_error"), False),
    503: (
        "not leader, starting or stopping",
        ("not_leader", "broker_unavailable", "retriable"),
        True,
    ),
    504: ("the operation did not complete in time", ("request_timeout",), True),
}


def openapi_document(config: BrokerConfig) -> dict[str, Any]:
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "dmq",
            "version": __version__,
            "description": "A distributed message queue: partitioned, replicated logs over "
            "HTTP/JSON. See http_api/README.md.",
        },
        "paths": _paths(config),
        "components": {
            "schemas": _schemas(config),
            "responses": {f"Error{status}": _error_response(status) for status in ERROR_STATUSES},
            "headers": {
                "Retry-After": {
                    "description": "seconds to wait before retrying",
                    "schema": {"type": "integer", "minimum": 1},
                },
                **{name: _offset_header(text) for name, text in _OFFSET_HEADERS.items()},
            },
        },
    }


def _paths(config: BrokerConfig) -> dict[str, Any]:
    from http_api.openapi_groups import group_paths  # it builds on this module's helpers

    return {
        **group_paths(config),
        "/healthz": {"get": _op("healthz", "The process is up", {"200": _ok("Status")})},
        "/readyz": {
            "get": _op(
                "readyz", "The broker serves requests", {"200": _ok("Status")}, errors=(503,)
            )
        },
        "/openapi.json": {"get": _op("openapi", "This document", {"200": _ok({"type": "object"})})},
        "/v1/cluster": {
            "get": _op("cluster", "Cluster id, brokers, this node", {"200": _ok("Cluster")})
        },
        "/v1/cluster/status": {
            "get": _op(
                "cluster_status",
                "Brokers, and per Raft group its leader, term, commit index and replica lag",
                {"200": _ok("ClusterStatus")},
                errors=(503,),
            )
        },
        **_internal_paths(config),
        **_operations_paths(),
        "/v1/topics": {
            "get": _op(
                "list_topics",
                "List topics",
                {"200": _ok("TopicList")},
                parameters=[_CONSISTENCY],
                errors=(400, 503),
            ),
            "post": _op(
                "create_topic",
                "Create a topic (only name is required)",
                {"201": _ok("TopicDescription", "the new topic")},
                body=_json_body("CreateTopicRequest"),
                errors=(400, 409, 413, 503),
            ),
        },
        "/v1/topics/{topic}": {
            "parameters": [_TOPIC],
            "get": _op(
                "describe_topic",
                "Config, placement and this broker's per-partition offsets",
                {"200": _ok("TopicDescription")},
                parameters=[_CONSISTENCY],
                errors=(400, 404, 503),
            ),
            "delete": _op(
                "delete_topic",
                "Delete a topic and its data",
                {"200": _ok("Deleted")},
                errors=(404, 503),
            ),
        },
        "/v1/topics/{topic}/config": {
            "parameters": [_TOPIC],
            "patch": _op(
                "alter_topic_config",
                "Update topic config keys",
                {"200": _ok("TopicDescription")},
                body=_json_body("AlterConfigRequest"),
                errors=(400, 404, 413, 503),
            ),
        },
        "/v1/topics/{topic}/partitions": {
            "parameters": [_TOPIC],
            "post": _op(
                "add_partitions",
                "Grow the topic to `count` partitions (the new total)",
                {"200": _ok("TopicDescription")},
                body=_json_body("AddPartitionsRequest"),
                errors=(400, 404, 413, 503),
            ),
        },
        "/v1/topics/{topic}/records": {"parameters": [_TOPIC], "post": _produce_op(config)},
        "/v1/topics/{topic}/partitions/{partition}/records": {
            "parameters": [_TOPIC, _PARTITION],
            "get": _fetch_op(config),
        },
        "/v1/topics/{topic}/partitions/{partition}/offsets": {
            "parameters": [_TOPIC, _PARTITION],
            "get": _op(
                "list_offsets",
                "Earliest and latest offsets; with `timestamp`, the first offset at or after it",
                {"200": _ok("Offsets")},
                parameters=[
                    _query("timestamp", _int(0, INT64_MAX), "milliseconds since the epoch")
                ],
                errors=(400, 404, 410, 503),
            ),
        },
    }


_CONSISTENCY = {
    "name": "consistency",
    "in": "query",
    "required": False,
    "schema": {"type": "string", "enum": ["local", "linearizable"], "default": "local"},
    "description": "local: this broker's applied catalogue; linearizable: after a read "
    "barrier through the metadata group",
}
_INTERNAL = (
    "Internal, broker to broker (dmq/peers.py); not for clients. With a cluster secret it "
    "needs an X-Dmq-Signature header (dmq/internal_auth.py), else 401 unauthenticated. "
)


def _internal_paths(config: BrokerConfig) -> dict[str, Any]:
    binary = {"application/octet-stream": {"schema": {"type": "string", "format": "binary"}}}
    return {
        "/v1/internal/status": {
            "get": _op(
                "internal_status",
                _INTERNAL + "This broker's replicas as its Raft groups see them",
                {"200": _ok(_object({}, closed=False))},
            )
        },
        "/v1/internal/partitions/{topic}/{partition}/append": {
            "parameters": [_TOPIC, _PARTITION],
            "post": _op(
                "internal_append",
                _INTERNAL + "Append a RecordBatch to a replica hosted here",
                {"200": _ok(_object({"base_offset": _or_null(_OFFSET)}, ("base_offset",)))},
                parameters=[
                    _query("topic_id", _int(1, 2**62), "the topic's id (required)"),
                    _query("acks", {"type": "string", "enum": ["0", "1", "all", "-1"]}, "acks"),
                    _query("log_append_time_ms", _int(0, INT64_MAX), "leader-stamped time"),
                ],
                body={"required": True, "content": binary},
                errors=(400, 404, 413, 429, 503, 504),
            ),
        },
        "/v1/internal/partitions/{topic}/{partition}/batches": {
            "parameters": [_TOPIC, _PARTITION],
            "get": _op(
                "internal_batches",
                _INTERNAL + "Committed raw batches [start_offset, end_offset) for catch-up",
                {
                    "200": {
                        "description": "concatenated batches; X-Dmq-Next-Offset: the offset "
                        "below which the replica holds nothing more (compaction gaps "
                        "included, never past its high watermark), where the next request starts",
                        "content": {BATCHES: {"schema": {"type": "string", "format": "binary"}}},
                    }
                },
                parameters=[
                    _query("start_offset", _int(0, INT64_MAX), "first offset (required)"),
                    _query("end_offset", _int(0, INT64_MAX), "end, exclusive (required)"),
                ],
                errors=(400, 404, 416, 503),
            ),
        },
        "/v1/internal/metadata/propose": {
            "post": _op(
                "internal_metadata_propose",
                _INTERNAL + "Commit an encoded metadata command (an observer's)",
                {"200": _ok(_object({"metadata_version": _OFFSET}, ("metadata_version",)))},
                body={"required": True, "content": binary},
                errors=(400, 404, 409, 413, 429, 503, 504),
            )
        },
        "/v1/internal/metadata/voters": {
            "get": _op(
                "internal_metadata_voters",
                _INTERNAL + "On the metadata leader only (503 elsewhere), after a read "
                "barrier: group 0's members and the catalogue (voters check their membership)",
                {"200": _ok(_object({}, closed=False))},
                errors=(503, 504),
            )
        },
        "/v1/internal/metadata": {
            "get": _op(
                "internal_metadata",
                _INTERNAL + "The catalogue, once newer than after_version (long-poll)",
                {"200": _ok(_object({"state": _object({}, closed=False)}, ("state",)))},
                parameters=[
                    _query("after_version", _int(-1, INT64_MAX, -1), "answer once newer"),
                    _query("wait_ms", _int(0, config.fetch_wait_ms_max, 0), "longest wait"),
                    _CONSISTENCY,
                ],
                errors=(400, 503, 504),
            )
        },
    }


def _operations_paths() -> dict[str, Any]:
    """Cluster operations (http_api/operations.py, dmq/operations.py)."""
    ids = {"type": "array", "items": {"type": "string", "minLength": 1}, "minItems": 1}
    reassign = _object(
        {"topic": {"type": "string"}, "partition": _int(0, 2**31 - 1), "replicas": ids},
        ("topic", "partition", "replicas"),
    )
    json_object = {"application/json": {"schema": _object({}, closed=False)}}
    group = {"parameters": [_TOPIC, _PARTITION]}
    topic_id = [_query("topic_id", _int(1, 2**62), "the topic's id (required)")]
    return {
        "/v1/cluster/reassignments": {
            "post": _op(
                "reassign_partition",
                "Move a partition's replicas to `replicas` (preferred leader first)",
                {"202": _ok(_object({}, closed=False), "the operation, as recorded")},
                body={"required": True, "content": {"application/json": {"schema": reassign}}},
                errors=(400, 404, 413, 503, 504),
            )
        },
        "/v1/cluster/metadata-voters": {
            "post": _op(
                "change_metadata_voters",
                "Change the metadata group's voters to `voters`, one broker at a time "
                "(added ones first); progress under `metadata_voters` in the operations",
                {"202": _ok(_object({}, closed=False), "the operation, as recorded")},
                body={
                    "required": True,
                    "content": {
                        "application/json": {
                            "schema": _object(
                                {"voters": {**ids, "maxItems": METADATA_VOTERS_LIST_MAX}},
                                ("voters",),
                            )
                        }
                    },
                },
                errors=(400, 409, 503, 504),
            )
        },
        "/v1/cluster/operations": {
            "get": _op(
                "cluster_operations",
                "Running reassignments (step, progress 0..1), decommissions and metadata voter changes",
                {"200": _ok(_object({}, closed=False))},
                errors=(503,),
            )
        },
        "/v1/topics/{topic}/partitions/{partition}/decommission": {
            "parameters": [_TOPIC, _PARTITION],
            "post": _op(
                "decommission_partition",
                "Stop the partition taking new records; it stays readable until retention "
                "empties it, then it is removed (its number is never reused)",
                {"202": _ok(_object({}, closed=False))},
                errors=(400, 404, 410, 503, 504),
            ),
        },
        "/v1/cluster/brokers/{broker_id}/decommission": {
            "parameters": [
                {"name": "broker_id", "in": "path", "required": True, "schema": {"type": "string"}}
            ],
            "post": _op(
                "decommission_broker",
                "Move every replica off the broker, then remove it from the cluster",
                {"202": _ok(_object({}, closed=False))},
                errors=(400, 404, 503, 504),
            ),
        },
        "/v1/internal/partitions/{topic}/{partition}/log": {
            **group,
            "get": _op(
                "internal_replica_log",
                _INTERNAL + "This broker's replica: whether it leads, its log's start and end",
                {"200": _ok(_object({}, closed=False))},
                parameters=topic_id,
                errors=(400, 404, 503),
            ),
        },
        "/v1/internal/partitions/{topic}/{partition}/progress": {
            **group,
            "get": _op(
                "internal_group_progress",
                _INTERNAL + "The partition leader's view of its group's members and logs",
                {"200": _ok(_object({}, closed=False))},
                parameters=topic_id,
                errors=(400, 404, 503),
            ),
        },
        "/v1/internal/partitions/{topic}/{partition}/membership": {
            **group,
            "post": _op(
                "internal_group_membership",
                _INTERNAL + "Add or remove one member of the group (on its leader)",
                {"200": _ok(_object({"changed": {"type": "boolean"}}, ("changed",)))},
                parameters=topic_id,
                body={"required": True, "content": json_object},
                errors=(400, 404, 413, 503, 504),
            ),
        },
        "/v1/internal/partitions/{topic}/{partition}/transfer": {
            **group,
            "post": _op(
                "internal_group_transfer",
                _INTERNAL + "Hand the group's leadership to a caught-up member",
                {"200": _ok(_object({"requested": {"type": "boolean"}}, ("requested",)))},
                parameters=topic_id,
                body={"required": True, "content": json_object},
                errors=(400, 404, 413, 503),
            ),
        },
    }


def _produce_op(config: BrokerConfig) -> dict[str, Any]:
    count_header = {
        "X-Dmq-Partition-Count": {
            "description": "the topic's partition count (keyed producers re-read the topic "
            "when it changes: added partitions move keys)",
            "schema": {"type": "string", "pattern": "^[0-9]+$"},
        }
    }
    produced = {**_ok("ProduceResponse"), "headers": count_header}
    return _op(
        "produce",
        "Append records; one offset per record, in request order",
        {"200": produced, "202": {**produced, "description": "acks=0: queued, offsets are null"}},
        parameters=[
            _query(
                "acks",
                {"type": "string", "enum": ["all", "1", "0", "-1"], "default": "all"},
                "when to answer: after commit (all, -1), after append (1), at once (0)",
            ),
            _query(
                "partition",
                _int(0, INT32_MAX),
                "send every record without its own to this partition",
            ),
            _query(
                "value_encoding",
                _ENCODING,
                "application/x-ndjson only: how keys and values are written",
            ),
        ],
        body={
            "required": True,
            "content": {
                JSON: {"schema": _ref("ProduceRequest")},
                NDJSON: {
                    "schema": {"type": "string", "description": "one ProduceRecord object per line"}
                },
                TEXT: {
                    "schema": {
                        "type": "string",
                        "description": "one record per line, the line is the value",
                    }
                },
                BATCH: {
                    "schema": {
                        "type": "string",
                        "format": "binary",
                        "description": "exactly one RecordBatch (log/README.md), stored as is",
                    }
                },
            },
        },
        errors=(400, 404, 409, 413, 415, 429, 503, 504),
    )


def _fetch_op(config: BrokerConfig) -> dict[str, Any]:
    headers = {name: {"$ref": f"#/components/headers/{name}"} for name in _OFFSET_HEADERS}
    return _op(
        "fetch",
        "Committed records from `offset` (long-polls up to wait_ms when there are none)",
        {
            "200": {
                "description": "records (json, ndjson) or whole raw batches (binary)",
                "headers": headers,
                "content": {
                    JSON: {"schema": _ref("FetchResponse")},
                    NDJSON: {
                        "schema": {"type": "string", "description": "one FetchedRecord per line"}
                    },
                    BATCHES: {
                        "schema": {
                            "type": "string",
                            "format": "binary",
                            "description": "whole batches; the first may start before offset",
                        }
                    },
                },
            }
        },
        parameters=_fetch_parameters(config),
        errors=(400, 404, 406, 410, 416, 429, 503),
    )


def _fetch_parameters(config: BrokerConfig) -> list[dict[str, Any]]:
    """The bounds are the handler's: http_api.app.fetch reads them from the config."""
    return [
        _query(
            "offset",
            {
                "anyOf": [
                    _int(-INT64_MAX - 1, INT64_MAX),
                    {"type": "string", "enum": ["earliest", "latest"]},
                ],
                "default": "earliest",
            },
            "first offset to read; outside [log_start_offset, log_end_offset] answers 416",
        ),
        _query(
            "timestamp",
            _int(0, INT64_MAX),
            "instead of offset: the first record at or after this time, ms",
        ),
        _query(
            "max_records",
            _int(
                1,
                config.fetch_records_max,
                min(limits.FETCH_RECORDS_DEFAULT, config.fetch_records_max),
            ),
            "most records in a json/ndjson answer",
        ),
        _query(
            "max_bytes",
            _int(
                1, config.fetch_bytes_max, min(limits.FETCH_BYTES_DEFAULT, config.fetch_bytes_max)
            ),
            "soft cap on the answer's size; at least one batch is returned",
        ),
        _query(
            "wait_ms",
            _int(0, config.fetch_wait_ms_max, 0),
            "long-poll: wait this long for a record",
        ),
        _query(
            "format",
            {"type": "string", "enum": ["json", "ndjson", "binary"], "default": "json"},
            "answer format (else chosen by Accept)",
        ),
        _query(
            "value_encoding",
            _ENCODING,
            "json/ndjson: how keys, values and header values are written",
        ),
    ]


# ---------------------------------------------------------------------- helpers


def _ref(name: str) -> dict[str, str]:
    return {"$ref": f"#/components/schemas/{name}"}


def _int(minimum: int, maximum: int, default: int | None = None) -> dict[str, Any]:
    schema: dict[str, Any] = {"type": "integer", "minimum": minimum, "maximum": maximum}
    if default is not None:
        schema["default"] = default
    return schema


def _query(name: str, schema: dict[str, Any], description: str) -> dict[str, Any]:
    return {
        "name": name,
        "in": "query",
        "required": False,
        "schema": schema,
        "description": description,
    }


_TOPIC = {
    "name": "topic",
    "in": "path",
    "required": True,
    "schema": {"$ref": "#/components/schemas/TopicName"},
}
_PARTITION = {
    "name": "partition",
    "in": "path",
    "required": True,
    "schema": {"type": "integer", "minimum": 0, "maximum": INT32_MAX},
}
_ENCODING = {"type": "string", "enum": ["string", "base64"], "default": "string"}
_OFFSET_HEADERS = {
    "X-Dmq-Next-Offset": "the offset to fetch next",
    "X-Dmq-High-Watermark": "first uncommitted offset of the partition",
    "X-Dmq-Log-Start-Offset": "first offset still in the log",
}


def _offset_header(description: str) -> dict[str, Any]:
    # Sent with ndjson and binary answers, whose bodies cannot carry the offsets; a
    # json answer has them in its body (OpenAPI cannot tie a header to one media type).
    return {
        "description": f"{description} (ndjson and binary answers)",
        "required": False,
        "schema": {"type": "integer", "minimum": 0},
    }


def _ok(schema: str | dict[str, Any], description: str = "success") -> dict[str, Any]:
    return {
        "description": description,
        "content": {JSON: {"schema": _ref(schema) if isinstance(schema, str) else schema}},
    }


def _json_body(schema: str) -> dict[str, Any]:
    return {"required": True, "content": {JSON: {"schema": _ref(schema)}}}


def _op(
    operation_id: str,
    summary: str,
    responses: dict[str, Any],
    *,
    parameters: list[dict[str, Any]] | None = None,
    body: dict[str, Any] | None = None,
    errors: tuple[int, ...] = (),
) -> dict[str, Any]:
    """One operation. Every operation may also answer 500; 413 needs a body."""
    op: dict[str, Any] = {"operationId": operation_id, "summary": summary}
    if parameters:
        op["parameters"] = parameters
    if body is not None:
        op["requestBody"] = body
    op["responses"] = {
        **responses,
        **{str(s): {"$ref": f"#/components/responses/Error{s}"} for s in sorted({*errors, 500})},
    }
    return op


def _error_response(status: int) -> dict[str, Any]:
    description, codes, retry = ERROR_STATUSES[status]
    schema = {
        "allOf": [
            _ref("Error"),
            {"properties": {"error": {"properties": {"code": {"enum": list(codes)}}}}},
        ]
    }
    response: dict[str, Any] = {"description": description, "content": {JSON: {"schema": schema}}}
    if retry:
        response["headers"] = {"Retry-After": {"$ref": "#/components/headers/Retry-After"}}
    return response


def _or_null(schema: dict[str, Any]) -> dict[str, Any]:
    """A body field the handler also takes as null, meaning its default."""
    return {"anyOf": [schema, {"type": "null"}]}


def _object(
    properties: dict[str, Any], required: tuple[str, ...] = (), closed: bool = True
) -> dict[str, Any]:
    """An object schema; `closed` where the handler refuses unknown fields."""
    schema: dict[str, Any] = {"type": "object", "properties": properties}
    if required:
        schema["required"] = list(required)
    if closed:
        schema["additionalProperties"] = False
    return schema


_NULLABLE_STRING = {"type": ["string", "null"]}
_OFFSET = {"type": "integer", "minimum": 0}


def _topic_config(config: BrokerConfig, *, for_request: bool) -> dict[str, Any]:
    """The topic config keys (dmq.topics.TOPIC_CONFIG_KEYS). Requests carry their
    bounds; a description states every key, with the values the topic has."""
    properties: dict[str, Any] = {}
    for key, spec in TOPIC_CONFIG_KEYS.items():
        if spec.kind == "choice":
            properties[key] = {"type": "string", "enum": list(spec.choices)}
        elif for_request:
            maximum = config.batch_bytes_max if key == "max_record_bytes" else spec.maximum
            properties[key] = _int(spec.minimum, maximum)
        else:
            properties[key] = {"type": "integer"}
    required = () if for_request else tuple(sorted(TOPIC_CONFIG_KEYS))
    return _object(properties, required, closed=for_request)


def _schemas(config: BrokerConfig) -> dict[str, Any]:
    from http_api.openapi_groups import group_schemas

    return {**_catalogue_schemas(config), **group_schemas(config)}


def _catalogue_schemas(config: BrokerConfig) -> dict[str, Any]:
    header = _object({"key": {"type": "string"}, "value": _NULLABLE_STRING}, ("key",))
    return {
        "Error": _object(
            {
                "error": _object(
                    {
                        "code": {"type": "string"},
                        "message": {"type": "string"},
                        "details": _object(
                            {
                                "field": {
                                    "type": "string",
                                    "description": "what is wrong, e.g. records[3].value",
                                },
                                "limit": {"type": "integer", "description": "the bound it broke"},
                                "offset": {"type": "integer"},
                                "log_start_offset": {"type": "integer"},
                                "log_end_offset": {"type": "integer"},
                                "path": {"type": "string"},
                                "retry_after_ms": {"type": "integer"},
                            },
                            closed=False,
                        ),
                    },
                    ("code", "message", "details"),
                )
            },
            ("error",),
        ),
        "Status": _object({"status": {"type": "string", "enum": ["ok", "ready"]}}, ("status",)),
        "Cluster": _object(
            {
                "cluster_id": {"type": "string"},
                "node_id": {"type": "string"},
                "metadata_voters": {"type": "array", "items": {"type": "string"}},
                "metadata_version": _OFFSET,
                "brokers": {"type": "array", "items": _ref("Broker")},
            },
            ("cluster_id", "node_id", "metadata_voters", "metadata_version", "brokers"),
        ),
        "Broker": _object(
            {
                "node_id": {"type": "string"},
                "http_addr": {"type": "string"},
                "raft_addr": {"type": "string"},
                "live": {"type": "boolean", "description": "heartbeat within the session"},
                "reachable": {"type": "boolean", "description": "answered this status call"},
            },
            ("node_id", "http_addr", "raft_addr", "live"),
        ),
        "ClusterStatus": _object(
            {
                "cluster_id": {"type": "string"},
                "node_id": {"type": "string"},
                "metadata_voters": {"type": "array", "items": {"type": "string"}},
                "metadata_version": _OFFSET,
                "brokers": {"type": "array", "items": _ref("Broker")},
                "groups": {
                    "type": "array",
                    "items": _object(
                        {
                            "group_id": _OFFSET,
                            "topic": _NULLABLE_STRING,
                            "partition": _or_null(_OFFSET),
                            "leader": _NULLABLE_STRING,
                            "term": _OFFSET,
                            "commit_index": _OFFSET,
                            "replicas": {
                                "type": "array",
                                "items": _object({}, closed=False),
                            },
                        },
                        ("group_id", "topic", "partition", "leader", "term", "replicas"),
                        closed=False,
                    ),
                },
            },
            ("cluster_id", "node_id", "brokers", "groups"),
        ),
        "TopicName": {
            "type": "string",
            "minLength": 1,
            "maxLength": limits.TOPIC_NAME_CHARS_MAX,
            "pattern": "^[a-zA-Z0-9._-]+$",
            "not": {"enum": [".", ".."]},
        },
        "TopicConfig": _topic_config(config, for_request=True),
        "TopicList": _object(
            {
                "topics": {
                    "type": "array",
                    "items": _object(
                        {
                            "name": {"type": "string"},
                            "partitions": {"type": "integer"},
                            "replication_factor": {"type": "integer"},
                        },
                        ("name", "partitions", "replication_factor"),
                    ),
                }
            },
            ("topics",),
        ),
        "CreateTopicRequest": _object(
            {
                "name": _ref("TopicName"),
                "partitions": _or_null(
                    _int(1, limits.PARTITIONS_PER_TOPIC_MAX, config.default_partitions)
                ),
                # At most one replica per broker.
                "replication_factor": _or_null(
                    _int(
                        1,
                        len(config.peer_addrs),
                        min(config.default_replication_factor, len(config.peer_addrs)),
                    )
                ),
                "config": _or_null(_ref("TopicConfig")),
            },
            ("name",),
        ),
        "AlterConfigRequest": _object({"config": _ref("TopicConfig")}, ("config",)),
        "AddPartitionsRequest": _object(
            {
                "count": {
                    **_int(2, limits.PARTITIONS_PER_TOPIC_MAX),
                    "description": "the new total, more than the current count",
                }
            },
            ("count",),
        ),
        "TopicDescription": _object(
            {
                "name": {"type": "string"},
                "replication_factor": {"type": "integer"},
                "config": _topic_config(config, for_request=False),
                "partitions": {
                    "type": "array",
                    "items": _object(
                        {
                            "partition": _OFFSET,
                            "leader": {
                                **_NULLABLE_STRING,
                                "description": "null while no leader is known",
                            },
                            "replicas": {"type": "array", "items": {"type": "string"}},
                            # null where this broker holds no replica of the partition
                            "log_start_offset": _or_null(_OFFSET),
                            "high_watermark": _or_null(_OFFSET),
                            "log_end_offset": _or_null(_OFFSET),
                            "status": {
                                "type": "string",
                                "enum": ["active", "decommissioned", "gone"],
                                "description": "decommissioned: no new records, readable; "
                                "gone: removed, its number never reused",
                            },
                        },
                        (
                            "partition",
                            "leader",
                            "replicas",
                            "log_start_offset",
                            "high_watermark",
                            "log_end_offset",
                            "status",
                        ),
                    ),
                },
            },
            ("name", "replication_factor", "config", "partitions"),
        ),
        "Deleted": _object({"deleted": {"type": "string"}}, ("deleted",)),
        "Header": header,
        "ProduceRecord": _object(
            {
                "key": {**_NULLABLE_STRING, "description": "null or missing: no key"},
                "value": {**_NULLABLE_STRING, "description": "null or missing: a tombstone"},
                "headers": {
                    "anyOf": [
                        {"type": "array", "items": _ref("Header")},
                        {"type": "object", "additionalProperties": _NULLABLE_STRING},
                        {"type": "null"},
                    ]
                },
                "partition": {"type": ["integer", "null"], "minimum": 0, "maximum": INT32_MAX},
                "timestamp": {
                    "type": ["integer", "null"],
                    "minimum": 0,
                    "maximum": INT64_MAX,
                    "description": "ms since the epoch; default: now",
                },
            }
        ),
        "ProduceRequest": _object(
            {
                "records": {
                    "type": "array",
                    "items": _ref("ProduceRecord"),
                    "minItems": 1,
                    "maxItems": config.produce_records_max,
                },
                "value_encoding": _or_null(_ENCODING),
                # An idempotent producer's batch (POST /v1/producers): all three or none,
                # and every record on one partition.
                "producer_id": _or_null(_int(0, INT64_MAX)),
                "producer_epoch": _or_null(_int(0, 32_767)),
                "base_sequence": _or_null(_int(0, 2**31 - 1)),
            },
            ("records",),
        ),
        "ProduceResponse": _object(
            {
                "offsets": {
                    "type": "array",
                    "items": _object(
                        {
                            "partition": _OFFSET,
                            "offset": {"type": ["integer", "null"], "minimum": 0},
                        },
                        ("partition", "offset"),
                    ),
                }
            },
            ("offsets",),
        ),
        "FetchedRecord": _object(
            {
                "offset": _OFFSET,
                "timestamp": {"type": "integer"},
                "key": _NULLABLE_STRING,
                "value": _NULLABLE_STRING,
                "headers": {
                    "type": "array",
                    "items": _object(
                        {"key": {"type": "string"}, "value": {"type": "string"}}, ("key", "value")
                    ),
                },
            },
            ("offset", "timestamp", "key", "value", "headers"),
        ),
        "FetchResponse": _object(
            {
                "topic": {"type": "string"},
                "partition": _OFFSET,
                "next_offset": _OFFSET,
                "high_watermark": _OFFSET,
                "log_start_offset": _OFFSET,
                "records": {"type": "array", "items": _ref("FetchedRecord")},
            },
            ("topic", "partition", "next_offset", "high_watermark", "log_start_offset", "records"),
        ),
        "Offsets": _object(
            {
                "partition": _OFFSET,
                "log_start_offset": _OFFSET,
                "high_watermark": _OFFSET,
                "offset": {"type": ["integer", "null"], "minimum": 0},
            },
            ("partition", "log_start_offset", "high_watermark", "offset"),
        ),
    }
