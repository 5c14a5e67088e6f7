"""Topic names and topic configuration: pure validation.

The catalogue itself (which topics exist, their partitions, placement and config) is
the metadata Raft group's state (dmq/metadata/machine.py, dmq/metadata/service.py). The Broker checks
names and config values here before it proposes a command: raft/ may not import dmq/.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from dmq import limits
from dmq.config import BrokerConfig
from dmq.errors import InvalidConfig, InvalidRequest
from log.config import CleanupPolicy, FlushPolicy, LogConfig

_TOPIC_NAME = re.compile(r"[a-zA-Z0-9._-]+")  # fullmatch: "$" would let a trailing \n through


def check_topic_name(name: str) -> None:
    if (
        not name
        or len(name) > limits.TOPIC_NAME_CHARS_MAX
        or not _TOPIC_NAME.fullmatch(name)
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
    kind: str  # "int", "choice" or "bool" (stored as "true"/"false": config holds ints and strings)
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
    # Tiered storage (dmq/tiered/README.md): off unless set; -1: as retention_ms/_bytes.
    "remote_storage_enable": _Key("bool", choices=("true", "false")),
    "local_retention_ms": _Key("int", minimum=-1),
    "local_retention_bytes": _Key("int", minimum=-1),
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
        "remote_storage_enable": "false",
        "local_retention_ms": -1,
        "local_retention_bytes": -1,
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
        elif spec.kind == "bool":
            if isinstance(value, bool):
                value = "true" if value else "false"
            if value not in spec.choices:
                raise InvalidConfig(f"config {key} must be true or false", field=f"config.{key}")
            if value == "true" and not broker.remote_storage:
                raise InvalidConfig(
                    f"config {key}: this broker has no --remote-storage", field=f"config.{key}"
                )
        elif value not in spec.choices:
            raise InvalidConfig(
                f"config {key} must be one of {', '.join(spec.choices)}", field=f"config.{key}"
            )
        out[key] = value
    return out


def check_tiered_config(config: dict[str, Any]) -> None:
    """Relations of a topic's whole config (defaults, stored and updates merged): local
    retention at most the total one; no tiered storage of a compacted topic (compaction
    rewrites closed segments, which would then differ from their uploaded copies)."""
    for kind in ("ms", "bytes"):
        local, total = (
            config.get(f"local_retention_{kind}", -1),
            config.get(f"retention_{kind}", -1),
        )
        if local >= 0 and total >= 0 and local > total:
            raise InvalidConfig(
                f"config local_retention_{kind}={local} exceeds retention_{kind}={total}",
                field=f"config.local_retention_{kind}",
                limit=total,
            )
    if config.get("remote_storage_enable") == "true" and config.get("cleanup_policy") != "delete":
        raise InvalidConfig(
            "config remote_storage_enable needs cleanup_policy delete (a compacted topic's "
            "segments are rewritten after they close)",
            field="config.remote_storage_enable",
        )


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
        remote_storage_enable=topic_config.get("remote_storage_enable") == "true",
        local_retention_ms=_local(topic_config, "ms"),
        local_retention_bytes=_local(topic_config, "bytes"),
        batch_bytes_max=broker.batch_bytes_max,
        flush=FlushPolicy(interval_records=None, interval_ms=None),
    )


def _local(topic_config: dict[str, Any], kind: str) -> int | None:
    """local_retention_<kind>, -1 meaning the total retention's (None: no limit)."""
    local = topic_config.get(f"local_retention_{kind}", -1)
    total = topic_config[f"retention_{kind}"]
    value = total if local < 0 else local
    return None if value < 0 else value
