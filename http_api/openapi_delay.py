"""The OpenAPI paths and schemas of delayed records (http_api/delay.py): the produce
fields and parameters, the count, the cancel and the internal routes. Assembled by
http_api/openapi.py; openapi_records.py splices the produce fields in.
"""

from __future__ import annotations

from typing import Any

from dmq.config import BrokerConfig
from http_api.openapi_schema import (
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
    ref,
)

INT64_MAX = 2**63 - 1
_ID = {"name": "id", "in": "path", "required": True, "schema": {"type": "string"},
       "description": "the schedule id the produce answered: <partition>-<deliver_at>-<sid>"}  # fmt: skip


def delay_record_fields(config: BrokerConfig) -> dict[str, Any]:
    """ProduceRecord's fields for a delayed record."""
    return {
        "deliver_at": {
            **or_null(integer(0, INT64_MAX)),
            "description": f"append at this time (ms since the epoch), at most max_delay_ms "
            f"({config.max_delay_ms}) ahead; with producer_id every record gives it (a retry "
            "of the same producer_id, producer_epoch and base_sequence is answered with the "
            "first one's ids)",
        },
        "delay_ms": {
            **or_null(integer(0, config.max_delay_ms)),
            "description": "append this long after the broker receives it (not with "
            "producer_id: 400)",
        },
    }


def delay_answer_fields() -> dict[str, Any]:
    """A produce answer's fields for a delayed record (its offset is null)."""
    return {
        "deliver_at": {"type": "integer", "description": "when it will be appended"},
        "id": {"type": "string", "description": "schedule id, for DELETE .../scheduled/{id}"},
    }


def delay_produce_parameters(config: BrokerConfig) -> list[dict[str, Any]]:
    return [
        query("delay_ms", integer(0, config.max_delay_ms), "delay every record without its own"),
        query("deliver_at", integer(0, INT64_MAX), "deliver every record without its own then"),
    ]


def delay_paths(config: BrokerConfig) -> dict[str, Any]:
    summary = ok("ScheduledSummary")
    return {
        "/v1/topics/{topic}/scheduled": {
            "parameters": [TOPIC_PARAMETER],
            "get": operation(
                "scheduled",
                "Delayed records pending, per partition and in all",
                {"200": summary},
                errors=(404, 503),
            ),  # fmt: skip
        },
        "/v1/topics/{topic}/scheduled/{id}": {
            "parameters": [TOPIC_PARAMETER, _ID],
            "delete": operation(
                "cancel_scheduled",
                "Cancel a pending delayed record",
                {"200": ok(object_schema({"cancelled": {"type": "string"}}, ("cancelled",)))},
                errors=(400, 404, 503, 504),
            ),  # fmt: skip
        },
        "/v1/internal/delay/{topic}/{partition}": {
            "parameters": [TOPIC_PARAMETER, PARTITION_PARAMETER],
            "post": operation(
                "internal_delay_propose",
                INTERNAL + "Propose a delay command to a replica here",
                {"200": ok(object_schema({"results": {"type": "array"}}, ("results",)))},
                parameters=[query("topic_id", integer(1, 2**62), "the topic's id (required)")],
                body={"required": True, "content": {"application/octet-stream": {}}},
                errors=(400, 404, 429, 503, 504),
            ),  # fmt: skip
            "get": operation(
                "internal_delay_summary",
                INTERNAL + "A replica's pending delayed records",
                {"200": ok(ref("PartitionScheduled"))},
                errors=(400, 404, 503),
            ),  # fmt: skip
        },
        "/v1/internal/delay/{topic}/{partition}/pending": {
            "parameters": [TOPIC_PARAMETER, PARTITION_PARAMETER],
            "get": operation(
                "internal_delay_pending",
                INTERNAL + "A replica's delay store as it was at a Raft position, streamed "
                "(for a replica installing a snapshot); 503 if this replica compacted past "
                "it or has not applied it",
                {
                    "200": {
                        "description": "bucket-file entries, then an end frame with their count",
                        "content": {"application/octet-stream": {}},
                    }
                },
                parameters=[
                    query("index", integer(0, 2**63 - 1), "the snapshot's Raft index (required)"),
                    query("k", integer(0, 2**32 - 1), "the command within the entry (required)"),
                ],
                errors=(400, 404, 503),
            ),  # fmt: skip
        },
    }


def delay_schemas() -> dict[str, Any]:
    part = object_schema(
        {"partition": OFFSET, "count": OFFSET, "next_deliver_at": or_null(OFFSET)},
        ("partition", "count", "next_deliver_at"),
    )
    return {
        "PartitionScheduled": part,
        "ScheduledSummary": object_schema(
            {
                "topic": {"type": "string"},
                "count": OFFSET,
                "next_deliver_at": or_null(OFFSET),
                "partitions": {"type": "array", "items": ref("PartitionScheduled")},
            },
            ("topic", "count", "next_deliver_at", "partitions"),
        ),
    }
