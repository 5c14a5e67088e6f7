"""The OpenAPI paths and schemas of the Confluent REST Proxy v2 routes (http_api/rest_v2.py).
Assembled by http_api/openapi.py. Their answers carry the proxy's content types and its
error shape, {"error_code", "message"} (RestV2Error), not dmq's."""

from __future__ import annotations

from typing import Any

from dmq import limits
from dmq.config import BrokerConfig
from http_api.openapi_schema import INT32_MAX, INT64_MAX, integer, object_schema, query, ref

V2 = "application/vnd.kafka.v2+json"
V2_JSON = "application/vnd.kafka.json.v2+json"
V2_BINARY = "application/vnd.kafka.binary.v2+json"
_ANSWER_TYPES = (V2, "application/vnd.kafka+json", "application/json")
_BODY_TYPES = (V2, V2_JSON, V2_BINARY, "application/vnd.kafka+json", "application/json")
_ERRORS = (400, 404, 406, 409, 413, 415, 416, 422, 429, 503, 504, 507)
_NAME = {"type": "string", "pattern": f"^[a-zA-Z0-9._-]{{1,{limits.GROUP_NAME_CHARS_MAX}}}$"}
_TOPIC = {"name": "topic", "in": "path", "required": True, "schema": {"type": "string"}}
_PARTITION = {"name": "p", "in": "path", "required": True, "schema": integer(0, INT32_MAX)}
_GROUP = {"name": "group", "in": "path", "required": True, "schema": _NAME}
_INSTANCE = {"name": "instance", "in": "path", "required": True, "schema": _NAME}
_TAG = "Confluent REST Proxy v2"


def _content(schema: dict[str, Any], types: tuple[str, ...] = _ANSWER_TYPES) -> dict[str, Any]:
    return {kind: {"schema": schema} for kind in types}


def _op(
    operation_id: str,
    summary: str,
    responses: dict[str, Any],
    *,
    parameters: list[dict[str, Any]] | None = None,
    body: dict[str, Any] | None = None,
    body_required: bool = True,
) -> dict[str, Any]:
    """One v2 operation: its errors in the proxy's shape; a bug's 500 in dmq's."""
    op: dict[str, Any] = {"operationId": operation_id, "summary": summary, "tags": [_TAG]}
    if parameters:
        op["parameters"] = parameters
    if body is not None:
        op["requestBody"] = {"required": body_required, "content": _content(body, _BODY_TYPES)}
    errors = {
        str(status): {
            "description": "the proxy's error shape",
            "content": {V2: {"schema": ref("RestV2Error")}},
        }  # fmt: skip
        for status in _ERRORS
    }
    op["responses"] = {**responses, **errors, "500": {"$ref": "#/components/responses/Error500"}}
    return op


def _ok(schema: dict[str, Any], types: tuple[str, ...] = _ANSWER_TYPES) -> dict[str, Any]:
    return {"description": "success", "content": _content(schema, types)}


_NO_CONTENT = {"204": {"description": "done"}}
_EMBEDDED = {"description": "json: any JSON value; binary: base64 (either may be null)"}


