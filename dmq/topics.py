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
