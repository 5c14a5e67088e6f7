"""The OpenAPI 3.1 document of every route in http_api.app.ROUTES.

The document is built from the broker's configuration, so the bounds it states are
the ones the handlers enforce (max_records, wait_ms, records per request, the largest
max_record_bytes...). tests/http_api/test_http_openapi.py checks that it is a valid
OpenAPI 3.1 document and that its paths and methods are exactly the router's; the
schemathesis test then holds the running broker to it.

Shape: `openapi_document(config)` is one dict literal; http_api/openapi_schema.py's
helpers build the repeated parts (parameters, JSON bodies, error responses) and
`_schemas` holds the named schemas under components, with openapi_groups' ones.
"""

from __future__ import annotations

from typing import Any

from dmq import __version__, limits
from dmq.config import BrokerConfig
from dmq.topics import TOPIC_CONFIG_KEYS
from http_api.openapi_groups import group_paths, group_schemas
from http_api.openapi_schema import (
    BATCH,
    BATCHES,
    CONSISTENCY_PARAMETER,
    ENCODING,
    ERROR_STATUSES,
    INT32_MAX,
    INT64_MAX,
    INTERNAL,
    JSON,
    NDJSON,
    NULLABLE_STRING,
    OFFSET,
    OFFSET_HEADERS,
    PARTITION_PARAMETER,
    TEXT,
    TOPIC_PARAMETER,
    error_response,
    error_schema,
    integer,
    json_body,
    object_schema,
    offset_header,
    ok,
    operation,
    or_null,
    query,
    ref,
)
from http_api.operations import METADATA_VOTERS_LIST_MAX

__all__ = ["ERROR_STATUSES", "openapi_document"]


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
            "responses": {f"Error{status}": error_response(status) for status in ERROR_STATUSES},
            "headers": {
                "Retry-After": {
                    "description": "seconds to wait before retrying",
                    "schema": {"type": "integer", "minimum": 1},
                },
                **{name: offset_header(text) for name, text in OFFSET_HEADERS.items()},
            },
        },
    }


def _paths(config: BrokerConfig) -> dict[str, Any]:
    return {
        **group_paths(config),
        "/healthz": {"get": operation("healthz", "The process is up", {"200": ok("Status")})},
        "/readyz": {
            "get": operation(
                "readyz", "The broker serves requests", {"200": ok("Status")}, errors=(503,)
            )
        },
        "/openapi.json": {
            "get": operation("openapi", "This document", {"200": ok({"type": "object"})})
        },
        "/v1/cluster": {
            "get": operation("cluster", "Cluster id, brokers, this node", {"200": ok("Cluster")})
        },
        "/v1/cluster/status": {
            "get": operation(
                "cluster_status",
                "Brokers, and per Raft group its leader, term, commit index and replica lag",
                {"200": ok("ClusterStatus")},
                errors=(503,),
            )
        },
        **_internal_paths(config),
        **_operations_paths(),
        "/v1/topics": {
            "get": operation(
                "list_topics",
                "List topics",
                {"200": ok("TopicList")},
                parameters=[CONSISTENCY_PARAMETER],
                errors=(400, 503),
            ),
            "post": operation(
                "create_topic",
                "Create a topic (only name is required)",
                {"201": ok("TopicDescription", "the new topic")},
                body=json_body("CreateTopicRequest"),
                errors=(400, 409, 413, 503),
            ),
        },
        "/v1/topics/{topic}": {
            "parameters": [TOPIC_PARAMETER],
            "get": operation(
                "describe_topic",
                "Config, placement and this broker's per-partition offsets",
                {"200": ok("TopicDescription")},
                parameters=[CONSISTENCY_PARAMETER],
                errors=(400, 404, 503),
            ),
            "delete": operation(
                "delete_topic",
                "Delete a topic and its data",
                {"200": ok("Deleted")},
                errors=(404, 503),
            ),
        },
        "/v1/topics/{topic}/config": {
            "parameters": [TOPIC_PARAMETER],
            "patch": operation(
                "alter_topic_config",
                "Update topic config keys",
                {"200": ok("TopicDescription")},
                body=json_body("AlterConfigRequest"),
                errors=(400, 404, 413, 503),
            ),
        },
        "/v1/topics/{topic}/partitions": {
            "parameters": [TOPIC_PARAMETER],
            "post": operation(
                "add_partitions",
                "Grow the topic to `count` partitions (the new total)",
                {"200": ok("TopicDescription")},
                body=json_body("AddPartitionsRequest"),
                errors=(400, 404, 413, 503),
            ),
        },
        "/v1/topics/{topic}/records": {
            "parameters": [TOPIC_PARAMETER],
            "post": _produce_op(config),
        },
        "/v1/topics/{topic}/partitions/{partition}/records": {
            "parameters": [TOPIC_PARAMETER, PARTITION_PARAMETER],
            "get": _fetch_op(config),
        },
        "/v1/topics/{topic}/partitions/{partition}/offsets": {
            "parameters": [TOPIC_PARAMETER, PARTITION_PARAMETER],
            "get": operation(
                "list_offsets",
                "Earliest and latest offsets; with `timestamp`, the first offset at or after it",
                {"200": ok("Offsets")},
                parameters=[
                    query("timestamp", integer(0, INT64_MAX), "milliseconds since the epoch")
                ],
                errors=(400, 404, 410, 503),
            ),
        },
    }


