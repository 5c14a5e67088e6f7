"""What every part of the OpenAPI document builds with: media types, the error statuses
and the error body, and small builders for schemas, parameters, bodies and operations.

The area modules (openapi_cluster, openapi_internal, openapi_topics, openapi_records,
openapi_groups) import this module and nothing of each other; http_api/openapi.py
assembles them into the document. This module imports no other part of it.
"""

from __future__ import annotations

from typing import Any

JSON = "application/json"
NDJSON = "application/x-ndjson"
TEXT = "text/plain"
# http_api.app.BATCH_CONTENT_TYPE and BATCHES_CONTENT_TYPE, repeated: app imports the document.
BATCH = "application/vnd.dmq.batch"
BATCHES = "application/vnd.dmq.batches"

INT64_MAX = 2**63 - 1
INT32_MAX = 2**31 - 1

NULLABLE_STRING = {"type": ["string", "null"]}
OFFSET = {"type": "integer", "minimum": 0}

# How keys and values are written in JSON answers and ndjson bodies.
ENCODING = {"type": "string", "enum": ["string", "base64"], "default": "string"}
# Response headers of a fetch (components/headers), with their descriptions.
OFFSET_HEADERS = {
    "X-Dmq-Next-Offset": "the offset to fetch next",
    "X-Dmq-High-Watermark": "first uncommitted offset of the partition",
    "X-Dmq-Log-Start-Offset": "first offset still in the log",
}

# The summary of every internal route begins with this.
INTERNAL = (
    "Internal, broker to broker (dmq/peers.py); not for clients. With a cluster secret it "
    "needs an X-Dmq-Signature header (dmq/internal_auth.py), else 401 unauthenticated; "
    "one naming another cluster (X-Dmq-Cluster-Id) gets 409 cluster_id_mismatch. "
)


# ---------------------------------------------------------------------- errors


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
        (
            "topic_not_found",
            "partition_not_found",
            "group_not_found",
            "not_found",
            "transaction_not_found",
        ),
        False,
    ),
    401: (
        "an internal route without a valid broker signature (X-Dmq-Signature); with "
        "--auth on, a route without valid credentials (WWW-Authenticate names the schemes)",
        ("unauthenticated",),
        False,
    ),
    403: (
        "--auth on: no ACL allows the operation on the resource; details name them",
        ("forbidden",),
        False,
    ),
    405: ("method not allowed on this path", ("method_not_allowed",), False),
    406: ("data that is not UTF-8 asked for as a string", ("not_acceptable",), False),
    409: (
        "the topic already exists; or a group member must rejoin (unknown_member), catch up "
        "(stale_generation), the group must be empty, or use the group's assignor; or a "
        "broker-to-broker call or a join names another cluster (cluster_id_mismatch)",
        (
            "topic_already_exists",
            "group_conflict",
            "unknown_member",
            "stale_generation",
            "group_not_empty",
            "inconsistent_assignor",
            "lock_not_held",
            "producer_fenced",
            "out_of_order_sequence",
            "partition_decommissioned",
            "operation_conflict",
            "feature_level_unsupported",
            "cluster_id_mismatch",
            "invalid_txn_state",
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
    429: (
        "a bounded queue is full, or the principal's quota is spent; retry after Retry-After",
        ("backpressure", "quota_exceeded"),
        True,
    ),
    500: (
        "the broker's data is broken, or a bug",
        (
            "storage_error",
            "internal_error",
            "meta_file_corrupt",
            "data_dir_mismatch",
            "format_too_new",
        ),
        False,
    ),
    503: (
        "not leader, starting or stopping",
        ("not_leader", "broker_unavailable", "retriable", "concurrent_transactions"),
        True,
    ),
    504: ("the operation did not complete in time", ("request_timeout",), True),
    507: (
        "the broker's disk is below its free-space floor (storage_min_free_bytes): nothing "
        "was written; details name free_bytes and floor_bytes. Reads go on",
        ("insufficient_storage",),
        True,
    ),
}


def error_response(status: int) -> dict[str, Any]:
    """components/responses/Error<status>: the error body with the codes the status carries."""
    description, codes, retry = ERROR_STATUSES[status]
    schema = {
        "allOf": [
            ref("Error"),
            {"properties": {"error": {"properties": {"code": {"enum": list(codes)}}}}},
        ]
    }
    response: dict[str, Any] = {"description": description, "content": {JSON: {"schema": schema}}}
    if retry:
        response["headers"] = {"Retry-After": {"$ref": "#/components/headers/Retry-After"}}
    return response


def error_schema() -> dict[str, Any]:
    """The body of every error answer (http_api/errors.py)."""
    return object_schema(
        {
            "error": object_schema(
                {
                    "code": {"type": "string"},
                    "message": {"type": "string"},
                    "details": object_schema(
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
    )


# ---------------------------------------------------------------------- schemas


def ref(name: str) -> dict[str, str]:
    """A reference to the named schema under components."""
    return {"$ref": f"#/components/schemas/{name}"}


def integer(minimum: int, maximum: int, default: int | None = None) -> dict[str, Any]:
    """An integer in [minimum, maximum] (both inclusive)."""
    schema: dict[str, Any] = {"type": "integer", "minimum": minimum, "maximum": maximum}
    if default is not None:
        schema["default"] = default
    return schema


def or_null(schema: dict[str, Any]) -> dict[str, Any]:
    """A body field the handler also takes as null, meaning its default."""
    return {"anyOf": [schema, {"type": "null"}]}


def object_schema(
    properties: dict[str, Any], required: tuple[str, ...] = (), closed: bool = True
) -> dict[str, Any]:
    """An object schema; `closed` where the handler refuses unknown fields."""
    schema: dict[str, Any] = {"type": "object", "properties": properties}
    if required:
        schema["required"] = list(required)
    if closed:
        schema["additionalProperties"] = False
    return schema


# ----------------------------------------------------------- parameters and operations


def query(name: str, schema: dict[str, Any], description: str) -> dict[str, Any]:
    """An optional query parameter (the handlers check the ones they require)."""
    return {
        "name": name,
        "in": "query",
        "required": False,
        "schema": schema,
        "description": description,
    }


TOPIC_PARAMETER = {
    "name": "topic",
    "in": "path",
    "required": True,
    "schema": {"$ref": "#/components/schemas/TopicName"},
}
PARTITION_PARAMETER = {
    "name": "partition",
    "in": "path",
    "required": True,
    "schema": {"type": "integer", "minimum": 0, "maximum": INT32_MAX},
}
CONSISTENCY_PARAMETER = {
    "name": "consistency",
    "in": "query",
    "required": False,
    "schema": {"type": "string", "enum": ["local", "linearizable"], "default": "local"},
    "description": "local: this broker's applied catalogue; linearizable: after a read "
    "barrier through the metadata group",
}


def offset_header(description: str) -> dict[str, Any]:
    # Sent with ndjson and binary answers, whose bodies cannot carry the offsets; a
    # json answer has them in its body (OpenAPI cannot tie a header to one media type).
    return {
        "description": f"{description} (ndjson and binary answers)",
        "required": False,
        "schema": {"type": "integer", "minimum": 0},
    }


def ok(schema: str | dict[str, Any], description: str = "success") -> dict[str, Any]:
    """A JSON answer: a named schema, or a schema given inline."""
    return {
        "description": description,
        "content": {JSON: {"schema": ref(schema) if isinstance(schema, str) else schema}},
    }


def json_body(schema: str) -> dict[str, Any]:
    """A required JSON request body of a named schema."""
    return {"required": True, "content": {JSON: {"schema": ref(schema)}}}


def operation(
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
