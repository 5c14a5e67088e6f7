"""The OpenAPI paths of the internal routes, one broker calling another (dmq/peers.py):
replica status, forwarded appends, catch-up batches, the metadata catalogue. They are
documented for completeness, not for clients. Assembled by http_api/openapi.py; the
internal routes that cluster operations drive are in http_api/openapi_cluster.py.
"""

from __future__ import annotations

from typing import Any

from dmq.config import BrokerConfig
from http_api.openapi_schema import (
    BATCHES,
    CONSISTENCY_PARAMETER,
    INT64_MAX,
    INTERNAL,
    OFFSET,
    PARTITION_PARAMETER,
    TOPIC_PARAMETER,
    integer,
    object_schema,
    ok,
    operation,
    or_null,
    query,
)

# A request body of raw bytes: a RecordBatch, or an encoded metadata command.
_BINARY = {"application/octet-stream": {"schema": {"type": "string", "format": "binary"}}}


def internal_paths(config: BrokerConfig) -> dict[str, Any]:
    """A replica's status, forwarded appends and catch-up batches; then the metadata routes."""
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
                body={"required": True, "content": _BINARY},
                errors=(400, 404, 413, 429, 503, 504, 507),
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
        **_metadata_paths(config),
    }


def _metadata_paths(config: BrokerConfig) -> dict[str, Any]:
    """An observer's commands and catalogue, and the voters' membership check."""
    return {
        "/v1/internal/metadata/propose": {
            "post": operation(
                "internal_metadata_propose",
                INTERNAL + "Commit an encoded metadata command (an observer's)",
                {"200": ok(object_schema({"metadata_version": OFFSET}, ("metadata_version",)))},
                body={"required": True, "content": _BINARY},
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
