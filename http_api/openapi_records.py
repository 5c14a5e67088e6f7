"""The OpenAPI paths and schemas of a topic's records: produce, fetch (long-poll; json,
ndjson or raw batches) and offsets (http_api/app.py's record routes). Assembled by
http_api/openapi.py. The bounds are the broker's configuration, as the handlers read it.
"""

from __future__ import annotations

from typing import Any

from dmq import limits
from dmq.config import BrokerConfig
from http_api.openapi_delay import (
    delay_answer_fields,
    delay_produce_parameters,
    delay_record_fields,
)
from http_api.openapi_filtering import filter_parameters
from http_api.openapi_schema import (
    BATCH,
    BATCHES,
    ENCODING,
    INT32_MAX,
    INT64_MAX,
    JSON,
    NDJSON,
    NULLABLE_STRING,
    OFFSET,
    OFFSET_HEADERS,
    PARTITION_PARAMETER,
    TEXT,
    TOPIC_PARAMETER,
    integer,
    object_schema,
    ok,
    operation,
    or_null,
    query,
    ref,
)


def record_paths(config: BrokerConfig) -> dict[str, Any]:
    """Produce, fetch and list offsets."""
    return {
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
                    query("timestamp", integer(0, INT64_MAX), "milliseconds since the epoch"),
                    READ_CONSISTENCY_PARAMETER,
                ],
                errors=(400, 404, 410, 503),
            ),
        },
    }


def record_schemas(config: BrokerConfig) -> dict[str, Any]:
    """Records as produced and as fetched, and a partition's offsets."""
    header = object_schema({"key": {"type": "string"}, "value": NULLABLE_STRING}, ("key",))
    return {
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
                **delay_record_fields(config),
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
                            **delay_answer_fields(),
                        },
                        ("partition", "offset"),
                    ),
                }
            },
            ("offsets",),
        ),
        **_fetch_schemas(),
    }


def _fetch_schemas() -> dict[str, Any]:
    """Records as fetched, and a partition's offsets."""
    return {
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
            *delay_produce_parameters(config),
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
        errors=(400, 404, 409, 413, 415, 429, 503, 504, 507),
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


# dmq/README.md, "Read consistency"; http_api/codec.py consistency_param.
READ_CONSISTENCY_PARAMETER = query(
    "consistency",
    {"type": "string", "enum": ["linearizable", "leader"], "default": "linearizable"},
    "linearizable: the partition leader confirms with a majority, after the request arrived, "
    "that it still leads (Raft ReadIndex) before it answers: the answer (records, "
    "high_watermark, offsets) reflects every write acknowledged before the request began. "
    "leader: answered from the leader's state at once, one round trip cheaper; a leader "
    "deposed without knowing it yet may answer an older high_watermark",
)


def _fetch_parameters(config: BrokerConfig) -> list[dict[str, Any]]:
    """The bounds are the handler's: http_api.app.fetch reads them from the config."""
    return [
        READ_CONSISTENCY_PARAMETER,
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
        *filter_parameters(config),
    ]
