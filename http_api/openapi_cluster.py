"""The OpenAPI paths and schemas of the probes, the cluster and its operations
(http_api/app.py's probes and /v1/cluster routes, http_api/operations.py), and of the
internal routes those operations use between brokers. Assembled by http_api/openapi.py.
"""

from __future__ import annotations

from typing import Any

from dmq.compat import FEATURE_LEVEL_LIMIT
from http_api.openapi_schema import (
    INTERNAL,
    JSON,
    NULLABLE_STRING,
    OFFSET,
    PARTITION_PARAMETER,
    TOPIC_PARAMETER,
    integer,
    object_schema,
    ok,
    operation,
    or_null,
    query,
    ref,
)
from http_api.operations import METADATA_VOTERS_LIST_MAX


def cluster_paths() -> dict[str, Any]:
    """The probes, this document, the cluster and its status."""
    return {
        "/healthz": {"get": operation("healthz", "The process is up", {"200": ok("Status")})},
        "/readyz": {
            "get": operation(
                "readyz", "The broker serves requests", {"200": ok("Status")}, errors=(503,)
            )
        },
        "/openapi.json": {
            "get": operation("openapi", "This document", {"200": ok({"type": "object"})})
        },
        # Outside /v1 like the probes: Prometheus's text format (http_api/metrics.py).
        "/metrics": {
            "get": operation(
                "metrics",
                "This broker's metrics in the Prometheus text format 0.0.4 (dmq/README.md)",
                {
                    "200": {
                        "description": "success",
                        "content": {"text/plain": {"schema": {"type": "string"}}},
                    }
                },
            )
        },
        "/v1/cluster": {
            "get": operation(
                "cluster",
                "Cluster id, brokers, this node (409 to a join naming another cluster id)",
                {"200": ok("Cluster")},
                errors=(409,),
            )
        },
        "/v1/cluster/status": {
            "get": operation(
                "cluster_status",
                "Brokers, and per Raft group its leader, term, commit index and replica lag",
                {"200": ok("ClusterStatus")},
                errors=(503,),
            )
        },
    }


def operations_paths() -> dict[str, Any]:
    """Cluster operations (http_api/operations.py, dmq/broker/operations.py)."""
    ids = {"type": "array", "items": {"type": "string", "minLength": 1}, "minItems": 1}
    reassign = object_schema(
        {"topic": {"type": "string"}, "partition": integer(0, 2**31 - 1), "replicas": ids},
        ("topic", "partition", "replicas"),
    )
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
        "/v1/cluster/features": {
            "get": operation(
                "cluster_features",
                "Each broker's release and supported feature levels (as it answers now), "
                "the finalized level and the highest level every broker supports now",
                {"200": ok(object_schema({}, closed=False), "the levels")},
                errors=(503,),
            )
        },
        "/v1/cluster/features/finalize": {
            "post": operation(
                "finalize_features",
                "Raise the finalized feature level (default: the highest this release "
                "supports); 409 feature_level_unsupported naming the laggards. Not reversible",
                {"200": ok(object_schema({}, closed=False), "the finalized level")},
                body={
                    "required": False,
                    "content": {
                        JSON: {
                            "schema": object_schema(
                                {"level": integer(0, FEATURE_LEVEL_LIMIT)}, closed=False
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
        **_operation_internal_paths(),
    }


def _operation_internal_paths() -> dict[str, Any]:
    """The internal routes a reassignment drives: a replica's log, its group's progress,
    membership changes and leadership transfers."""
    json_object = {"application/json": {"schema": object_schema({}, closed=False)}}
    group = {"parameters": [TOPIC_PARAMETER, PARTITION_PARAMETER]}
    topic_id = [query("topic_id", integer(1, 2**62), "the topic's id (required)")]
    return {
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


def cluster_schemas() -> dict[str, Any]:
    """The probes' status, the cluster and its status."""
    return {
        "Status": object_schema(
            {
                "status": {"type": "string", "enum": ["ok", "ready"]},
                "storage": ref("Storage"),
            },
            ("status",),
        ),
        "Storage": object_schema(
            {
                "level": {
                    "type": "string",
                    "enum": ["ok", "alert", "full"],
                    "description": "full: free_bytes below floor_bytes, produce gets 507",
                },
                "free_bytes": OFFSET,
                "total_bytes": OFFSET,
                "floor_bytes": OFFSET,
                "alert_bytes": OFFSET,
                "refused_appends": OFFSET,
                "refused_bytes": OFFSET,
                "acks0_refused": OFFSET,
                "stalled_groups": {"type": "array", "items": OFFSET},
                "leadership_handoffs": OFFSET,
            },
            ("level",),
            closed=False,
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
                "url": {
                    "type": "string",
                    "description": "its HTTP API's URL: https:// when the cluster has TLS on",
                },
                "raft_addr": {"type": "string"},
                "version": {
                    "type": ["string", "null"],
                    "description": "its dmq release, as its last answer to this broker named "
                    "it (null: not heard from yet; refreshed every 5 s)",
                },
                "live": {"type": "boolean", "description": "heartbeat within the session"},
                "reachable": {"type": "boolean", "description": "answered this status call"},
                "free_bytes": {
                    "type": "integer",
                    "description": "free bytes of its data directory at its last heartbeat "
                    "(-1: not reported)",
                },
                "storage": {
                    "type": ["string", "null"],
                    "enum": ["ok", "alert", "full", None],
                    "description": "its storage level at its last heartbeat",
                },
                "storage_status": or_null(ref("Storage")),
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
    }
