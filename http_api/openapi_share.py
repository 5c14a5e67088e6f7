"""The OpenAPI paths and schemas of share groups (http_api/share.py's routes). Assembled
by http_api/openapi.py."""

from __future__ import annotations

from typing import Any

from dmq import limits
from dmq.broker.share import SHARE_LIMITS
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

_LIMITS = SHARE_LIMITS
_NAME = {"type": "string", "pattern": f"^[a-zA-Z0-9._-]{{1,{limits.GROUP_NAME_CHARS_MAX}}}$"}
_GROUP = {"name": "group", "in": "path", "required": True, "schema": _NAME}
_MEMBER = {"name": "member_id", "in": "path", "required": True, "schema": _NAME}
_ERRORS = (400, 404, 409, 413, 503)
_CONFIG = {
    "lock_duration_ms": {
        **integer(_LIMITS.lock_duration_ms_min, _LIMITS.lock_duration_ms_max, 30_000),
        "description": "how long a delivered record stays locked to its member",
    },
    "max_delivery_attempts": {
        **integer(1, _LIMITS.max_delivery_attempts_max, 5),
        "description": "deliveries before a record goes to the dead-letter topic",
    },
    "dead_letter_topic": {
        **_NAME,
        "description": (
            "a topic name, not '.' or '..'; default <group>.dlq (created on demand, with the "
            "source topics' max_record_bytes; a group without one has at most 245 characters)"
        ),
    },
    "max_in_flight_records": {
        **integer(1, _LIMITS.max_in_flight_records_max, 2_000),
        "description": "records between a share-partition's start and end offsets, at most",
    },
    "session_timeout_ms": {
        **integer(_LIMITS.session_timeout_ms_min, _LIMITS.session_timeout_ms_max, 45_000),
        "description": (
            "a member silent this long is removed and its locks released; at least "
            "lock_duration_ms (else 400)"
        ),
    },
}


def share_paths(config: BrokerConfig) -> dict[str, Any]:
    return {
        "/v1/share-groups": {
            "get": operation(
                "list_share_groups",
                "Share groups and their config",
                {"200": ok("ShareGroupList")},
                errors=(503,),
            )  # fmt: skip
        },
        "/v1/share-groups/{group}": {
            "parameters": [_GROUP],
            "get": operation(
                "describe_share_group",
                "Config, members, and per partition start and end offsets, records in flight, "
                "acquired, available, accepted, archived and dead-lettered",
                {"200": ok("ShareGroupDescription")},
                errors=(400, 404, 503),
            ),
            "put": operation(
                "put_share_group",
                "Create a share group or change the settings given (the others stay)",
                {"200": ok("ShareGroupSummary")},
                body=json_body("ShareGroupConfig"),
                errors=_ERRORS,
            ),
            "delete": operation(
                "delete_share_group",
                "Forget a share group with no members (409 while it has some)",
                {"204": {"description": "deleted"}},
                errors=(400, 404, 409, 503),
            ),
        },
        "/v1/share-groups/{group}/members": {
            "parameters": [_GROUP],
            "post": operation(
                "join_share_group",
                "Join (creating the group with the defaults if needed): a new member id",
                {"201": ok("ShareMember")},
                body=json_body("ShareJoinRequest"),
                errors=_ERRORS,
            ),
        },
        "/v1/share-groups/{group}/members/{member_id}": {
            "parameters": [_GROUP, _MEMBER],
            "delete": operation(
                "leave_share_group",
                "Leave: the member's locked records are offered to the others at once",
                {"204": {"description": "left"}},
                errors=(400, 409, 503),
            ),
        },
        **_record_paths(config),
    }


