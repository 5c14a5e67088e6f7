"""The metadata state machine of a cluster: brokers, topics, their config and placement.

Pure and deterministic (shared/STYLE.md, rule 4): `apply(state, command)` reads no clock,
randomness, environment or network. Time comes in the command (`now_ms`, stamped by the
leader that proposes it); the state keeps `clock_ms`, the largest `now_ms` applied so far, so
a new leader whose clock lags cannot move time backwards. A user error never raises: apply
returns `Rejected(code, message, field)` and the state it was given, so every replica reaches
the same state whatever the command. `MetadataMachine` wraps it as a raft `StateMachine`.

Invariants (checked by tests/raft/test_raft_metadata.py):

- the same commands in the same order give equal states and byte-equal snapshots;
- a rejected command leaves the state exactly as it was (`clock_ms` included);
- `metadata_version` never decreases and grows by one on every change a client of the
  catalogue can see (topics, placement, leader hints, broker addresses). Heartbeats move
  `last_heartbeat_ms` and `clock_ms` only: they do not invalidate clients' metadata caches;
- topic ids are never reused (`next_topic_id` only grows), so a re-created topic is
  distinguishable from a deleted one of the same name;
- each partition's replicas are distinct registered brokers, the first is the preferred
  leader, chosen by dmq/metadata/placement.py among the live brokers at creation time; a gone
  partition (decommissioned, then emptied by retention) has none, and keeps its number.

The metadata group's own voter set is in the catalogue too (`voters`, `voters_target`;
dmq/metadata/voters.py has its rules, checked by tests/raft/test_raft_voters.py).

Consumer groups (groups/state.py) live in the same state (`MetadataState.groups`) and their
commands in the same log: a group command moves `clock_ms` and the groups only, never
`metadata_version`, and `state_to_json` (the catalogue observers follow) leaves groups out;
the snapshot (`MetadataMachine.snapshot`) keeps them. After every topic create, delete or
growth, apply feeds the new partition counts to the groups (`UpdateTopics`) in the same step.

What this module does not check: the meaning of topic config values. raft/ may not import
dmq/, so the Broker validates them (`dmq.topics.validate_topic_config`) before proposing;
here config is only checked to be a flat object of ints and strings.

Readers on other threads may read `MetadataMachine.state` at any time: it is an immutable
value replaced by one reference assignment. The dicts inside a state are never mutated after
the state is built (apply copies what it changes), so treat them as read-only.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace
from typing import Any, Final

from dmq.metadata import reassignment
from dmq.metadata import voters as voter_set
from dmq.metadata.placement import PlacementError, assign_replicas
from groups import state as groups_state
from groups.commands import (
    COMMAND_TYPES as GROUP_COMMAND_TYPES,
)
from groups.commands import (
    GroupCommand,
    GroupCommandDecodeError,
    UpdateTopics,
    decode_group_command,
    encode_group_command,
)
from groups.state import GroupsState, groups_from_json, groups_to_json

# Versions of the command encoding this code can decode. A replica that meets a newer one
# rejects the command; a rolling upgrade must therefore enable a new version only once every
# replica decodes it, or replicas would diverge.
COMMAND_VERSION: Final = 1
COMMAND_VERSIONS_SUPPORTED: Final = frozenset({1})
SNAPSHOT_FORMAT: Final = "dmq-metadata"
SNAPSHOT_VERSION: Final = 1

# Mirrors dmq/limits.py (raft/ may not import dmq/): Kafka's topic name rule.
TOPIC_NAME_CHARS_MAX: Final = 249
_TOPIC_NAME = re.compile(r"[a-zA-Z0-9._-]+")  # fullmatch: "$" would let a trailing \n through

ConfigValue = int | str
ConfigItems = tuple[tuple[str, ConfigValue], ...]  # sorted by key, keys distinct


class CommandDecodeError(ValueError):
    """The bytes are not a command this code understands (bad JSON, type, field or version)."""


# --- Commands -------------------------------------------------------------------------------


def config_items(config: Mapping[str, Any]) -> ConfigItems:
    """A config mapping as the sorted pairs commands and topics hold. Values are not checked
    here: apply rejects anything but ints and strings."""
    return _sorted_config(config)


def _sorted_config(items: Any) -> ConfigItems:
    pairs = items.items() if isinstance(items, Mapping) else items
    return tuple(sorted(((k, v) for k, v in pairs), key=lambda kv: str(kv[0])))


@dataclass(frozen=True, slots=True)
class RegisterBroker:
    """A broker announces itself (or new addresses); also counts as a heartbeat."""

    broker_id: str
    http_addr: str
    raft_addr: str
    now_ms: int
    version: int = COMMAND_VERSION


@dataclass(frozen=True, slots=True)
class BrokerHeartbeat:
    broker_id: str
    now_ms: int
    version: int = COMMAND_VERSION


@dataclass(frozen=True, slots=True)
class CreateTopic:
    """`config` is sorted (key, value) pairs: build it with `config_items(mapping)`."""

    name: str
    partitions: int
    replication_factor: int
    config: ConfigItems
    now_ms: int
    version: int = COMMAND_VERSION

    def __post_init__(self) -> None:
        object.__setattr__(self, "config", _sorted_config(self.config))


@dataclass(frozen=True, slots=True)
class DeleteTopic:
    name: str
    now_ms: int
    version: int = COMMAND_VERSION


@dataclass(frozen=True, slots=True)
class AlterTopicConfig:
    """Sets `updates` and removes `removals` (back to the broker's defaults)."""

    name: str
    updates: ConfigItems
    removals: tuple[str, ...]
    now_ms: int
    version: int = COMMAND_VERSION

    def __post_init__(self) -> None:
        object.__setattr__(self, "updates", _sorted_config(self.updates))
        object.__setattr__(self, "removals", tuple(sorted(self.removals)))


@dataclass(frozen=True, slots=True)
class AddPartitions:
    """Grows topic `name` to `partitions` partitions in total (never shrinks, as Kafka)."""

    name: str
    partitions: int
    now_ms: int
    version: int = COMMAND_VERSION


@dataclass(frozen=True, slots=True)
class ReportLeader:
    """A hint: `leader` leads partition `partition` of topic `topic_id` in Raft term `term`.

    Accepted only for a newer term (or the same leader again), so late or reordered hints
    cannot overwrite a newer one; `topic_id` keeps a hint for a deleted topic off a re-created
    one of the same name.
    """

    topic: str
    topic_id: int
    partition: int
    leader: str
    term: int
    now_ms: int
    version: int = COMMAND_VERSION


@dataclass(frozen=True, slots=True)
class InitProducer:
    """Allocate a producer id for an idempotent producer. With a `transactional_id` ("" for
    none) the same id comes back with its epoch + 1, which fences the previous instance."""

    transactional_id: str
    now_ms: int
    version: int = COMMAND_VERSION


@dataclass(frozen=True, slots=True)
class ExpireTransactionalIds:
    """Forget the transactional ids not used (InitProducer) for `retention_ms` at `now_ms`
    (Kafka's transactional.id.expiration.ms). Proposed by the metadata leader with its
    clock; a forgotten id starts again at a new producer id, epoch 0."""

    retention_ms: int
    now_ms: int
    version: int = COMMAND_VERSION


@dataclass(frozen=True, slots=True)
class ReassignPartition:
    """Start (or replace) moving a partition to `replicas` (leader first); an operation
    that dmq/broker/operations.py then carries out with AlterPartitionReplicas steps."""

    topic: str
    topic_id: int
    partition: int
    replicas: tuple[str, ...]
    now_ms: int
    version: int = COMMAND_VERSION


@dataclass(frozen=True, slots=True)
class AlterPartitionReplicas:
    """One step of a reassignment, recorded after its Raft membership change committed:
    `replicas` is the current set plus one broker of the target, or minus one broker not
    in it, and a removal only once every target broker is in. Reaching the target's set
    ends the reassignment (replicas take the target's order)."""

    topic: str
    topic_id: int
    partition: int
    replicas: tuple[str, ...]
    now_ms: int
    version: int = COMMAND_VERSION


@dataclass(frozen=True, slots=True)
class DecommissionPartition:
    """The partition takes no new records; it stays readable until retention empties it
    (dmq/metadata/reassignment.py)."""

    topic: str
    topic_id: int
    partition: int
    now_ms: int
    version: int = COMMAND_VERSION


@dataclass(frozen=True, slots=True)
class RemovePartition:
    """A decommissioned partition whose log retention emptied goes: no replicas, status
    gone; its number is never reused."""

    topic: str
    topic_id: int
    partition: int
    now_ms: int
    version: int = COMMAND_VERSION


@dataclass(frozen=True, slots=True)
class DecommissionBroker:
    """The broker takes no new replicas; its replicas are moved away, then it may leave."""

    broker_id: str
    now_ms: int
    version: int = COMMAND_VERSION


@dataclass(frozen=True, slots=True)
class ChangeMetadataVoters:
    """Start changing the metadata group's voters to `voters` (dmq/metadata/voters.py): an
    operation that dmq/broker/operations.py carries out, one Raft membership change at a time."""

    voters: tuple[str, ...]
    now_ms: int
    version: int = COMMAND_VERSION


@dataclass(frozen=True, slots=True)
class AlterMetadataVoters:
    """The metadata group's Raft configuration, recorded by its leader after a change
    committed (and once at the start): the recorded set plus or minus one broker."""

    voters: tuple[str, ...]
    now_ms: int
    version: int = COMMAND_VERSION


@dataclass(frozen=True, slots=True)
class UnregisterBroker:
    """A decommissioned broker that holds no replica leaves the catalogue."""

    broker_id: str
    now_ms: int
    version: int = COMMAND_VERSION


CatalogueCommand = (
    InitProducer
    | ExpireTransactionalIds
    | RegisterBroker
    | BrokerHeartbeat
    | CreateTopic
    | DeleteTopic
    | AlterTopicConfig
    | AddPartitions
    | ReportLeader
    | ReassignPartition
    | AlterPartitionReplicas
    | DecommissionBroker
    | UnregisterBroker
    | DecommissionPartition
    | RemovePartition
    | ChangeMetadataVoters
    | AlterMetadataVoters
)
# Consumer-group commands (groups/commands.py) ride the same group and envelope.
Command = CatalogueCommand | GroupCommand
COMMAND_TYPES: Final[dict[str, type[CatalogueCommand]]] = {
    cls.__name__: cls
    for cls in (
        InitProducer,
        ExpireTransactionalIds,
        RegisterBroker,
        BrokerHeartbeat,
        CreateTopic,
        DeleteTopic,
        AlterTopicConfig,
        AddPartitions,
        ReportLeader,
        ReassignPartition,
        AlterPartitionReplicas,
        DecommissionBroker,
        UnregisterBroker,
        DecommissionPartition,
        RemovePartition,
        ChangeMetadataVoters,
        AlterMetadataVoters,
    )
}

# The JSON kind of every command field, by name (a name has one kind in every command).
_FIELD_KINDS: Final = {
    "broker_id": "str",
    "transactional_id": "str",
    "http_addr": "str",
    "raft_addr": "str",
    "name": "str",
    "topic": "str",
    "leader": "str",
    "now_ms": "int",
    "retention_ms": "int",
    "partitions": "int",
    "replication_factor": "int",
    "topic_id": "int",
    "partition": "int",
    "term": "int",
    "config": "config",
    "updates": "config",
    "removals": "strs",
    "replicas": "strs",
    "voters": "strs",
}


def encode_command(command: Command) -> bytes:
    """`{"type": ..., "version": ..., "fields": {...}}` as compact, key-sorted JSON."""
    if isinstance(command, tuple(GROUP_COMMAND_TYPES.values())):
        return encode_group_command(command)  # type: ignore[arg-type]
    body: dict[str, Any] = {}
    for f in fields(command):
        if f.name == "version":
            continue
        value = getattr(command, f.name)
        kind = _FIELD_KINDS[f.name]
        body[f.name] = dict(value) if kind == "config" else list(value) if kind == "strs" else value
    doc = {"type": type(command).__name__, "version": command.version, "fields": body}
    return json.dumps(doc, sort_keys=True, separators=(",", ":")).encode()


def decode_command(data: bytes) -> Command:
    """The command in `data`; raises CommandDecodeError naming what is wrong."""
    try:
        doc = json.loads(data)
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise CommandDecodeError(f"command is not JSON: {e}") from None
    if not isinstance(doc, dict) or set(doc) != {"type", "version", "fields"}:
        raise CommandDecodeError("command must be an object with type, version and fields")
    if isinstance(doc["type"], str) and doc["type"] in GROUP_COMMAND_TYPES:
        try:
            return decode_group_command(doc)
        except GroupCommandDecodeError as e:
            raise CommandDecodeError(str(e)) from None
    cls = COMMAND_TYPES.get(doc["type"]) if isinstance(doc["type"], str) else None
    if cls is None:
        raise CommandDecodeError(f"unknown command type {doc['type']!r}")
    version = doc["version"]
    if not _is_int(version) or version not in COMMAND_VERSIONS_SUPPORTED:
        raise CommandDecodeError(
            f"{doc['type']} version {version!r} is not supported "
            f"(supported: {sorted(COMMAND_VERSIONS_SUPPORTED)})"
        )
    body = doc["fields"]
    expected = {f.name for f in fields(cls)} - {"version"}
    if not isinstance(body, dict) or set(body) != expected:
        raise CommandDecodeError(f"{doc['type']} fields must be exactly {sorted(expected)}")
    kwargs = {name: _decode_field(doc["type"], name, value) for name, value in body.items()}
    return cls(version=version, **kwargs)


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _decode_field(type_name: str, name: str, value: Any) -> Any:
    kind = _FIELD_KINDS[name]
    ok = (
        (kind == "str" and isinstance(value, str))
        or (kind == "int" and _is_int(value))
        or (kind == "config" and isinstance(value, dict))
        or (kind == "strs" and isinstance(value, list) and all(isinstance(v, str) for v in value))
    )
    if not ok:
        raise CommandDecodeError(f"{type_name}.{name} must be of kind {kind}, not {value!r}")
    if kind == "config":
        return _sorted_config(value)  # values are checked by apply (Rejected, not raised)
    return tuple(value) if kind == "strs" else value


# --- State ----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class MetadataConfig:
    """Limits of the metadata group; part of the state, so every replica uses the same."""

    # A broker without a heartbeat for longer is not live: it gets no new replicas.
    broker_session_ms: int = 10_000
    # Mirror dmq/limits.py: bound the catalogue's size (its snapshot is one JSON document).
    topics_max: int = 10_000
    partitions_per_topic_max: int = 1_000
    # Transactional ids remembered (each maps to a producer id and epoch).
    transactional_ids_max: int = 100_000


@dataclass(frozen=True, slots=True)
class BrokerInfo:
    broker_id: str
    http_addr: str
    raft_addr: str
    registered_ms: int
    last_heartbeat_ms: int
    decommissioning: bool = False  # takes no new replicas; its replicas are moved away


@dataclass(frozen=True, slots=True)
class PartitionInfo:
    replicas: tuple[str, ...]  # distinct; replicas[0] is the preferred leader
    leader: str | None = None  # the last reported leader (a hint), one of `replicas`
    leader_term: int = 0  # the Raft term of that report; 0 = none yet
    # An ongoing reassignment: the replica set wanted (leader first), None when there is
    # none. Invariant: replicas and target differ; replicas only ever gain a target broker
    # or, once they hold every target broker, lose a non-target one.
    target: tuple[str, ...] | None = None
    reassign_started_ms: int = 0
    # PARTITION_ACTIVE, then PARTITION_DECOMMISSIONED (no new records, still readable),
    # then PARTITION_GONE (no replicas; the number stays taken). Never goes back.
    status: str = "active"


PARTITION_ACTIVE: Final = "active"
PARTITION_DECOMMISSIONED: Final = "decommissioned"
PARTITION_GONE: Final = "gone"


@dataclass(frozen=True, slots=True)
class TopicInfo:
    name: str
    topic_id: int
    replication_factor: int
    config: ConfigItems
    partitions: tuple[PartitionInfo, ...]
    created_ms: int


@dataclass(frozen=True, slots=True)
class MetadataState:
    config: MetadataConfig = field(default_factory=MetadataConfig)
    brokers: dict[str, BrokerInfo] = field(default_factory=dict)  # read-only once built
    topics: dict[str, TopicInfo] = field(default_factory=dict)  # read-only once built
    next_topic_id: int = 1  # only grows: ids are never reused
    metadata_version: int = 0  # only grows; +1 per change visible in the catalogue
    clock_ms: int = 0  # the largest now_ms applied; only grows
    # Consumer groups and committed offsets: replicated and snapshotted with the rest, but
    # not part of the catalogue (state_to_json): commits at a high rate must not make every
    # observer download the catalogue again, so they leave metadata_version alone.
    groups: GroupsState = field(default_factory=GroupsState)
    # Idempotent producers, also out of the catalogue: ids are never reused.
    next_producer_id: int = 0
    # -> (producer id, epoch, last InitProducer's now_ms)
    transactional_ids: dict[str, tuple[int, int, int]] = field(default_factory=dict)
    # The metadata group's own voters (dmq/metadata/voters.py): its Raft configuration as last
    # recorded (sorted; () until its leader first records it), and the set a running
    # change is heading for (() = none).
    voters: tuple[str, ...] = ()
    voters_target: tuple[str, ...] = ()

    def eligible_brokers(self, now_ms: int) -> list[str]:
        """Live brokers that may take new replicas (not decommissioning), sorted."""
        live = self.live_brokers(now_ms)
        return [b for b in live if not self.brokers[b].decommissioning]

    def live_brokers(self, now_ms: int) -> list[str]:
        """Sorted ids of the brokers heard from within broker_session_ms of `now_ms`."""
        session_ms = self.config.broker_session_ms
        return sorted(
            b.broker_id for b in self.brokers.values() if now_ms - b.last_heartbeat_ms <= session_ms
        )


# --- Results --------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Applied:
    """The command changed (or confirmed) the state; `topic`/`broker` as it now is."""

    metadata_version: int
    topic: TopicInfo | None = None
    broker: BrokerInfo | None = None
    group_events: tuple[groups_state.Event, ...] = ()
    producer: tuple[int, int] | None = None  # InitProducer: (producer_id, producer_epoch)


@dataclass(frozen=True, slots=True)
class Rejected:
    """A user error: the state is unchanged. `code` is one of the REJECT_* constants."""

    code: str
    message: str
    field: str | None = None


REJECT_INVALID_COMMAND: Final = "invalid_command"
REJECT_INVALID_ARGUMENT: Final = "invalid_argument"
REJECT_INVALID_TOPIC_NAME: Final = "invalid_topic_name"
REJECT_INVALID_PARTITIONS: Final = "invalid_partitions"
REJECT_INVALID_REPLICATION_FACTOR: Final = "invalid_replication_factor"
REJECT_INVALID_CONFIG: Final = "invalid_config"
REJECT_TOPIC_EXISTS: Final = "topic_exists"
REJECT_UNKNOWN_TOPIC: Final = "unknown_topic"
REJECT_UNKNOWN_BROKER: Final = "unknown_broker"
REJECT_UNKNOWN_PARTITION: Final = "unknown_partition"
REJECT_NOT_ENOUGH_BROKERS: Final = "not_enough_brokers"
REJECT_TOO_MANY_TOPICS: Final = "too_many_topics"
REJECT_STALE_LEADER: Final = "stale_leader"
REJECT_INVALID_REPLICAS: Final = "invalid_replicas"
REJECT_BROKER_IN_USE: Final = "broker_in_use"
REJECT_PARTITION_DECOMMISSIONED: Final = "partition_decommissioned"
REJECT_PARTITION_GONE: Final = "partition_gone"
REJECT_LAST_PARTITION: Final = "last_active_partition"
REJECT_VOTERS_CHANGE_RUNNING: Final = "metadata_voters_change_running"
REJECT_VOTERS_UNKNOWN: Final = "metadata_voters_unknown"

Result = Applied | Rejected


# --- apply ----------------------------------------------------------------------------------


def apply(state: MetadataState, command: Command) -> tuple[MetadataState, Result]:
    """The state after `command` and its result. Never raises for a bad command."""
    if isinstance(command, tuple(GROUP_COMMAND_TYPES.values())):
        return _apply_group(state, command)  # type: ignore[arg-type]
    rejected = _check_common(command)  # type: ignore[arg-type]
    if rejected is not None:
        return state, rejected
    new_state, result = _apply_catalogue(state, command)  # type: ignore[arg-type]
    if isinstance(
        command, CreateTopic | DeleteTopic | AddPartitions | RemovePartition
    ) and isinstance(result, Applied):
        # Groups learn topics, partition counts and gone partitions in the same apply, so
        # a subscription follows them at once, on every replica alike.
        counts = tuple((t.name, len(t.partitions)) for t in new_state.topics.values())
        gone = tuple(
            (t.name, p)
            for t in new_state.topics.values()
            for p, placement in enumerate(t.partitions)
            if placement.status == PARTITION_GONE
        )
        update = UpdateTopics(counts, new_state.clock_ms, gone=gone)
        groups, _ = groups_state.apply(new_state.groups, update)
        new_state = replace(new_state, groups=groups)
    return new_state, result


def _apply_group(state: MetadataState, command: GroupCommand) -> tuple[MetadataState, Result]:
    if command.version not in COMMAND_VERSIONS_SUPPORTED or not _is_int(command.now_ms):
        return state, Rejected(
            REJECT_INVALID_COMMAND, f"version {command.version} is not supported"
        )
    if isinstance(command, UpdateTopics):  # derived from the catalogue, never proposed
        return state, Rejected(REJECT_INVALID_COMMAND, "UpdateTopics is internal")
    if command.now_ms < 0:
        return state, Rejected(REJECT_INVALID_ARGUMENT, "now_ms must be >= 0", "now_ms")
    now_ms = max(state.clock_ms, command.now_ms)
    groups, events = groups_state.apply(state.groups, replace(command, now_ms=now_ms))
    for event in events:
        if isinstance(event, groups_state.Rejected):
            return state, Rejected(event.code, event.message, event.field)
    new_state = replace(state, groups=groups, clock_ms=now_ms)
    return new_state, Applied(new_state.metadata_version, group_events=events)


def _apply_catalogue(
    state: MetadataState, command: CatalogueCommand
) -> tuple[MetadataState, Result]:
    now_ms = max(state.clock_ms, command.now_ms)
    match command:
        case RegisterBroker():
            return _register_broker(state, command, now_ms)
        case BrokerHeartbeat():
            return _heartbeat(state, command, now_ms)
        case CreateTopic():
            return _create_topic(state, command, now_ms)
        case DeleteTopic():
            return _delete_topic(state, command, now_ms)
        case AlterTopicConfig():
            return _alter_config(state, command, now_ms)
        case AddPartitions():
            return _add_partitions(state, command, now_ms)
        case ReportLeader():
            return _report_leader(state, command, now_ms)
        case InitProducer():
            return _init_producer(state, command, now_ms)
        case ExpireTransactionalIds():
            return _expire_transactional_ids(state, command, now_ms)
        case ReassignPartition() | AlterPartitionReplicas():
            return reassignment.apply_partition_command(state, command, now_ms)
        case DecommissionBroker() | UnregisterBroker():
            return reassignment.apply_broker_command(state, command, now_ms)
        case DecommissionPartition() | RemovePartition():
            return reassignment.apply_partition_lifecycle(state, command, now_ms)
        case ChangeMetadataVoters() | AlterMetadataVoters():
            return voter_set.apply_voters_command(state, command, now_ms)
    return state, Rejected(REJECT_INVALID_COMMAND, f"unknown command {type(command).__name__}")


def _check_common(command: CatalogueCommand) -> Rejected | None:
    """Checks a hand-built command as decode_command checks a received one."""
    if command.version not in COMMAND_VERSIONS_SUPPORTED:
        return Rejected(REJECT_INVALID_COMMAND, f"version {command.version} is not supported")
    for f in fields(command):
        value = getattr(command, f.name)
        kind = _FIELD_KINDS.get(f.name, "int")
        if (kind == "int" and not _is_int(value)) or (kind == "str" and not isinstance(value, str)):
            return Rejected(REJECT_INVALID_ARGUMENT, f"{f.name} must be {kind}", f.name)
    if command.now_ms < 0:
        return Rejected(REJECT_INVALID_ARGUMENT, "now_ms must be >= 0", "now_ms")
    return None


def bump(state: MetadataState, now_ms: int, **changes: Any) -> MetadataState:
    """`state` with `changes`, the next metadata_version and the command's clock."""
    return replace(state, metadata_version=state.metadata_version + 1, clock_ms=now_ms, **changes)


def with_partition(
    state: MetadataState, topic: TopicInfo, partition: int, new: PartitionInfo, now_ms: int
) -> tuple[MetadataState, Applied]:
    """`state` with one partition of `topic` replaced by `new`: a visible change."""
    partitions = list(topic.partitions)
    partitions[partition] = new
    new_topic = replace(topic, partitions=tuple(partitions))
    new_state = bump(state, now_ms, topics={**state.topics, topic.name: new_topic})
    return new_state, Applied(new_state.metadata_version, topic=new_topic)


def _register_broker(
    state: MetadataState, cmd: RegisterBroker, now_ms: int
) -> tuple[MetadataState, Result]:
    for name in ("broker_id", "http_addr", "raft_addr"):
        if not getattr(cmd, name):
            return state, Rejected(REJECT_INVALID_ARGUMENT, f"{name} must not be empty", name)
    old = state.brokers.get(cmd.broker_id)
    broker = BrokerInfo(
        cmd.broker_id,
        cmd.http_addr,
        cmd.raft_addr,
        registered_ms=old.registered_ms if old is not None else now_ms,
        last_heartbeat_ms=now_ms,
        decommissioning=old is not None and old.decommissioning,  # a restart keeps it
    )
    brokers = {**state.brokers, cmd.broker_id: broker}
    if old is not None and (old.http_addr, old.raft_addr) == (cmd.http_addr, cmd.raft_addr):
        new_state = replace(state, brokers=brokers, clock_ms=now_ms)  # a heartbeat, in effect
    else:
        new_state = bump(state, now_ms, brokers=brokers)
    return new_state, Applied(new_state.metadata_version, broker=broker)


def _heartbeat(
    state: MetadataState, cmd: BrokerHeartbeat, now_ms: int
) -> tuple[MetadataState, Result]:
    old = state.brokers.get(cmd.broker_id)
    if old is None:
        return state, Rejected(
            REJECT_UNKNOWN_BROKER, f"broker {cmd.broker_id!r} is not registered", "broker_id"
        )
    broker = replace(old, last_heartbeat_ms=now_ms)
    new_state = replace(state, brokers={**state.brokers, cmd.broker_id: broker}, clock_ms=now_ms)
    return new_state, Applied(new_state.metadata_version, broker=broker)


def _check_topic_name(name: str) -> Rejected | None:
    if (
        not name
        or len(name) > TOPIC_NAME_CHARS_MAX
        or not _TOPIC_NAME.fullmatch(name)
        or name in (".", "..")
    ):
        return Rejected(
            REJECT_INVALID_TOPIC_NAME,
            f"topic name {name!r} must be 1-{TOPIC_NAME_CHARS_MAX} characters of "
            "[a-zA-Z0-9._-] and not '.' or '..'",
            "name",
        )
    return None


def _check_config(items: ConfigItems, field_name: str) -> Rejected | None:
    keys = [k for k, _ in items]
    if len(set(keys)) != len(keys):
        return Rejected(REJECT_INVALID_CONFIG, "config keys must be distinct", field_name)
    for key, value in items:
        if not isinstance(key, str) or not key:
            return Rejected(REJECT_INVALID_CONFIG, "config keys must be strings", field_name)
        if not (_is_int(value) or isinstance(value, str)):
            return Rejected(
                REJECT_INVALID_CONFIG,
                f"config {key} must be an integer or a string",
                f"{field_name}.{key}",
            )
    return None


def _place(
    state: MetadataState, partitions: int, replication_factor: int, now_ms: int
) -> list[tuple[str, ...]] | Rejected:
    live = state.eligible_brokers(now_ms)
    if replication_factor > len(live):
        return Rejected(
            REJECT_NOT_ENOUGH_BROKERS,
            f"replication_factor {replication_factor} is more than the {len(live)} live broker(s)",
            "replication_factor",
        )
    existing = {
        name: [p.replicas for p in topic.partitions] for name, topic in state.topics.items()
    }
    try:
        return assign_replicas(live, partitions, replication_factor, existing)
    except PlacementError as e:  # unreachable after the checks above; never raise in apply
        return Rejected(REJECT_INVALID_ARGUMENT, str(e))


def _check_partitions(state: MetadataState, partitions: int, minimum: int) -> Rejected | None:
    maximum = state.config.partitions_per_topic_max
    if not minimum <= partitions <= maximum:
        return Rejected(
            REJECT_INVALID_PARTITIONS,
            f"partitions must be in [{minimum}, {maximum}], not {partitions}",
            "partitions",
        )
    return None


def _create_topic(
    state: MetadataState, cmd: CreateTopic, now_ms: int
) -> tuple[MetadataState, Result]:
    rejected = (
        _check_topic_name(cmd.name)
        or _check_partitions(state, cmd.partitions, 1)
        or _check_config(cmd.config, "config")
    )
    if rejected is not None:
        return state, rejected
    if cmd.name in state.topics:
        return state, Rejected(REJECT_TOPIC_EXISTS, f"topic {cmd.name!r} exists", "name")
    if len(state.topics) >= state.config.topics_max:
        return state, Rejected(
            REJECT_TOO_MANY_TOPICS, f"at most {state.config.topics_max} topics", "name"
        )
    if cmd.replication_factor < 1:
        return state, Rejected(
            REJECT_INVALID_REPLICATION_FACTOR,
            f"replication_factor must be >= 1, not {cmd.replication_factor}",
            "replication_factor",
        )
    placed = _place(state, cmd.partitions, cmd.replication_factor, now_ms)
    if isinstance(placed, Rejected):
        return state, placed
    topic = TopicInfo(
        name=cmd.name,
        topic_id=state.next_topic_id,
        replication_factor=cmd.replication_factor,
        config=cmd.config,
        partitions=tuple(PartitionInfo(replicas) for replicas in placed),
        created_ms=now_ms,
    )
    new_state = bump(
        state, now_ms, topics={**state.topics, cmd.name: topic}, next_topic_id=topic.topic_id + 1
    )
    return new_state, Applied(new_state.metadata_version, topic=topic)


def _unknown_topic(name: str) -> Rejected:
    return Rejected(REJECT_UNKNOWN_TOPIC, f"topic {name!r} does not exist", "name")


def _delete_topic(
    state: MetadataState, cmd: DeleteTopic, now_ms: int
) -> tuple[MetadataState, Result]:
    topic = state.topics.get(cmd.name)
    if topic is None:
        return state, _unknown_topic(cmd.name)
    topics = {name: t for name, t in state.topics.items() if name != cmd.name}
    new_state = bump(state, now_ms, topics=topics)
    return new_state, Applied(new_state.metadata_version, topic=topic)


def _alter_config(
    state: MetadataState, cmd: AlterTopicConfig, now_ms: int
) -> tuple[MetadataState, Result]:
    topic = state.topics.get(cmd.name)
    if topic is None:
        return state, _unknown_topic(cmd.name)
    rejected = _check_config(cmd.updates, "updates")
    if rejected is not None:
        return state, rejected
    both = set(cmd.removals) & {k for k, _ in cmd.updates}
    if both:
        return state, Rejected(
            REJECT_INVALID_CONFIG, f"keys both set and removed: {sorted(both)}", "removals"
        )
    config = {k: v for k, v in topic.config if k not in cmd.removals}
    config.update(cmd.updates)
    new_topic = replace(topic, config=_sorted_config(config))
    new_state = bump(state, now_ms, topics={**state.topics, cmd.name: new_topic})
    return new_state, Applied(new_state.metadata_version, topic=new_topic)


def _add_partitions(
    state: MetadataState, cmd: AddPartitions, now_ms: int
) -> tuple[MetadataState, Result]:
    topic = state.topics.get(cmd.name)
    if topic is None:
        return state, _unknown_topic(cmd.name)
    rejected = _check_partitions(state, cmd.partitions, len(topic.partitions) + 1)
    if rejected is not None:
        return state, rejected
    placed = _place(state, cmd.partitions - len(topic.partitions), topic.replication_factor, now_ms)
    if isinstance(placed, Rejected):
        return state, placed
    new_topic = replace(
        topic, partitions=topic.partitions + tuple(PartitionInfo(r) for r in placed)
    )
    new_state = bump(state, now_ms, topics={**state.topics, cmd.name: new_topic})
    return new_state, Applied(new_state.metadata_version, topic=new_topic)


def topic_of(
    state: MetadataState,
    cmd: ReportLeader
    | ReassignPartition
    | AlterPartitionReplicas
    | DecommissionPartition
    | RemovePartition,
) -> TopicInfo | Rejected:
    """The command's topic, or its refusal: the topic must still be the one the command
    names by id (a deleted and recreated topic is another one), with that partition."""
    topic = state.topics.get(cmd.topic)
    if topic is None or topic.topic_id != cmd.topic_id:
        return Rejected(
            REJECT_UNKNOWN_TOPIC, f"topic {cmd.topic!r} id {cmd.topic_id} does not exist", "topic"
        )
    if not 0 <= cmd.partition < len(topic.partitions):
        return Rejected(
            REJECT_UNKNOWN_PARTITION, f"partition {cmd.partition} does not exist", "partition"
        )
    return topic


def _report_leader(
    state: MetadataState, cmd: ReportLeader, now_ms: int
) -> tuple[MetadataState, Result]:
    topic = topic_of(state, cmd)
    if isinstance(topic, Rejected):
        return state, topic
    old = topic.partitions[cmd.partition]
    if cmd.leader not in old.replicas:
        return state, Rejected(
            REJECT_INVALID_ARGUMENT, f"{cmd.leader!r} is not a replica of the partition", "leader"
        )
    if (cmd.term, cmd.leader) == (old.leader_term, old.leader):
        new_state = replace(state, clock_ms=now_ms)  # a repeat: nothing visible changes
        return new_state, Applied(new_state.metadata_version, topic=topic)
    if cmd.term <= old.leader_term:
        return state, Rejected(
            REJECT_STALE_LEADER,
            f"term {cmd.term} is not newer than the reported term {old.leader_term}",
            "term",
        )
    new = replace(old, leader=cmd.leader, leader_term=cmd.term)
    return with_partition(state, topic, cmd.partition, new, now_ms)


PRODUCER_EPOCH_MAX: Final = 32_767  # the batch header's int16


def _init_producer(
    state: MetadataState, cmd: InitProducer, now_ms: int
) -> tuple[MetadataState, Result]:
    tid = cmd.transactional_id
    if len(tid) > TOPIC_NAME_CHARS_MAX:
        return state, Rejected(
            REJECT_INVALID_ARGUMENT,
            f"transactional_id is longer than {TOPIC_NAME_CHARS_MAX}",
            "transactional_id",
        )
    old = state.transactional_ids.get(tid) if tid else None
    if old is not None and old[1] < PRODUCER_EPOCH_MAX:
        producer = (old[0], old[1] + 1)  # the same id, a newer epoch: fences the old one
        next_id = state.next_producer_id
    else:  # a new id (also when the epoch would overflow, as Kafka)
        if (
            tid
            and old is None
            and len(state.transactional_ids) >= state.config.transactional_ids_max
        ):
            return state, Rejected(
                REJECT_INVALID_ARGUMENT,
                f"at most {state.config.transactional_ids_max} transactional ids",
                "transactional_id",
            )
        producer = (state.next_producer_id, 0)
        next_id = state.next_producer_id + 1
    tids = state.transactional_ids
    if tid:
        tids = {**tids, tid: (*producer, now_ms)}
    new_state = replace(state, next_producer_id=next_id, transactional_ids=tids, clock_ms=now_ms)
    return new_state, Applied(new_state.metadata_version, producer=producer)


def idle_transactional_ids(state: MetadataState, retention_ms: int, now_ms: int) -> list[str]:
    """Transactional ids whose last InitProducer is `retention_ms` or more before now_ms."""
    horizon = now_ms - retention_ms
    return sorted(t for t, p in state.transactional_ids.items() if p[2] <= horizon)


def _expire_transactional_ids(
    state: MetadataState, cmd: ExpireTransactionalIds, now_ms: int
) -> tuple[MetadataState, Result]:
    if cmd.retention_ms < 0:
        return state, Rejected(REJECT_INVALID_ARGUMENT, "retention_ms must be >= 0", "retention_ms")
    gone = set(idle_transactional_ids(state, cmd.retention_ms, now_ms))
    tids = {t: p for t, p in state.transactional_ids.items() if t not in gone}
    new_state = replace(state, transactional_ids=tids, clock_ms=now_ms)
    return new_state, Applied(new_state.metadata_version)


# --- Snapshot -------------------------------------------------------------------------------


def state_to_json(state: MetadataState) -> dict[str, Any]:
    return {
        "format": SNAPSHOT_FORMAT,
        "version": SNAPSHOT_VERSION,
        "config": {f.name: getattr(state.config, f.name) for f in fields(state.config)},
        "brokers": {
            b.broker_id: {f.name: getattr(b, f.name) for f in fields(b)}
            for b in state.brokers.values()
        },
        "topics": {t.name: _topic_to_json(t) for t in state.topics.values()},
        "next_topic_id": state.next_topic_id,
        "metadata_version": state.metadata_version,
        "clock_ms": state.clock_ms,
        "voters": list(state.voters),
        "voters_target": list(state.voters_target),
    }


def _topic_to_json(topic: TopicInfo) -> dict[str, Any]:
    return {
        "name": topic.name,
        "topic_id": topic.topic_id,
        "replication_factor": topic.replication_factor,
        "config": dict(topic.config),
        "partitions": [
            {
                "replicas": list(p.replicas),
                "leader": p.leader,
                "leader_term": p.leader_term,
                **(
                    {"target": list(p.target), "reassign_started_ms": p.reassign_started_ms}
                    if p.target is not None
                    else {}
                ),
                **({"status": p.status} if p.status != PARTITION_ACTIVE else {}),
            }
            for p in topic.partitions
        ],
        "created_ms": topic.created_ms,
    }


def state_from_json(doc: dict[str, Any]) -> MetadataState:
    """Inverse of state_to_json; raises ValueError on a snapshot of another format."""
    if doc.get("format") != SNAPSHOT_FORMAT or doc.get("version") != SNAPSHOT_VERSION:
        raise ValueError(
            f"not a {SNAPSHOT_FORMAT} v{SNAPSHOT_VERSION} snapshot: "
            f"{doc.get('format')!r} v{doc.get('version')!r}"
        )
    topics = {
        name: TopicInfo(
            name=t["name"],
            topic_id=t["topic_id"],
            replication_factor=t["replication_factor"],
            config=_sorted_config(t["config"]),
            partitions=tuple(
                PartitionInfo(
                    tuple(p["replicas"]),
                    p["leader"],
                    p["leader_term"],
                    tuple(p["target"]) if p.get("target") is not None else None,
                    p.get("reassign_started_ms", 0),
                    p.get("status", PARTITION_ACTIVE),
                )
                for p in t["partitions"]
            ),
            created_ms=t["created_ms"],
        )
        for name, t in sorted(doc["topics"].items())
    }
    return MetadataState(
        config=MetadataConfig(**doc["config"]),
        brokers={bid: BrokerInfo(**b) for bid, b in sorted(doc["brokers"].items())},
        topics=topics,
        next_topic_id=doc["next_topic_id"],
        metadata_version=doc["metadata_version"],
        clock_ms=doc["clock_ms"],
        # A snapshot from before voter changes has neither: the leader records them.
        voters=tuple(doc.get("voters", ())),
        voters_target=tuple(doc.get("voters_target", ())),
    )


class MetadataMachine:
    """The metadata group's raft StateMachine: bytes in, `Applied | Rejected` out."""

    def __init__(self, config: MetadataConfig | None = None) -> None:
        self.state = MetadataState(config=config or MetadataConfig())

    def apply(self, command: bytes) -> Result:
        try:
            decoded = decode_command(command)
        except CommandDecodeError as e:
            return Rejected(REJECT_INVALID_COMMAND, str(e))
        self.state, result = apply(self.state, decoded)
        return result

    def snapshot(self) -> bytes:
        doc = state_to_json(self.state)
        doc["groups"] = groups_to_json(self.state.groups)
        doc["producers"] = {
            "next_producer_id": self.state.next_producer_id,
            "transactional_ids": {
                t: list(p) for t, p in sorted(self.state.transactional_ids.items())
            },
        }
        return json.dumps(doc, sort_keys=True, separators=(",", ":")).encode()

    def restore(self, snapshot: bytes) -> None:
        doc = json.loads(snapshot)
        state = state_from_json(doc)
        if "groups" in doc:  # a snapshot from before consumer groups has none
            state = replace(state, groups=groups_from_json(doc["groups"], state.groups.config))
        if "producers" in doc:
            producers = doc["producers"]
            state = replace(
                state,
                next_producer_id=producers["next_producer_id"],
                transactional_ids={  # a snapshot from before expiry: used now
                    t: (p[0], p[1], p[2] if len(p) > 2 else state.clock_ms)
                    for t, p in producers["transactional_ids"].items()
                },
            )
        self.state = state
