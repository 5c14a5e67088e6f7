"""Commands of the consumer-group state machine and their wire encoding.

Each command is a frozen, slotted dataclass with a `version`; `now_ms` is stamped by the
proposer (the metadata leader or the broker that took the request), never read from a clock
during apply. Ids come in the command too: the broker draws a member id before proposing
a join, so every replica applies the same id.

Encoding: `{"type": ..., "version": ..., "fields": {...}}` as compact, key-sorted JSON, the
same envelope as dmq/metadata/machine.py's commands (the metadata group carries both kinds).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, fields
from typing import Any, Final

COMMAND_VERSION: Final = 1
COMMAND_VERSIONS_SUPPORTED: Final = frozenset({1})

OffsetItem = tuple[str, int, int]  # (topic, partition, offset)


class GroupCommandDecodeError(ValueError):
    """The bytes are not a group command this code understands."""


@dataclass(frozen=True, slots=True)
class UpdateTopics:
    """The catalogue's topics and partition counts, applied after every topic change, so
    subscriptions follow created, grown and deleted topics without a restart. `gone`:
    the (topic, partition) pairs decommissioned and removed, never assigned again."""

    topics: tuple[tuple[str, int], ...]
    now_ms: int
    version: int = COMMAND_VERSION
    gone: tuple[tuple[str, int], ...] = ()

    def __post_init__(self) -> None:
        object.__setattr__(self, "topics", tuple(sorted((str(n), c) for n, c in self.topics)))
        object.__setattr__(self, "gone", tuple(sorted((str(n), p) for n, p in self.gone)))


@dataclass(frozen=True, slots=True)
class JoinGroup:
    """A new member (or a static member's new incarnation, by `instance_id`) joins.

    `topics` or `topic_pattern` (an RE2 regular expression matched against whole topic
    names, in linear time) is the subscription; "" means none. `instance_id` "" means a dynamic member."""

    group: str
    member_id: str
    instance_id: str
    topics: tuple[str, ...]
    topic_pattern: str
    session_timeout_ms: int
    assignor: str
    now_ms: int
    version: int = COMMAND_VERSION

    def __post_init__(self) -> None:
        object.__setattr__(self, "topics", tuple(sorted(set(self.topics))))


@dataclass(frozen=True, slots=True)
class LeaveGroup:
    group: str
    member_id: str
    now_ms: int
    version: int = COMMAND_VERSION


@dataclass(frozen=True, slots=True)
class ExpireMembers:
    """Proposed by the metadata leader for members whose session timed out (it alone keeps
    their last-heard times, in memory). Ids no longer in the group are ignored."""

    group: str
    member_ids: tuple[str, ...]
    now_ms: int
    version: int = COMMAND_VERSION

    def __post_init__(self) -> None:
        object.__setattr__(self, "member_ids", tuple(sorted(set(self.member_ids))))


@dataclass(frozen=True, slots=True)
class AckGeneration:
    """The member has seen `generation` and stopped consuming the partitions revoked up to
    it: they can go to their new members (cooperative rebalance, step 2)."""

    group: str
    member_id: str
    generation: int
    now_ms: int
    version: int = COMMAND_VERSION


@dataclass(frozen=True, slots=True)
class CommitOffsets:
    """`member_id` "" with generation -1 commits for an empty group (tools, standalone
    consumers), as Kafka allows; otherwise the member must hold every partition."""

    group: str
    member_id: str
    generation: int
    offsets: tuple[OffsetItem, ...]
    now_ms: int
    version: int = COMMAND_VERSION


@dataclass(frozen=True, slots=True)
class ResetOffsets:
    """Sets the committed offsets of an empty group (the broker resolves earliest, latest
    and timestamps to offsets before proposing)."""

    group: str
    offsets: tuple[OffsetItem, ...]
    now_ms: int
    version: int = COMMAND_VERSION


@dataclass(frozen=True, slots=True)
class DeleteGroup:
    """Forget a group and its committed offsets; only when it has no members (as Kafka's
    DeleteGroups)."""

    group: str
    now_ms: int
    version: int = COMMAND_VERSION


@dataclass(frozen=True, slots=True)
class ExpireGroups:
    """Forget every group that has had no members and no change (commit, reset, join) for
    `retention_ms` (Kafka's offsets.retention.minutes). Proposed by the metadata leader,
    stamped with its clock; apply decides from `now_ms`, the same on every replica."""

    retention_ms: int
    now_ms: int
    version: int = COMMAND_VERSION


GroupCommand = (
    UpdateTopics
    | JoinGroup
    | LeaveGroup
    | ExpireMembers
    | AckGeneration
    | CommitOffsets
    | ResetOffsets
    | DeleteGroup
    | ExpireGroups
)
COMMAND_TYPES: Final[dict[str, type[GroupCommand]]] = {
    cls.__name__: cls
    for cls in (
        UpdateTopics,
        JoinGroup,
        LeaveGroup,
        ExpireMembers,
        AckGeneration,
        CommitOffsets,
        ResetOffsets,
        DeleteGroup,
        ExpireGroups,
    )
}

# The JSON kind of each field name (a name has one kind in every command).
_FIELD_KINDS: Final = {
    "group": "str",
    "member_id": "str",
    "instance_id": "str",
    "topic_pattern": "str",
    "assignor": "str",
    "topics": "strs",
    "member_ids": "strs",
    "session_timeout_ms": "int",
    "generation": "int",
    "now_ms": "int",
    "retention_ms": "int",
    "offsets": "offsets",
}


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def field_kind(command_type: type[GroupCommand], name: str) -> str:
    if command_type is UpdateTopics and name in ("topics", "gone"):
        return "counts"
    return _FIELD_KINDS[name]


def encode_group_command(command: GroupCommand) -> bytes:
    body: dict[str, Any] = {}
    for f in fields(command):
        if f.name != "version":
            value = getattr(command, f.name)
            kind = field_kind(type(command), f.name)
            body[f.name] = (
                [list(v) for v in value]
                if kind in ("counts", "offsets")
                else (list(value) if kind == "strs" else value)
            )
    doc = {"type": type(command).__name__, "version": command.version, "fields": body}
    return json.dumps(doc, sort_keys=True, separators=(",", ":")).encode()


def decode_group_command(doc: dict[str, Any]) -> GroupCommand:
    """The command in an already parsed envelope; raises GroupCommandDecodeError."""
    type_name = doc.get("type")
    cls = COMMAND_TYPES.get(type_name) if isinstance(type_name, str) else None
    if cls is None:
        raise GroupCommandDecodeError(f"unknown group command type {doc.get('type')!r}")
    version = doc.get("version")
    if not _is_int(version) or version not in COMMAND_VERSIONS_SUPPORTED:
        raise GroupCommandDecodeError(f"{cls.__name__} version {version!r} is not supported")
    body = doc.get("fields")
    expected = {f.name for f in fields(cls)} - {"version"}
    if not isinstance(body, dict) or set(body) != expected:
        raise GroupCommandDecodeError(f"{cls.__name__} fields must be exactly {sorted(expected)}")
    kwargs = {name: _decode_field(cls, name, value) for name, value in body.items()}
    return cls(version=version, **kwargs)


def _decode_field(cls: type[GroupCommand], name: str, value: Any) -> Any:
    kind = field_kind(cls, name)
    if kind == "str" and isinstance(value, str):
        return value
    if kind == "int" and _is_int(value):
        return value
    if kind == "strs" and isinstance(value, list) and all(isinstance(v, str) for v in value):
        return tuple(value)
    if (
        kind == "counts"
        and isinstance(value, list)
        and all(
            isinstance(v, list) and len(v) == 2 and isinstance(v[0], str) and _is_int(v[1])
            for v in value
        )
    ):
        return tuple((v[0], v[1]) for v in value)
    if (
        kind == "offsets"
        and isinstance(value, list)
        and all(
            isinstance(v, list)
            and len(v) == 3
            and isinstance(v[0], str)
            and _is_int(v[1])
            and _is_int(v[2])
            for v in value
        )
    ):
        return tuple((v[0], v[1], v[2]) for v in value)
    raise GroupCommandDecodeError(f"{cls.__name__}.{name} must be of kind {kind}, not {value!r}")