def _record_paths(config: BrokerConfig) -> dict[str, Any]:
    return {
        "/v1/share-groups/{group}/members/{member_id}/records": {
            "parameters": [_GROUP, _MEMBER],
            "get": operation(
                "share_poll",
                "Records locked to this member (redeliveries first), long-polling up to wait_ms",
                {"200": ok("ShareRecords")},
                parameters=[
                    query("wait_ms", integer(0, config.fetch_wait_ms_max, 0), "long-poll up to"),
                    query("max_records", integer(1, config.fetch_records_max), "most records"),
                    query(
                        "max_bytes",
                        integer(1, config.fetch_bytes_max),
                        "most bytes read per partition",
                    ),  # fmt: skip
                    query("value_encoding", ENCODING, "string (UTF-8) or base64"),
                    # Records the filter leaves out are skipped for the whole group, as
                    # consumed (groups/README.md, "Filtered polls").
                    *filter_parameters(config),
                ],
                errors=(400, 404, 406, 409, 503),
            ),
        },
        "/v1/share-groups/{group}/members/{member_id}/acks": {
            "parameters": [_GROUP, _MEMBER],
            "post": operation(
                "share_ack",
                "Acknowledge records: all or none (409 lock_not_held if a lock expired or "
                "another member holds a record)",
                {"200": ok(object_schema({"acknowledged": OFFSET}, ("acknowledged",)))},
                body=json_body("ShareAckRequest"),
                errors=_ERRORS,
            ),
        },
    }


def share_schemas(config: BrokerConfig) -> dict[str, Any]:
    del config
    summary = {
        "group": {"type": "string"},
        **{k: {"type": "string"} if k == "dead_letter_topic" else OFFSET for k in _CONFIG},
        "member_count": OFFSET,
    }
    record_fields = {
        "topic": {"type": "string"},
        "partition": OFFSET,
        "offset": OFFSET,
        "delivery_count": OFFSET,
        "locked_until": {**OFFSET, "description": "ms since the epoch; ack before it"},
        "timestamp": {"type": ["integer", "null"]},
        "key": {"type": ["string", "null"]},
        "value": {"type": ["string", "null"]},
        "headers": {"type": "array", "items": object_schema(
            {"key": {"type": "string"}, "value": {"type": ["string", "null"]}}, ("key", "value"))},
    }  # fmt: skip
    partition = {
        k: {"type": "string"} if k == "topic" else OFFSET
        for k in ("topic", "partition", "start_offset", "end_offset", "in_flight", "acquired",
                  "available", "dead_lettering", "accepted", "archived", "dead_lettered")
    }  # fmt: skip
    member = {"member_id": {"type": "string"}, "topics": {"type": "array",
              "items": {"type": "string"}}, "joined_ms": OFFSET}  # fmt: skip
    return {
        "ShareGroupConfig": object_schema(_CONFIG),
        "ShareGroupSummary": object_schema(summary, tuple(summary)),
        "ShareGroupList": object_schema(
            {"share_groups": {"type": "array", "items": ref("ShareGroupSummary")}},
            ("share_groups",),
        ),
        "ShareGroupDescription": object_schema(
            {
                **summary,
                "members": {"type": "array", "items": object_schema(member, tuple(member))},
                "partitions": {
                    "type": "array",
                    "items": object_schema(partition, tuple(partition)),
                },
            },
            (*summary, "members", "partitions"),
        ),  # fmt: skip
        "ShareJoinRequest": object_schema(
            {
                "topics": {
                    "type": "array",
                    "items": _NAME,
                    "minItems": 1,
                    "maxItems": _LIMITS.topics_per_member_max,
                }
            },
            ("topics",),
        ),  # fmt: skip
        "ShareMember": object_schema(
            {"group": {"type": "string"}, "member_id": {"type": "string"}}, ("group", "member_id")
        ),
        "ShareRecords": object_schema(
            {
                "group": {"type": "string"},
                "member_id": {"type": "string"},
                "records": {
                    "type": "array",
                    "items": object_schema(record_fields, tuple(record_fields)),
                },
            },
            ("group", "member_id", "records"),
        ),  # fmt: skip
        "ShareAckRequest": object_schema(
            {
                "acks": {
                    "type": "array",
                    "minItems": 1,
                    "items": object_schema(
                        {
                            "topic": _NAME,
                            "partition": integer(0, limits.PARTITIONS_PER_TOPIC_MAX - 1),
                            "offsets": {
                                "type": "array",
                                "minItems": 1,
                                "maxItems": _LIMITS.records_per_command_max,
                                "items": integer(0, 2**63 - 1),
                            },
                            "type": {"type": "string", "enum": ["accept", "release", "reject"]},
                            "delay_ms": {
                                **integer(0, _LIMITS.delay_ms_max, 0),
                                "description": "release only: not offered again before",
                            },
                        },
                        ("topic", "partition", "offsets", "type"),
                    ),
                }
            },
            ("acks",),
        ),  # fmt: skip
    }
