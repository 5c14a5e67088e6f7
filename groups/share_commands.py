"""Commands of the share-group state machine (groups/share.py) and their wire encoding.

Each command is a frozen, slotted dataclass with a `version` and a proposer-stamped
`now_ms`; apply reads no clock. Member ids are drawn by the broker before the join is
proposed, and the records a poll may take come in the command (`AcquireRecords`: the
offsets the broker read from the partition's log), so every replica decides the same.

Encoding: `{"type", "version", "fields"}` as compact, key-sorted JSON, the envelope every
metadata command uses; tuples of tuples travel as lists of lists.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, fields
from typing import Any, Final

COMMAND_VERSION: Final = 1
COMMAND_VERSIONS_SUPPORTED: Final = frozenset({1})

ACK_ACCEPT: Final = "accept"
ACK_RELEASE: Final = "release"
ACK_REJECT: Final = "reject"
ACK_TYPES: Final = (ACK_ACCEPT, ACK_RELEASE, ACK_REJECT)

# (topic, partition, log_start_offset, fresh offsets read at the share-partition's end,
#  read_end_offset: the log offset the read stopped at, past any gap it crossed)
AcquireItem = tuple[str, int, int, tuple[int, ...], int]
# (topic, partition, offset, type, delay_ms)
AckItem = tuple[str, int, int, str, int]
Position = tuple[str, int, int]  # (topic, partition, offset)


class ShareCommandDecodeError(ValueError):
    """The bytes are not a share-group command this code understands."""


@dataclass(frozen=True, slots=True)
class PutShareGroup:
    """Create a share group or change its config (the change applies to later locks)."""

    group: str
    lock_duration_ms: int
    max_delivery_attempts: int
    dead_letter_topic: str  # "" = "<group>.dlq"
    max_in_flight_records: int
    session_timeout_ms: int
    now_ms: int
    # The principal the dead-letter topic is written for ("User:alice"; "" with auth off):
    # its write (and create) is checked again at each write (dmq/broker/share.py).
    configured_by: str = ""
    version: int = COMMAND_VERSION


@dataclass(frozen=True, slots=True)
class JoinShareGroup:
    """A member joins (creating the group with the default config if it does not exist)."""

    group: str
    member_id: str
    topics: tuple[str, ...]
    now_ms: int
    configured_by: str = ""  # PutShareGroup's, for a group this join creates
    version: int = COMMAND_VERSION

    def __post_init__(self) -> None:
        object.__setattr__(self, "topics", tuple(sorted(set(self.topics))))


@dataclass(frozen=True, slots=True)
class LeaveShareGroup:
    """Members leave (or are expired by the metadata leader): their locks are released.
    Ids no longer in the group are ignored."""

    group: str
    member_ids: tuple[str, ...]
    now_ms: int
    version: int = COMMAND_VERSION


@dataclass(frozen=True, slots=True)
class AcquireRecords:
    """One poll: lock up to `max_records` records of the listed share-partitions for
    `member_id`, redeliveries first (lowest offset first), then fresh records."""

    group: str
    member_id: str
    partitions: tuple[AcquireItem, ...]
    max_records: int
    now_ms: int
    version: int = COMMAND_VERSION


@dataclass(frozen=True, slots=True)
class AckRecords:
    """One acknowledgement request: all of it applies, or none (a lock not held)."""

    group: str
    member_id: str
    acks: tuple[AckItem, ...]
    now_ms: int
    version: int = COMMAND_VERSION


@dataclass(frozen=True, slots=True)
class ExpireShareLocks:
    """Proposed by the metadata leader when a lock ran out and nobody polls: expired
    records become available, or go to the dead-letter topic when out of attempts."""

    now_ms: int
    version: int = COMMAND_VERSION


@dataclass(frozen=True, slots=True)
class SetDeadLetterProducer:
    """The idempotent producer (id, epoch) the group's dead letters are written with.

    Compare-and-set: applied when the group has no producer yet, or when
    `replaces_producer_id` names the one it has (a switch after an out-of-order sequence);
    otherwise refused, so two would-be metadata leaders cannot both install their own.
    `replaces_producer_id` -1 (none) is left out of the encoding: the first producer's
    command encodes as before the field existed."""

    group: str
    producer_id: int
    producer_epoch: int
    now_ms: int
    version: int = COMMAND_VERSION
    replaces_producer_id: int = -1


@dataclass(frozen=True, slots=True)
class MarkDeadLettered:
    """These dead-lettering records are in the dead-letter topic: archive them."""

    group: str
    records: tuple[Position, ...]
    now_ms: int
    version: int = COMMAND_VERSION


@dataclass(frozen=True, slots=True)
class DeleteShareGroup:
    """Forget a share group with no members (its positions and counters)."""

    group: str
    now_ms: int
    version: int = COMMAND_VERSION


ShareCommand = (
    PutShareGroup
    | JoinShareGroup
    | LeaveShareGroup
    | AcquireRecords
    | AckRecords
    | ExpireShareLocks
    | SetDeadLetterProducer
    | MarkDeadLettered
    | DeleteShareGroup
)

COMMAND_TYPES: Final[dict[str, type[Any]]] = {
    cls.__name__: cls
    for cls in (
        PutShareGroup,
        JoinShareGroup,
        LeaveShareGroup,
        AcquireRecords,
        AckRecords,
        ExpireShareLocks,
        SetDeadLetterProducer,
        MarkDeadLettered,
        DeleteShareGroup,
    )
}

# Fields added after a command was first shipped: left out of the encoding when they hold
# this default (so older commands encode, and decode, exactly as before).
OPTIONAL_FIELDS: Final[dict[str, int | str]] = {"replaces_producer_id": -1, "configured_by": ""}

STR_FIELDS: Final = frozenset({"group", "member_id", "dead_letter_topic", "configured_by"})
# The JSON shape of each field that is neither a str (STR_FIELDS) nor an int.
_NESTED: Final[dict[str, str]] = {
    "topics": "strs",
    "member_ids": "strs",
    "partitions": "acquire",
    "acks": "acks",
    "records": "positions",
}


def field_kind(cls: type[Any], name: str) -> str:
    """The JSON kind of a command's field: str, int, strs, acquire, acks or positions."""
    if name not in {f.name for f in fields(cls)}:
        raise KeyError(f"{cls.__name__} has no field {name!r}")
    return _NESTED.get(name, "str" if name in STR_FIELDS else "int")