def rest_v2_paths(config: BrokerConfig) -> dict[str, Any]:
    fetch_params = [
        query("timeout", integer(0, INT64_MAX), f"longest wait, ms (capped at "
              f"fetch_wait_ms_max = {config.fetch_wait_ms_max})"),
        query("max_bytes", integer(1, INT64_MAX), f"key and value bytes, at most "
              f"fetch_bytes_max = {config.fetch_bytes_max} (capped)"),
    ]  # fmt: skip
    records_answer = _ok({"type": "array", "items": ref("RestV2Record")}, (V2_BINARY, V2_JSON))
    produce = _op("v2_produce", "Produce records (json or binary embedded)",
                  {"200": _ok(ref("RestV2ProduceAnswer"))}, body=ref("RestV2Produce"))  # fmt: skip
    produce_partition = _op(
        "v2_produce_partition", "Produce records to one partition",
        {"200": _ok(ref("RestV2ProduceAnswer"))}, body=ref("RestV2ProducePartition"),
    )  # fmt: skip
    instance = "/consumers/{group}/instances/{instance}"
    return {
        "/topics": {
            "get": _op(
                "v2_list_topics",
                "Topic names",
                {"200": _ok({"type": "array", "items": {"type": "string"}})},
            )
        },
        "/topics/{topic}": {
            "parameters": [_TOPIC],
            "get": _op(
                "v2_get_topic", "A topic: configs and partitions", {"200": _ok(ref("RestV2Topic"))}
            ),
            "post": produce,
        },  # fmt: skip
        "/topics/{topic}/partitions": {
            "parameters": [_TOPIC],
            "get": _op(
                "v2_get_partitions",
                "A topic's partitions",
                {"200": _ok({"type": "array", "items": ref("RestV2Partition")})},
            ),
        },  # fmt: skip
        "/topics/{topic}/partitions/{p}": {
            "parameters": [_TOPIC, _PARTITION],
            "get": _op("v2_get_partition", "One partition", {"200": _ok(ref("RestV2Partition"))}),
            "post": produce_partition,
        },
        "/topics/{topic}/partitions/{p}/offsets": {
            "parameters": [_TOPIC, _PARTITION],
            "get": _op(
                "v2_get_partition_offsets",
                "First and next offsets of a partition",
                {
                    "200": _ok(
                        object_schema(
                            {
                                "beginning_offset": {"type": "integer"},
                                "end_offset": {"type": "integer"},
                            }
                        )
                    )
                },
            ),
        },  # fmt: skip
        "/topics/{topic}/partitions/{p}/records": {
            "parameters": [_TOPIC, _PARTITION],
            "get": _op(
                "v2_get_partition_records",
                "Records from an offset (Redpanda's route)",
                {"200": records_answer},
                parameters=[
                    {**query("offset", integer(0, INT64_MAX), "first offset"), "required": True},
                    *fetch_params,
                ],
            ),
        },  # fmt: skip
        "/consumers/{group}": {
            "parameters": [_GROUP],
            "post": _op(
                "v2_create_consumer",
                "Create a consumer instance",
                {"200": _ok(ref("RestV2Instance"))},
                body=ref("RestV2CreateConsumer"),
                body_required=False,
            ),
        },  # fmt: skip
        instance: {
            "parameters": [_GROUP, _INSTANCE],
            "delete": _op(
                "v2_delete_consumer", "Delete the instance (leaves its group)", _NO_CONTENT
            ),
        },  # fmt: skip
        instance + "/subscription": {
            "parameters": [_GROUP, _INSTANCE],
            "post": _op(
                "v2_subscribe",
                "Subscribe (replaces the subscription)",
                _NO_CONTENT,
                body=ref("RestV2Subscription"),
            ),
            "get": _op(
                "v2_get_subscription",
                "The subscribed topics",
                {
                    "200": _ok(
                        object_schema({"topics": {"type": "array", "items": {"type": "string"}}})
                    )
                },
            ),
            "delete": _op("v2_unsubscribe", "Unsubscribe (leaves the group)", _NO_CONTENT),
        },  # fmt: skip
        instance + "/assignments": {
            "parameters": [_GROUP, _INSTANCE],
            "get": _op(
                "v2_get_assignments",
                "The partitions assigned to the instance",
                {"200": _ok(ref("RestV2Partitions"))},
            ),
        },  # fmt: skip
        instance + "/records": {
            "parameters": [_GROUP, _INSTANCE],
            "get": _op(
                "v2_get_records",
                "Records from the instance's positions (long-poll)",
                {"200": records_answer},
                parameters=fetch_params,
            ),
        },  # fmt: skip
        instance + "/offsets": {
            "parameters": [_GROUP, _INSTANCE],
            "post": _op(
                "v2_commit_offsets",
                "Commit offset + 1 of each given record; no body: all fetched",
                {"200": {"description": "committed (no body)"}},
                body=ref("RestV2Offsets"),
                body_required=False,
            ),
            "get": _op(
                "v2_get_offsets",
                "The group's committed offsets of the partitions",
                {"200": _ok(ref("RestV2CommittedOffsets"))},
                body=ref("RestV2Partitions"),
            ),
        },  # fmt: skip
        instance + "/positions": {
            "parameters": [_GROUP, _INSTANCE],
            "post": _op(
                "v2_seek",
                "The next fetch starts at these offsets",
                _NO_CONTENT,
                body=ref("RestV2Offsets"),
            ),
        },  # fmt: skip
        **{
            f"{instance}/positions/{edge}": {
                "parameters": [_GROUP, _INSTANCE],
                "post": _op(
                    f"v2_seek_to_{edge}",
                    f"The next fetch starts at the {edge}",
                    _NO_CONTENT,
                    body=ref("RestV2Partitions"),
                ),
            }
            for edge in ("beginning", "end")
        },  # fmt: skip
    }