def _internal_paths(config: BrokerConfig) -> dict[str, Any]:
    binary = {"application/octet-stream": {"schema": {"type": "string", "format": "binary"}}}
    return {
        "/v1/internal/status": {
            "get": operation(
                "internal_status",
                INTERNAL + "This broker's replicas as its Raft groups see them",
                {"200": ok(object_schema({}, closed=False))},
            )
        },
        "/v1/internal/partitions/{topic}/{partition}/append": {
            "parameters": [TOPIC_PARAMETER, PARTITION_PARAMETER],
            "post": operation(
                "internal_append",
                INTERNAL + "Append a RecordBatch to a replica hosted here",
                {"200": ok(object_schema({"base_offset": or_null(OFFSET)}, ("base_offset",)))},
                parameters=[
                    query("topic_id", integer(1, 2**62), "the topic's id (required)"),
                    query("acks", {"type": "string", "enum": ["0", "1", "all", "-1"]}, "acks"),
                    query("log_append_time_ms", integer(0, INT64_MAX), "leader-stamped time"),
                ],
                body={"required": True, "content": binary},
                errors=(400, 404, 413, 429, 503, 504),
            ),
        },
        "/v1/internal/partitions/{topic}/{partition}/batches": {
            "parameters": [TOPIC_PARAMETER, PARTITION_PARAMETER],
            "get": operation(
                "internal_batches",
                INTERNAL + "Committed raw batches [start_offset, end_offset) for catch-up",
                {
                    "200": {
                        "description": "concatenated batches; X-Dmq-Next-Offset: the offset "
                        "below which the replica holds nothing more (compaction gaps "
                        "included, never past its high watermark), where the next request starts",
                        "content": {BATCHES: {"schema": {"type": "string", "format": "binary"}}},
                    }
                },
                parameters=[
                    query("start_offset", integer(0, INT64_MAX), "first offset (required)"),
                    query("end_offset", integer(0, INT64_MAX), "end, exclusive (required)"),
                ],
                errors=(400, 404, 416, 503),
            ),
        },
        "/v1/internal/metadata/propose": {
            "post": operation(
                "internal_metadata_propose",
                INTERNAL + "Commit an encoded metadata command (an observer's)",
                {"200": ok(object_schema({"metadata_version": OFFSET}, ("metadata_version",)))},
                body={"required": True, "content": binary},
                errors=(400, 404, 409, 413, 429, 503, 504),
            )
        },
        "/v1/internal/metadata/voters": {
            "get": operation(
                "internal_metadata_voters",
                INTERNAL + "On the metadata leader only (503 elsewhere), after a read "
                "barrier: group 0's members and the catalogue (voters check their membership)",
                {"200": ok(object_schema({}, closed=False))},
                errors=(503, 504),
            )
        },
        "/v1/internal/metadata": {
            "get": operation(
                "internal_metadata",
                INTERNAL + "The catalogue, once newer than after_version (long-poll)",
                {"200": ok(object_schema({"state": object_schema({}, closed=False)}, ("state",)))},
                parameters=[
                    query("after_version", integer(-1, INT64_MAX, -1), "answer once newer"),
                    query("wait_ms", integer(0, config.fetch_wait_ms_max, 0), "longest wait"),
                    CONSISTENCY_PARAMETER,
                ],
                errors=(400, 503, 504),
            )
        },
    }


