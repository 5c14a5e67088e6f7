"""The OpenAPI paths and schemas of topic administration: list, create, describe, alter
the config, add partitions, delete (http_api/app.py's /v1/topics routes). Assembled by
http_api/openapi.py; a topic's records are in http_api/openapi_records.py.
"""

from __future__ import annotations

from typing import Any

from dmq import limits
from dmq.config import BrokerConfig
from dmq.topics import TOPIC_CONFIG_KEYS
from http_api.openapi_schema import (
    CONSISTENCY_PARAMETER,
    NULLABLE_STRING,
    OFFSET,
    TOPIC_PARAMETER,
    integer,
    json_body,
    object_schema,
    ok,
    operation,
    or_null,
    ref,
)


def topic_paths() -> dict[str, Any]:
    """List, create, describe, alter, grow and delete topics."""
    return {
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
    }


def topic_schemas(config: BrokerConfig) -> dict[str, Any]:
    """A topic's name, config, description, and the admin requests; the bounds
    are the broker's (default partitions, replication factor)."""
    return {
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
        **_description_schemas(config),
    }


def _description_schemas(config: BrokerConfig) -> dict[str, Any]:
    """A topic as described, with this broker's offsets of each partition."""
    return {
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
                            # tiered storage (dmq/tiered/README.md): null where off
                            "remote_end_offset": or_null(OFFSET),
                            "local_bytes": or_null(OFFSET),
                            "remote_bytes": or_null(OFFSET),
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
    }


def _topic_config(config: BrokerConfig, *, for_request: bool) -> dict[str, Any]:
    """The topic config keys (dmq.topics.TOPIC_CONFIG_KEYS). Requests carry their
    bounds; a description states every key, with the values the topic has."""
    properties: dict[str, Any] = {}
    for key, spec in TOPIC_CONFIG_KEYS.items():
        if spec.kind == "choice":
            properties[key] = {"type": "string", "enum": list(spec.choices)}
        elif spec.kind == "bool":  # described as a JSON boolean; requests may spell it "true"
            properties[key] = (
                {"type": ["boolean", "string"], "enum": [True, False, "true", "false"]}
                if for_request
                else {"type": "boolean"}
            )
        elif for_request:
            maximum = config.batch_bytes_max if key == "max_record_bytes" else spec.maximum
            properties[key] = integer(spec.minimum, maximum)
        else:
            properties[key] = {"type": "integer"}
    required = () if for_request else tuple(sorted(TOPIC_CONFIG_KEYS))
    return object_schema(properties, required, closed=for_request)