def rest_v2_schemas(config: BrokerConfig) -> dict[str, Any]:
    tp = {"topic": {"type": "string"}, "partition": integer(0, INT32_MAX)}
    partition = object_schema({
        "partition": {"type": "integer"},
        "leader": {"type": ["string", "null"], "description": "dmq node id"},
        "replicas": {"type": "array", "items": object_schema(
            {"broker": {"type": "string"}, "leader": {"type": "boolean"},
             "in_sync": {"type": "boolean"}})},
    })  # fmt: skip

    def produce(with_partition: bool) -> dict[str, Any]:
        fields: dict[str, Any] = {"key": _EMBEDDED, "value": _EMBEDDED}
        if with_partition:
            fields["partition"] = {"anyOf": [integer(0, INT32_MAX), {"type": "null"}]}
        nulls = {"type": "null", "description": "schemas are not served"}
        return object_schema(
            {"records": {"type": "array", "minItems": 1, "maxItems": config.produce_records_max,
                         "items": object_schema(fields)},
             **dict.fromkeys(("key_schema", "value_schema", "key_schema_id",
                              "value_schema_id"), nulls)},
            ("records",),
        )  # fmt: skip

    offsets = {"type": "array", "minItems": 1, "maxItems": limits.OFFSETS_PER_COMMIT_MAX,
               "items": object_schema({**tp, "offset": integer(0, INT64_MAX - 1),
                                       "metadata": {"type": "string"}},
                                      ("topic", "partition", "offset"))}  # fmt: skip
    choice = {"type": "string"}
    return {
        "RestV2Error": object_schema(
            {"error_code": {"type": "integer"}, "message": {"type": "string"}},
            ("error_code", "message"),
        ),
        "RestV2Topic": object_schema({"name": {"type": "string"},
                                      "configs": {"type": "object"},
                                      "partitions": {"type": "array", "items": partition}}),
        "RestV2Partition": partition,
        "RestV2Produce": produce(True),
        "RestV2ProducePartition": produce(False),
        "RestV2ProduceAnswer": object_schema({
            "offsets": {"type": "array", "items": object_schema({
                "partition": {"type": "integer"}, "offset": {"type": "integer"},
                "error_code": {"type": ["integer", "null"]},
                "error": {"type": ["string", "null"]}})},
            "key_schema_id": {"type": "null"}, "value_schema_id": {"type": "null"}}),
        "RestV2CreateConsumer": object_schema({
            "name": _NAME,
            "format": {**choice, "enum": ["binary", "json"]},
            "auto.offset.reset": {**choice, "enum": ["earliest", "latest", "none"]},
            "auto.commit.enable": {"enum": ["true", "false", True, False]},
            "consumer.request.timeout.ms": {"anyOf": [integer(0, config.fetch_wait_ms_max),
                                                      {"type": "string"}]},
            "fetch.min.bytes": {"anyOf": [integer(0, INT32_MAX), {"type": "string"}]}}),
        "RestV2Instance": object_schema({"instance_id": {"type": "string"},
                                         "base_uri": {"type": "string"}}),
        "RestV2Subscription": object_schema({
            "topics": {"type": "array", "minItems": 1,
                       "maxItems": limits.SUBSCRIPTION_TOPICS_MAX, "items": _NAME},
            "topic_pattern": {"type": "string", "minLength": 1,
                              "maxLength": limits.TOPIC_PATTERN_CHARS_MAX}}),
        "RestV2Partitions": object_schema({"partitions": {
            "type": "array", "items": object_schema(tp, ("topic", "partition"))}},
            ("partitions",)),
        "RestV2Offsets": object_schema({"offsets": offsets}, ("offsets",)),
        "RestV2CommittedOffsets": object_schema({"offsets": {
            "type": "array", "items": object_schema(
                {**tp, "offset": {"type": "integer"}, "metadata": {"type": "string"}})}}),
        "RestV2Record": object_schema({
            "topic": {"type": "string"}, "key": {}, "value": {},
            "partition": {"type": "integer"}, "offset": {"type": "integer"}}),
    }  # fmt: skip
