"""Topic names, topic configuration and the topic catalogue of a single node.

The catalogue (which topics exist, their partition counts and config) is what the
metadata Raft group will own in a cluster; on one node it is a JSON file written
atomically (`<data-dir>/meta/topics.json`). Everything here is pure validation plus
that one file.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dmq import limits
from dmq.config import BrokerConfig
from dmq.errors import InvalidConfig, InvalidRequest
from log.config import CleanupPolicy, FlushPolicy, LogConfig
from log.segment import fsync_directory, write_durably

_TOPIC_NAME = re.compile(r"^[a-zA-Z0-9._-]+$")


def check_topic_name(name: str) -> None:
    if (
        not name
        or len(name) > limits.TOPIC_NAME_CHARS_MAX
        or not _TOPIC_NAME.match(name)
        or name in (".", "..")
    ):
        raise InvalidRequest(
            f"topic name {name!r} must be 1-{limits.TOPIC_NAME_CHARS_MAX} characters of "
            "[a-zA-Z0-9._-] and not '.' or '..'",
            field="name",
            limit=limits.TOPIC_NAME_CHARS_MAX,
        )


@dataclass(frozen=True, slots=True)
class _Key:
    kind: str  # "int" or "choice"
    minimum: int = 0
    maximum: int = 2**63 - 1
    choices: tuple[str, ...] = ()


# Every topic setting: its type and range. -1 means "no limit" where allowed.
TOPIC_CONFIG_KEYS: dict[str, _Key] = {
    "retention_ms": _Key("int", minimum=-1),
    "retention_bytes": _Key("int", minimum=-1),
    "segment_bytes": _Key("int", minimum=1024, maximum=1024 * 1024 * 1024),
    "segment_ms": _Key("int", minimum=1),
    "cleanup_policy": _Key("choice", choices=tuple(p.value for p in CleanupPolicy)),
    "delete_retention_ms": _Key("int", minimum=0),
    "max_record_bytes": _Key("int", minimum=1),
    "timestamp_type": _Key("choice", choices=("create", "log_append")),
}


def default_topic_config(broker: BrokerConfig) -> dict[str, Any]:
    return {
        "retention_ms": broker.retention_ms,
        "retention_bytes": broker.retention_bytes,
        "segment_bytes": broker.segment_bytes,
        "segment_ms": 7 * 24 * 3600 * 1000,
        "cleanup_policy": CleanupPolicy.DELETE.value,
        "delete_retention_ms": 24 * 3600 * 1000,
        "max_record_bytes": broker.record_bytes_max,
        "timestamp_type": "create",
    }


def validate_topic_config(updates: Any, broker: BrokerConfig) -> dict[str, Any]:
    """Check a user's config object; returns it normalised. Names the bad key."""
    if not isinstance(updates, dict):
        raise InvalidConfig("config must be a JSON object", field="config")
    out: dict[str, Any] = {}
    for key, value in updates.items():
        spec = TOPIC_CONFIG_KEYS.get(key)
        if spec is None:
            raise InvalidConfig(
                f"unknown topic config key {key!r}; known: {', '.join(sorted(TOPIC_CONFIG_KEYS))}",
                field=f"config.{key}",
            )
        if spec.kind == "int":
            maximum = broker.batch_bytes_max if key == "max_record_bytes" else spec.maximum
            if isinstance(value, bool) or not isinstance(value, int):
                raise InvalidConfig(f"config {key} must be an integer", field=f"config.{key}")
            if not spec.minimum <= value <= maximum:
                raise InvalidConfig(
                    f"config {key}={value} is outside [{spec.minimum}, {maximum}]",
                    field=f"config.{key}",
                    limit=maximum if value > maximum else spec.minimum,
                )
        elif value not in spec.choices:
            raise InvalidConfig(
                f"config {key} must be one of {', '.join(spec.choices)}", field=f"config.{key}"
            )
        out[key] = value
    return out


def log_config_for(topic_config: dict[str, Any], broker: BrokerConfig) -> LogConfig:
    """The storage settings of a partition of this topic. The replica does the
    flushing itself (group commit), so the log's own flush triggers are off."""
    retention_ms = topic_config["retention_ms"]
    retention_bytes = topic_config["retention_bytes"]
    return LogConfig(
        segment_bytes=topic_config["segment_bytes"],
        segment_ms=topic_config["segment_ms"],
        retention_ms=None if retention_ms < 0 else retention_ms,
        retention_bytes=None if retention_bytes < 0 else retention_bytes,
        cleanup_policy=CleanupPolicy(topic_config["cleanup_policy"]),
        delete_retention_ms=topic_config["delete_retention_ms"],
        batch_bytes_max=broker.batch_bytes_max,
        flush=FlushPolicy(interval_records=None, interval_ms=None),
    )


@dataclass(slots=True)
class TopicMeta:
    name: str
    partitions: int
    replication_factor: int
    config: dict[str, Any] = field(default_factory=dict)
    topic_id: int = 0  # distinguishes a re-created topic from a deleted one of the same name


class TopicCatalogue:
    """The node-local topic catalogue, persisted atomically as JSON."""

    def __init__(self, meta_dir: Path) -> None:
        self.path = meta_dir / "topics.json"
        meta_dir.mkdir(parents=True, exist_ok=True)
        self.topics: dict[str, TopicMeta] = {}
        self.next_topic_id = 1
        if self.path.exists():
            raw = json.loads(self.path.read_text())
            self.next_topic_id = raw["next_topic_id"]
            for t in raw["topics"]:
                self.topics[t["name"]] = TopicMeta(**t)

    def save(self) -> None:
        payload = {
            "next_topic_id": self.next_topic_id,
            "topics": [
                {
                    "name": t.name,
                    "partitions": t.partitions,
                    "replication_factor": t.replication_factor,
                    "config": t.config,
                    "topic_id": t.topic_id,
                }
                for t in self.topics.values()
            ],
        }
        write_durably(self.path, json.dumps(payload, indent=1, sort_keys=True).encode())
        fsync_directory(self.path.parent)