def _operations_paths() -> dict[str, Any]:
    """Cluster operations (http_api/operations.py, dmq/broker/operations.py)."""
    ids = {"type": "array", "items": {"type": "string", "minLength": 1}, "minItems": 1}
    reassign = object_schema(
        {"topic": {"type": "string"}, "partition": integer(0, 2**31 - 1), "replicas": ids},
        ("topic", "partition", "replicas"),
    )
    json_object = {"application/json": {"schema": object_schema({}, closed=False)}}
    group = {"parameters": [TOPIC_PARAMETER, PARTITION_PARAMETER]}
    topic_id = [query("topic_id", integer(1, 2**62), "the topic's id (required)")]
    return {
        "/v1/cluster/reassignments": {
            "post": operation(
                "reassign_partition",
                "Move a partition's replicas to `replicas` (preferred leader first)",
                {"202": ok(object_schema({}, closed=False), "the operation, as recorded")},
                body={"required": True, "content": {"application/json": {"schema": reassign}}},
                errors=(400, 404, 413, 503, 504),
            )
        },
        "/v1/cluster/metadata-voters": {
            "post": operation(
                "change_metadata_voters",
                "Change the metadata group's voters to `voters`, one broker at a time "
                "(added ones first); progress under `metadata_voters` in the operations",
                {"202": ok(object_schema({}, closed=False), "the operation, as recorded")},
                body={
                    "required": True,
                    "content": {
                        "application/json": {
                            "schema": object_schema(
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
            "get": operation(
                "cluster_operations",
                "Running reassignments (step, progress 0..1), decommissions and metadata voter changes",
                {"200": ok(object_schema({}, closed=False))},
                errors=(503,),
            )
        },
        "/v1/topics/{topic}/partitions/{partition}/decommission": {
            "parameters": [TOPIC_PARAMETER, PARTITION_PARAMETER],
            "post": operation(
                "decommission_partition",
                "Stop the partition taking new records; it stays readable until retention "
                "empties it, then it is removed (its number is never reused)",
                {"202": ok(object_schema({}, closed=False))},
                errors=(400, 404, 410, 503, 504),
            ),
        },
        "/v1/cluster/brokers/{broker_id}/decommission": {
            "parameters": [
                {"name": "broker_id", "in": "path", "required": True, "schema": {"type": "string"}}
            ],
            "post": operation(
                "decommission_broker",
                "Move every replica off the broker, then remove it from the cluster",
                {"202": ok(object_schema({}, closed=False))},
                errors=(400, 404, 503, 504),
            ),
        },
        "/v1/internal/partitions/{topic}/{partition}/log": {
            **group,
            "get": operation(
                "internal_replica_log",
                INTERNAL + "This broker's replica: whether it leads, its log's start and end",
                {"200": ok(object_schema({}, closed=False))},
                parameters=topic_id,
                errors=(400, 404, 503),
            ),
        },
        "/v1/internal/partitions/{topic}/{partition}/progress": {
            **group,
            "get": operation(
                "internal_group_progress",
                INTERNAL + "The partition leader's view of its group's members and logs",
                {"200": ok(object_schema({}, closed=False))},
                parameters=topic_id,
                errors=(400, 404, 503),
            ),
        },
        "/v1/internal/partitions/{topic}/{partition}/membership": {
            **group,
            "post": operation(
                "internal_group_membership",
                INTERNAL + "Add or remove one member of the group (on its leader)",
                {"200": ok(object_schema({"changed": {"type": "boolean"}}, ("changed",)))},
                parameters=topic_id,
                body={"required": True, "content": json_object},
                errors=(400, 404, 413, 503, 504),
            ),
        },
        "/v1/internal/partitions/{topic}/{partition}/transfer": {
            **group,
            "post": operation(
                "internal_group_transfer",
                INTERNAL + "Hand the group's leadership to a caught-up member",
                {"200": ok(object_schema({"requested": {"type": "boolean"}}, ("requested",)))},
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
    produced = {**ok("ProduceResponse"), "headers": count_header}
    return operation(
        "produce",
        "Append records; one offset per record, in request order",
        {"200": produced, "202": {**produced, "description": "acks=0: queued, offsets are null"}},
        parameters=[
            query(
                "acks",
                {"type": "string", "enum": ["all", "1", "0", "-1"], "default": "all"},
                "when to answer: after commit (all, -1), after append (1), at once (0)",
            ),
            query(
                "partition",
                integer(0, INT32_MAX),
                "send every record without its own to this partition",
            ),
            query(
                "value_encoding",
                ENCODING,
                "application/x-ndjson only: how keys and values are written",
            ),
        ],
        body={
            "required": True,
            "content": {
                JSON: {"schema": ref("ProduceRequest")},
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
    headers = {name: {"$ref": f"#/components/headers/{name}"} for name in OFFSET_HEADERS}
    return operation(
        "fetch",
        "Committed records from `offset` (long-polls up to wait_ms when there are none)",
        {
            "200": {
                "description": "records (json, ndjson) or whole raw batches (binary)",
                "headers": headers,
                "content": {
                    JSON: {"schema": ref("FetchResponse")},
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
        query(
            "offset",
            {
                "anyOf": [
                    integer(-INT64_MAX - 1, INT64_MAX),
                    {"type": "string", "enum": ["earliest", "latest"]},
                ],
                "default": "earliest",
            },
            "first offset to read; outside [log_start_offset, log_end_offset] answers 416",
        ),
        query(
            "timestamp",
            integer(0, INT64_MAX),
            "instead of offset: the first record at or after this time, ms",
        ),
        query(
            "max_records",
            integer(
                1,
                config.fetch_records_max,
                min(limits.FETCH_RECORDS_DEFAULT, config.fetch_records_max),
            ),
            "most records in a json/ndjson answer",
        ),
        query(
            "max_bytes",
            integer(
                1, config.fetch_bytes_max, min(limits.FETCH_BYTES_DEFAULT, config.fetch_bytes_max)
            ),
            "soft cap on the answer's size; at least one batch is returned",
        ),
        query(
            "wait_ms",
            integer(0, config.fetch_wait_ms_max, 0),
            "long-poll: wait this long for a record",
        ),
        query(
            "format",
            {"type": "string", "enum": ["json", "ndjson", "binary"], "default": "json"},
            "answer format (else chosen by Accept)",
        ),
        query(
            "value_encoding",
            ENCODING,
            "json/ndjson: how keys, values and header values are written",
        ),
    ]


def _topic_config(config: BrokerConfig, *, for_request: bool) -> dict[str, Any]:
    """The topic config keys (dmq.topics.TOPIC_CONFIG_KEYS). Requests carry their
    bounds; a description states every key, with the values the topic has."""
    properties: dict[str, Any] = {}
    for key, spec in TOPIC_CONFIG_KEYS.items():
        if spec.kind == "choice":
            properties[key] = {"type": "string", "enum": list(spec.choices)}
        elif for_request:
            maximum = config.batch_bytes_max if key == "max_record_bytes" else spec.maximum
            properties[key] = integer(spec.minimum, maximum)
        else:
            properties[key] = {"type": "integer"}
    required = () if for_request else tuple(sorted(TOPIC_CONFIG_KEYS))
    return object_schema(properties, required, closed=for_request)


def _schemas(config: BrokerConfig) -> dict[str, Any]:
    return {**_catalogue_schemas(config), **group_schemas(config)}


def _catalogue_schemas(config: BrokerConfig) -> dict[str, Any]:
    header = object_schema({"key": {"type": "string"}, "value": NULLABLE_STRING}, ("key",))
    return {
        "Error": error_schema(),
        "Status": object_schema(
            {"status": {"type": "string", "enum": ["ok", "ready"]}}, ("status",)
        ),
        "Cluster": object_schema(
            {
                "cluster_id": {"type": "string"},
                "node_id": {"type": "string"},
                "metadata_voters": {"type": "array", "items": {"type": "string"}},
                "metadata_version": OFFSET,
                "brokers": {"type": "array", "items": ref("Broker")},
            },
            ("cluster_id", "node_id", "metadata_voters", "metadata_version", "brokers"),
        ),
        "Broker": object_schema(
            {
                "node_id": {"type": "string"},
                "http_addr": {"type": "string"},
                "raft_addr": {"type": "string"},
                "live": {"type": "boolean", "description": "heartbeat within the session"},
                "reachable": {"type": "boolean", "description": "answered this status call"},
            },
            ("node_id", "http_addr", "raft_addr", "live"),
        ),
        "ClusterStatus": object_schema(
            {
                "cluster_id": {"type": "string"},
                "node_id": {"type": "string"},
                "metadata_voters": {"type": "array", "items": {"type": "string"}},
                "metadata_version": OFFSET,
                "brokers": {"type": "array", "items": ref("Broker")},
                "groups": {
                    "type": "array",
                    "items": object_schema(
                        {
                            "group_id": OFFSET,
                            "topic": NULLABLE_STRING,
                            "partition": or_null(OFFSET),
                            "leader": NULLABLE_STRING,
                            "term": OFFSET,
                            "commit_index": OFFSET,
                            "replicas": {
                                "type": "array",
                                "items": object_schema({}, closed=False),
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
        "TopicList": object_schema(
            {
                "topics": {
                    "type": "array",
                    "items": object_schema(
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
        "CreateTopicRequest": object_schema(
            {
                "name": ref("TopicName"),
                "partitions": or_null(
                    integer(1, limits.PARTITIONS_PER_TOPIC_MAX, config.default_partitions)
                ),
                # At most one replica per broker.
                "replication_factor": or_null(
                    integer(
                        1,
                        len(config.peer_addrs),
                        min(config.default_replication_factor, len(config.peer_addrs)),
                    )
                ),
                "config": or_null(ref("TopicConfig")),
            },
            ("name",),
        ),
        "AlterConfigRequest": object_schema({"config": ref("TopicConfig")}, ("config",)),
        "AddPartitionsRequest": object_schema(
            {
                "count": {
                    **integer(2, limits.PARTITIONS_PER_TOPIC_MAX),
                    "description": "the new total, more than the current count",
                }
            },
            ("count",),
        ),
        "TopicDescription": object_schema(
            {
                "name": {"type": "string"},
                "replication_factor": {"type": "integer"},
                "config": _topic_config(config, for_request=False),
                "partitions": {
                    "type": "array",
                    "items": object_schema(
                        {
                            "partition": OFFSET,
                            "leader": {
                                **NULLABLE_STRING,
                                "description": "null while no leader is known",
                            },
                            "replicas": {"type": "array", "items": {"type": "string"}},
                            # null where this broker holds no replica of the partition
                            "log_start_offset": or_null(OFFSET),
                            "high_watermark": or_null(OFFSET),
                            "log_end_offset": or_null(OFFSET),
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
        "Deleted": object_schema({"deleted": {"type": "string"}}, ("deleted",)),
        "Header": header,
        "ProduceRecord": object_schema(
            {
                "key": {**NULLABLE_STRING, "description": "null or missing: no key"},
                "value": {**NULLABLE_STRING, "description": "null or missing: a tombstone"},
                "headers": {
                    "anyOf": [
                        {"type": "array", "items": ref("Header")},
                        {"type": "object", "additionalProperties": NULLABLE_STRING},
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
        "ProduceRequest": object_schema(
            {
                "records": {
                    "type": "array",
                    "items": ref("ProduceRecord"),
                    "minItems": 1,
                    "maxItems": config.produce_records_max,
                },
                "value_encoding": or_null(ENCODING),
                # An idempotent producer's batch (POST /v1/producers): all three or none,
                # and every record on one partition.
                "producer_id": or_null(integer(0, INT64_MAX)),
                "producer_epoch": or_null(integer(0, 32_767)),
                "base_sequence": or_null(integer(0, 2**31 - 1)),
            },
            ("records",),
        ),
        "ProduceResponse": object_schema(
            {
                "offsets": {
                    "type": "array",
                    "items": object_schema(
                        {
                            "partition": OFFSET,
                            "offset": {"type": ["integer", "null"], "minimum": 0},
                        },
                        ("partition", "offset"),
                    ),
                }
            },
            ("offsets",),
        ),
        "FetchedRecord": object_schema(
            {
                "offset": OFFSET,
                "timestamp": {"type": "integer"},
                "key": NULLABLE_STRING,
                "value": NULLABLE_STRING,
                "headers": {
                    "type": "array",
                    "items": object_schema(
                        {"key": {"type": "string"}, "value": {"type": "string"}}, ("key", "value")
                    ),
                },
            },
            ("offset", "timestamp", "key", "value", "headers"),
        ),
        "FetchResponse": object_schema(
            {
                "topic": {"type": "string"},
                "partition": OFFSET,
                "next_offset": OFFSET,
                "high_watermark": OFFSET,
                "log_start_offset": OFFSET,
                "records": {"type": "array", "items": ref("FetchedRecord")},
            },
            ("topic", "partition", "next_offset", "high_watermark", "log_start_offset", "records"),
        ),
        "Offsets": object_schema(
            {
                "partition": OFFSET,
                "log_start_offset": OFFSET,
                "high_watermark": OFFSET,
                "offset": {"type": ["integer", "null"], "minimum": 0},
            },
            ("partition", "log_start_offset", "high_watermark", "offset"),
        ),
    }