def encode_share_command(command: ShareCommand) -> bytes:
    body = {
        f.name: _plain(getattr(command, f.name))
        for f in fields(command)
        if f.name != "version"
        and not (f.name in OPTIONAL_FIELDS and getattr(command, f.name) == OPTIONAL_FIELDS[f.name])
    }
    doc = {"type": type(command).__name__, "version": command.version, "fields": body}
    return json.dumps(doc, sort_keys=True, separators=(",", ":")).encode()


def _plain(value: Any) -> Any:
    return [_plain(v) for v in value] if isinstance(value, tuple) else value


def decode_share_command(doc: dict[str, Any]) -> ShareCommand:
    """The command in a parsed envelope; raises ShareCommandDecodeError."""
    cls = COMMAND_TYPES.get(doc.get("type"))  # type: ignore[arg-type]
    if cls is None:
        raise ShareCommandDecodeError(f"unknown share command {doc.get('type')!r}")
    version = doc.get("version")
    if version not in COMMAND_VERSIONS_SUPPORTED or isinstance(version, bool):
        raise ShareCommandDecodeError(f"{cls.__name__} version {version!r} is not supported")
    body = doc.get("fields")
    expected = {f.name for f in fields(cls)} - {"version"}
    optional = expected & set(OPTIONAL_FIELDS)
    if not isinstance(body, dict) or not expected - optional <= set(body) <= expected:
        raise ShareCommandDecodeError(f"{cls.__name__} fields must be exactly {sorted(expected)}")
    kwargs = {name: _field(cls.__name__, name, value) for name, value in body.items()}
    command: ShareCommand = cls(version=version, **kwargs)
    return command


def _field(type_name: str, name: str, value: Any) -> Any:
    kind = _NESTED.get(name, "str" if name in STR_FIELDS else "int")  # field_kind's rule
    try:
        if kind == "int":
            return _int(value)
        if kind == "str":
            return _str(value)
        if kind == "strs":
            return tuple(_str(v) for v in value)
        if kind == "acquire":
            return tuple(
                (_str(t), _int(p), _int(s), tuple(_int(o) for o in offs), _int(e))
                for t, p, s, offs, e in value
            )
        if kind == "acks":
            return tuple((_str(t), _int(p), _int(o), _str(k), _int(d)) for t, p, o, k, d in value)
        return tuple((_str(t), _int(p), _int(o)) for t, p, o in value)  # positions
    except (TypeError, ValueError) as e:
        raise ShareCommandDecodeError(f"{type_name}.{name}: {e}") from None


def _int(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{value!r} is not an integer")
    return value


def _str(value: Any) -> str:
    if not isinstance(value, str):
        raise ValueError(f"{value!r} is not a string")
    return value
