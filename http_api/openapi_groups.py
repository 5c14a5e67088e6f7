"""The OpenAPI paths and schemas of consumer groups and idempotent producers
(http_api/groups.py's routes). Assembled by http_api/openapi.py."""

from __future__ import annotations

from typing import Any

from dmq import limits
from dmq.config import BrokerConfig
from http_api.openapi_filtering import filter_parameters
from http_api.openapi_schema import (
    ENCODING,
    OFFSET,
    integer,
    json_body,
    object_schema,
    ok,
    operation,
    query,
    ref,
)

_NAME = {
    "type": "string",
    "pattern": f"^[a-zA-Z0-9._-]{{1,{limits.GROUP_NAME_CHARS_MAX}}}$",
}
_GROUP = {"name": "group", "in": "path", "required": True, "schema": _NAME}
_MEMBER = {"name": "member_id", "in": "path", "required": True, "schema": _NAME}
_TP = object_schema({"topic": {"type": "string"}, "partition": OFFSET}, ("topic", "partition"))
_TOPIC_OFFSET = object_schema(
    {"topic": {"type": "string"}, "partition": OFFSET, "offset": OFFSET},
    ("topic", "partition", "offset"),
)
_MEMBER_FIELDS = {
    "group": {"type": "string"},
    "member_id": {"type": "string"},
    "generation": OFFSET,
    "assignment": {"type": "array", "items": _TP, "description": "partitions to consume now"},
    "revoking": {
        "type": "array",
        "items": _TP,
        "description": "partitions to finish and let go: heartbeat with `generation` once done",
    },
    "assignment_changed": {
        "type": "boolean",
        "description": "the assignment changed since the generation the member sent",
    },
    "session_timeout_ms": OFFSET,
}
_ERRORS = (400, 404, 409, 413, 503)


def group_paths(config: BrokerConfig) -> dict[str, Any]:
    return {
        "/v1/groups": {
            "get": operation(
                "list_groups", "Consumer groups", {"200": ok("GroupList")}, errors=(503,)
            )
        },
        "/v1/groups/{group}": {
            "parameters": [_GROUP],
            "get": operation(
                "describe_group",
                "Members, assignment, and per partition committed offset, high watermark, lag",
                {"200": ok("GroupDescription")},
                errors=(400, 404, 503),
            ),
            "delete": operation(
                "delete_group",
                "Forget an empty group and its committed offsets (409 while it has members)",
                {"204": {"description": "deleted"}},
                errors=(400, 404, 409, 503),
            ),
        },
        "/v1/groups/{group}/members": {
            "parameters": [_GROUP],
            "post": operation(
                "join_group",
                "Join: a new member id, the generation and the member's assignment",
                {"201": ok("Member")},
                body=json_body("JoinRequest"),
                errors=_ERRORS,
            ),
        },
        "/v1/groups/{group}/members/{member_id}": {
            "parameters": [_GROUP, _MEMBER],
            "delete": operation(
                "leave_group",
                "Leave: the member's partitions go to the others at once",
                {"204": {"description": "left"}},
                errors=(400, 409, 503),
            ),
        },
        "/v1/groups/{group}/members/{member_id}/heartbeat": {
            "parameters": [_GROUP, _MEMBER],
            "post": operation(
                "heartbeat",
                "Keep the session; the current generation and assignment",
                {"200": ok("Member")},
                body=json_body("HeartbeatRequest"),
                errors=_ERRORS,
            ),
        },
        **_group_fetch_paths(config),
    }


