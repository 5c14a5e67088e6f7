"""The OpenAPI paths of the transaction routes (http_api/transactions.py), and the
transactional parameters of produce and fetch, which `extend_record_operations` adds to
openapi_records' operations (so the records area does not need to know transactions).
Assembled by http_api/openapi.py.
"""

from __future__ import annotations

from typing import Any

from http_api.openapi_schema import (
    INT64_MAX,
    OFFSET,
    integer,
    json_body,
    object_schema,
    ok,
    operation,
    query,
)

_TID = {"type": "string", "pattern": "^[a-zA-Z0-9._-]{1,249}$"}
_TID_PARAMETER = {"name": "transactional_id", "in": "path", "required": True, "schema": _TID}
_TIMEOUT = integer(1, 900_000, 60_000)
_STATE = {
    "type": "string",
    "enum": [
        "empty", "ongoing", "prepare_commit", "prepare_abort", "complete_commit",
        "complete_abort",
    ],
}  # fmt: skip


def transaction_paths() -> dict[str, Any]:
    """List, describe, commit, abort, add offsets."""
    commit: dict[str, Any] = {"parameters": [_TID_PARAMETER]}
    abort: dict[str, Any] = {"parameters": [_TID_PARAMETER]}
    commit["post"] = operation(
        "commit_transaction",
        "Commit: durable decision, then a commit marker in every partition of the "
        "transaction and its group offsets; answers once complete (or prepare_commit), or "
        "with wait=decision once the decision is durable. The decision bumps the "
        "producer's epoch: the answer names the producer id and epoch of its next "
        "transaction",
        {"200": ok("TransactionEnded")},
        body=json_body("EndTransaction"),
        errors=(400, 404, 409, 503, 504),
    )
    abort["post"] = operation(
        "abort_transaction",
        "Abort: durable decision, then an abort marker in every partition of the "
        "transaction; the epoch is bumped as by a commit",
        {"200": ok("TransactionEnded")},
        body=json_body("EndTransaction"),
        errors=(400, 404, 409, 503, 504),
    )
    return {
        "/v1/transactions": {
            "get": operation(
                "list_transactions",
                "Every transactional id's current or last transaction (for operators)",
                {
                    "200": ok(
                        object_schema(
                            {
                                "transactions": {
                                    "type": "array",
                                    "items": {"$ref": "#/components/schemas/Transaction"},
                                }
                            },
                            ("transactions",),
                        )
                    )
                },
                errors=(503,),
            )  # fmt: skip
        },
        "/v1/transactions/{transactional_id}": {
            "parameters": [_TID_PARAMETER],
            "get": operation(
                "describe_transaction",
                "One transactional id's current or last transaction",
                {"200": ok("Transaction")},
                errors=(400, 404, 503),
            ),
        },
        "/v1/transactions/{transactional_id}/commit": commit,
        "/v1/transactions/{transactional_id}/abort": abort,
        "/v1/transactions/{transactional_id}/offsets": {
            "parameters": [_TID_PARAMETER],
            "post": operation(
                "add_offsets_to_transaction",
                "A consumer group's offsets, committed only if the transaction commits "
                "(the member must hold each partition at `generation`)",
                {"200": ok("Transaction")},
                body=json_body("TransactionOffsets"),
                errors=(400, 404, 409, 503, 504),
            ),
        },
    }


def transaction_schemas() -> dict[str, Any]:
    producer = {"producer_id": integer(0, INT64_MAX), "producer_epoch": integer(0, 32_767)}
    offset = object_schema(
        {"topic": {"type": "string"}, "partition": OFFSET, "offset": OFFSET},
        ("topic", "partition", "offset"),
    )
    transaction = object_schema(
        {
            "transactional_id": _TID,
            **producer,
            "state": _STATE,
            "partitions": {"type": "array", "items": {"type": "string"}},
            "offsets": {"type": "array", "items": {"type": "string"}},
            "started_ms": OFFSET,
            "age_ms": OFFSET,
            "timeout_ms": OFFSET,
            "fenced": {"type": "boolean"},
        },
        ("transactional_id", "producer_id", "producer_epoch", "state", "partitions"),
    )
    following = {
        "next_producer_id": {
            **integer(0, INT64_MAX),
            "description": "the producer id of the producer's next transaction",
        },
        "next_producer_epoch": {
            **integer(0, 32_767),
            "description": "its epoch: this one's + 1 (KIP-890 part 2), or 0 with a new "
            "producer id once the epoch is spent; every sequence starts over",
        },
    }
    ended = object_schema(
        {**transaction["properties"], **following},
        (*transaction["required"], "next_producer_id", "next_producer_epoch"),
    )
    return {
        "EndTransaction": object_schema(
            {
                **producer,
                "wait": {
                    "type": "string",
                    "enum": ["complete", "decision"],
                    "default": "complete",
                    "description": "complete: answer once every marker is written; "
                    "decision: once the decision is durable (the markers follow)",
                },
            },
            ("producer_id", "producer_epoch"),
        ),
        "TransactionOffsets": object_schema(
            {
                **producer,
                "group": {"type": "string"},
                "member_id": {"type": "string", "default": ""},
                "generation": integer(-1, 2**31 - 1, -1),
                "offsets": {"type": "array", "items": offset, "minItems": 1},
                "transaction_timeout_ms": _TIMEOUT,
            },
            ("producer_id", "producer_epoch", "group", "offsets"),
        ),
        "Transaction": transaction,
        "TransactionEnded": ended,
    }


def extend_record_operations(paths: dict[str, Any], schemas: dict[str, Any]) -> None:
    """Produce takes `transactional_id`; fetch and the group fetch take `isolation`; the
    fetch answers the LSO."""
    produce = paths["/v1/topics/{topic}/records"]["post"]
    produce["parameters"] = [
        *produce.get("parameters", []),
        query("transactional_id", _TID, "a transactional produce: the batch's partition "
              "joins this id's transaction first (the producer fields are required)"),
        query("transaction_timeout_ms", _TIMEOUT, "with transactional_id: after this the "
              "coordinator aborts the transaction"),
    ]  # fmt: skip
    isolation = query(
        "isolation",
        {"type": "string", "enum": ["read_uncommitted", "read_committed"],
         "default": "read_uncommitted"},
        "read_committed: only committed transactions' records, never at or past the "
        "last stable offset",
    )  # fmt: skip
    for path in (
        "/v1/topics/{topic}/partitions/{partition}/records",
        "/v1/groups/{group}/members/{member_id}/records",
    ):
        fetch = paths[path]["get"]
        fetch["parameters"] = [*fetch.get("parameters", []), isolation]
    for name in ("FetchResponse", "Offsets"):
        schemas[name]["properties"]["last_stable_offset"] = {
            "type": ["integer", "null"],
            "minimum": 0,
        }
