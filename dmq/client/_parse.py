"""JSON answers of the broker to the client's value types (http_api/README.md shapes).

A required field that is missing or of the wrong type raises `DmqError` naming it, so a
broker and client that disagree fail loudly instead of yielding half-filled objects.
"""

from __future__ import annotations

from typing import Any, TypeVar

from dmq.client._types import (
    BrokerInfo,
    ClusterInfo,
    PartitionInfo,
    PartitionOffsets,
    TopicDescription,
    TopicSummary,
)
from dmq.errors import DmqError

T = TypeVar("T")


def _field(obj: Any, name: str, kind: type[T], where: str) -> T:
    value = obj.get(name) if isinstance(obj, dict) else None
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise DmqError(f"unexpected answer from the broker: {where}.{name} is {value!r}")
    return value


def _optional_int(obj: dict[str, Any], name: str, where: str) -> int | None:
    return None if obj.get(name) is None else _field(obj, name, int, where)


def parse_partition(obj: Any, where: str) -> PartitionInfo:
    leader = obj.get("leader") if isinstance(obj, dict) else None
    replicas = obj.get("replicas", []) if isinstance(obj, dict) else []
    return PartitionInfo(
        partition=_field(obj, "partition", int, where),
        leader=leader if isinstance(leader, str) else None,
        replicas=tuple(str(r) for r in replicas) if isinstance(replicas, list) else (),
        log_start_offset=_optional_int(obj, "log_start_offset", where),
        high_watermark=_optional_int(obj, "high_watermark", where),
        log_end_offset=_optional_int(obj, "log_end_offset", where),
        status=str(obj.get("status", "active")) if isinstance(obj, dict) else "active",
        remote_end_offset=_optional_int(obj, "remote_end_offset", where),
        local_bytes=_optional_int(obj, "local_bytes", where),
        remote_bytes=_optional_int(obj, "remote_bytes", where),
    )


def parse_description(obj: Any) -> TopicDescription:
    partitions = _field(obj, "partitions", list, "topic")
    config = obj.get("config") or {}
    return TopicDescription(
        name=_field(obj, "name", str, "topic"),
        partitions=tuple(
            parse_partition(p, f"topic.partitions[{i}]") for i, p in enumerate(partitions)
        ),
        replication_factor=_field(obj, "replication_factor", int, "topic"),
        config=dict(config) if isinstance(config, dict) else {},
    )


def parse_topic_list(obj: Any) -> list[TopicSummary]:
    topics = _field(obj, "topics", list, "answer")
    return [
        TopicSummary(
            name=_field(t, "name", str, f"topics[{i}]"),
            partitions=_field(t, "partitions", int, f"topics[{i}]"),
            replication_factor=_field(t, "replication_factor", int, f"topics[{i}]"),
        )
        for i, t in enumerate(topics)
    ]


def parse_offsets(obj: Any, topic: str) -> PartitionOffsets:
    return PartitionOffsets(
        topic=topic,
        partition=_field(obj, "partition", int, "offsets"),
        log_start_offset=_field(obj, "log_start_offset", int, "offsets"),
        high_watermark=_field(obj, "high_watermark", int, "offsets"),
        offset=_optional_int(obj, "offset", "offsets"),
        last_stable_offset=_optional_int(obj, "last_stable_offset", "offsets"),
    )


def parse_cluster(obj: Any) -> ClusterInfo:
    brokers = obj.get("brokers", []) if isinstance(obj, dict) else []
    return ClusterInfo(
        cluster_id=str(_field(obj, "cluster_id", str, "cluster")),
        node_id=str(obj.get("node_id", "")),
        brokers=tuple(
            BrokerInfo(str(b.get("node_id", "")), str(b.get("http_addr", "")))
            for b in (brokers if isinstance(brokers, list) else [])
            if isinstance(b, dict)
        ),
    )