def _group_fetch_paths(config: BrokerConfig) -> dict[str, Any]:
    """A member's fetch from the group's committed offsets."""
    return {
        "/v1/groups/{group}/members/{member_id}/records": {
            "parameters": [_GROUP, _MEMBER],
            "get": operation(
                "group_fetch",
                "Records of the member's partitions from the group's committed offsets",
                {"200": ok("MemberRecords")},
                parameters=[
                    query("wait_ms", integer(0, config.fetch_wait_ms_max, 0), "long-poll up to"),
                    query(
                        "max_records",
                        integer(1, config.fetch_records_max),
                        "most records in the answer, over all partitions",
                    ),
                    query(
                        "max_bytes",
                        integer(1, config.fetch_bytes_max),
                        "most key, value and header bytes in the answer, over all partitions "
                        "(at least one record)",
                    ),
                    query("value_encoding", ENCODING, "string (UTF-8) or base64"),
                    query(
                        "auto_commit",
                        {"type": "string", "enum": ["true", "false"], "default": "false"},
                        "true: commit before answering (at-most-once)",
                    ),
                    *filter_parameters(config),
                ],
                errors=(400, 404, 406, 409, 503),
            ),
        },
        **_offset_paths(),
    }


def _offset_paths() -> dict[str, Any]:
    """Committed offsets, idempotent producers, and offset resets."""
    return {
        "/v1/groups/{group}/offsets": {
            "parameters": [_GROUP],
            "get": operation(
                "read_group_offsets",
                "Committed offsets (linearizable)",
                {"200": ok("GroupOffsets")},
                errors=(400, 503),
            ),
            "post": operation(
                "commit_offsets",
                "Commit offsets (the next offset to consume) as a member of a generation",
                {"200": ok("Committed")},
                body=json_body("CommitRequest"),
                errors=_ERRORS,
            ),
        },
        "/v1/producers": {
            "post": operation(
                "init_producer",
                "An idempotent producer's id and epoch (the same transactional_id: its id, "
                "epoch + 1, fencing the previous instance)",
                {"201": ok("Producer")},
                body={
                    "required": False,
                    "content": {"application/json": {"schema": ref("InitProducerRequest")}},
                },
                errors=(400, 413, 503),
            )
        },
        "/v1/groups/{group}/offsets/reset": {
            "parameters": [_GROUP],
            "post": operation(
                "reset_group_offsets",
                "Set an empty group's offsets: earliest, latest, a timestamp or given offsets",
                {"200": ok("GroupOffsets")},
                body=json_body("ResetRequest"),
                errors=_ERRORS,
            ),
        },
    }


def group_schemas(config: BrokerConfig) -> dict[str, Any]:
    del config
    return {
        "JoinRequest": object_schema(
            {
                "member_id": {
                    **_NAME,
                    "description": "the client's own member id (as KIP-1082): a retried join "
                    "with it is answered again instead of adding a second member; absent: the "
                    "broker draws one",
                },
                "topics": {
                    "type": "array",
                    "items": _NAME,
                    "minItems": 1,
                    "maxItems": limits.SUBSCRIPTION_TOPICS_MAX,
                },
                "topic_pattern": {
                    "type": "string",
                    "minLength": 1,
                    "maxLength": limits.TOPIC_PATTERN_CHARS_MAX,
                    "description": (
                        "an RE2 regular expression matched against whole topic names "
                        "(linear time; no backreferences or lookaround)"
                    ),
                },
                "session_timeout_ms": integer(
                    limits.SESSION_TIMEOUT_MS_MIN,
                    limits.SESSION_TIMEOUT_MS_MAX,
                    limits.SESSION_TIMEOUT_MS_DEFAULT,
                ),
                "assignor": {
                    "type": "string",
                    "enum": ["range", "roundrobin", "sticky"],
                    "default": "sticky",
                },
                "instance_id": {
                    "type": "string",
                    "pattern": f"^[a-zA-Z0-9._-]{{1,{limits.INSTANCE_ID_CHARS_MAX}}}$",
                    "description": "a static member's stable id (the member id adds 17 characters)",
                },
            }
        ),
        **_member_schemas(),
    }


def _member_schemas() -> dict[str, Any]:
    """A member as the group answers it, and its heartbeat and fetch."""
    return {
        "Member": object_schema(_MEMBER_FIELDS, tuple(_MEMBER_FIELDS)),
        "HeartbeatRequest": object_schema({"generation": OFFSET}, ("generation",)),
        "MemberRecords": object_schema(
            {
                **_MEMBER_FIELDS,
                "partitions": {
                    "type": "array",
                    "items": object_schema(
                        {
                            "topic": {"type": "string"},
                            "partition": OFFSET,
                            "offset": OFFSET,
                            "next_offset": {**OFFSET, "description": "what to commit"},
                            "high_watermark": OFFSET,
                            "records": {"type": "array", "items": ref("FetchedRecord")},
                        },
                        (
                            "topic",
                            "partition",
                            "offset",
                            "next_offset",
                            "high_watermark",
                            "records",
                        ),
                    ),
                },
            },
            (*_MEMBER_FIELDS, "partitions"),
        ),
        **_offset_schemas(),
    }


def _offset_schemas() -> dict[str, Any]:
    """Commits, committed offsets, resets and idempotent producers."""
    offsets = {
        "type": "array",
        "items": _TOPIC_OFFSET,
        "minItems": 1,
        "maxItems": limits.OFFSETS_PER_COMMIT_MAX,
    }
    return {
        "CommitRequest": object_schema(
            {
                "member_id": {**_NAME, "description": "absent: commit for an empty group"},
                "generation": integer(-1, 2**62),
                "offsets": offsets,
            },
            ("offsets",),
        ),
        "InitProducerRequest": object_schema(
            {"transactional_id": {"type": "string", "minLength": 1, "maxLength": 249}}
        ),
        "Producer": object_schema(
            {"producer_id": OFFSET, "producer_epoch": OFFSET}, ("producer_id", "producer_epoch")
        ),
        "Committed": object_schema({"committed": OFFSET}, ("committed",)),
        "GroupOffsets": object_schema(
            {"group": {"type": "string"}, "offsets": {"type": "array", "items": _TOPIC_OFFSET}},
            ("group", "offsets"),
        ),
        "ResetRequest": object_schema(
            {
                "to": {
                    "anyOf": [
                        {"type": "string", "enum": ["earliest", "latest"]},
                        object_schema({"timestamp": integer(0, 2**63 - 1)}, ("timestamp",)),
                        object_schema({"offsets": offsets}, ("offsets",)),
                    ]
                },
                "topics": {"type": "array", "items": _NAME, "minItems": 1, "maxItems": 1000},
            },
            ("to",),
        ),
        **_group_description_schemas(),
    }


def _group_description_schemas() -> dict[str, Any]:
    """Groups as listed and described (with lag)."""
    summary = {
        "group": {"type": "string"},
        "state": {"type": "string", "enum": ["empty", "stable", "reconciling"]},
        "generation": OFFSET,
        "assignor": {"type": "string"},
        "member_count": OFFSET,
    }
    nullable_offset = {"type": ["integer", "null"], "minimum": 0}
    return {
        "GroupList": object_schema(
            {"groups": {"type": "array", "items": object_schema(summary, tuple(summary))}},
            ("groups",),
        ),
        "GroupDescription": object_schema(
            {
                **summary,
                "members": {
                    "type": "array",
                    "items": object_schema(
                        {
                            "member_id": {"type": "string"},
                            "instance_id": {"type": ["string", "null"]},
                            "topics": {"type": "array", "items": {"type": "string"}},
                            "topic_pattern": {"type": ["string", "null"]},
                            "session_timeout_ms": OFFSET,
                            "assignment": {"type": "array", "items": _TP},
                            "revoking": {"type": "array", "items": _TP},
                        },
                        (
                            "member_id",
                            "instance_id",
                            "topics",
                            "topic_pattern",
                            "session_timeout_ms",
                            "assignment",
                            "revoking",
                        ),
                    ),  # fmt: skip
                },
                "partitions": {
                    "type": "array",
                    "items": object_schema(
                        {
                            "topic": {"type": "string"},
                            "partition": OFFSET,
                            "member_id": {"type": ["string", "null"]},
                            "committed_offset": nullable_offset,
                            "high_watermark": nullable_offset,
                            "lag": nullable_offset,
                        },
                        (
                            "topic",
                            "partition",
                            "member_id",
                            "committed_offset",
                            "high_watermark",
                            "lag",
                        ),
                    ),  # fmt: skip
                },
            },
            (*summary, "members", "partitions"),
        ),
    }
