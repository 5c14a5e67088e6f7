"""The reassignment domain of the metadata catalogue: moving replicas, decommissioning
partitions and brokers (pure, deterministic).

Commands: `ReassignPartition`, `AlterPartitionReplicas`, `DecommissionPartition`,
`RemovePartition`, `DecommissionBroker`, `UnregisterBroker`. State: no field of its own
but fields inside the topics' and brokers' slices (`PartitionInfo.target`,
`reassign_started_ms`, `status`; `BrokerInfo.decommissioning`), which those domains write
to JSON.

A reassignment is persisted in the catalogue itself: `PartitionInfo.target` is the replica
set wanted, `PartitionInfo.replicas` the set the partition's Raft group has (as last
recorded). dmq/broker/operations.py moves one towards the other, one Raft membership change at a
time, and records each change with `AlterPartitionReplicas` once it committed. The
invariants apply() keeps whatever commands arrive:

- a step adds exactly one broker of the target, or removes exactly one broker that is not
  in it, and removes only once every target broker is in: so a partition never has fewer
  replicas than its target (its replication factor), and each removed replica was
  replaced first;
- reaching the target's set ends the reassignment: `replicas = target`, `target = None`;
- a decommissioning broker takes no new replica (placement, targets); it may be
  unregistered only once it holds no replica, no target names it, and it is neither a
  metadata voter nor in the voters' target (dmq/metadata/voters.py).

Partition decommission (`DecommissionPartition`, `RemovePartition`): active ->
decommissioned (takes no new records, stays readable; refused for a topic's last active
partition) -> gone (no replicas, its number never reused; only once decommissioned and
not being moved). Whether the log is empty is the driver's check, outside apply. Removing
a partition changes the partition set: consumer groups stop assigning it in the same apply.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Final

from dmq.metadata.codec import FieldCodec
from dmq.metadata.registry import CommandSpec, Domain
from dmq.metadata.state import (
    COMMAND_VERSION,
    PARTITION_ACTIVE,
    PARTITION_DECOMMISSIONED,
    PARTITION_GONE,
    REJECT_INVALID_ARGUMENT,
    REJECT_INVALID_REPLICAS,
    REJECT_NOT_ENOUGH_BROKERS,
    REJECT_UNKNOWN_BROKER,
    Applied,
    MetadataState,
    Outcome,
    PartitionInfo,
    Rejected,
    TopicInfo,
    bump,
    topic_of,
    with_partition,
)

REJECT_BROKER_IN_USE: Final = "broker_in_use"
REJECT_PARTITION_DECOMMISSIONED: Final = "partition_decommissioned"
REJECT_PARTITION_GONE: Final = "partition_gone"
REJECT_LAST_PARTITION: Final = "last_active_partition"


# --- Commands -------------------------------------------------------------------------------


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
    """The partition takes no new records; it stays readable until retention empties it."""

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
class UnregisterBroker:
    """A decommissioned broker that holds no replica leaves the catalogue."""

    broker_id: str
    now_ms: int
    version: int = COMMAND_VERSION


ReassignmentCommand = (
    ReassignPartition
    | AlterPartitionReplicas
    | DecommissionPartition
    | RemovePartition
    | DecommissionBroker
    | UnregisterBroker
)

CODEC: Final = FieldCodec(
    {
        "topic": "str",
        "broker_id": "str",
        "topic_id": "int",
        "partition": "int",
        "now_ms": "int",
        "replicas": "strs",
    }
)


# --- Apply ----------------------------------------------------------------------------------


def _reject(code: str, message: str, field: str) -> Rejected:
    return Rejected(code, message, field)


def _check_replicas(state: MetadataState, replicas: tuple[str, ...]) -> Rejected | None:
    if not replicas or len(set(replicas)) != len(replicas) or not all(replicas):
        return _reject(
            REJECT_INVALID_REPLICAS, "replicas must be distinct, non-empty ids", "replicas"
        )
    unknown = sorted(b for b in replicas if b not in state.brokers)
    if unknown:
        return _reject(REJECT_UNKNOWN_BROKER, f"unknown broker(s) {unknown}", "replicas")
    return None


def apply_partition_command(
    state: MetadataState, cmd: ReassignPartition | AlterPartitionReplicas, now_ms: int
) -> Outcome:
    topic = topic_of(state, cmd)
    if isinstance(topic, Rejected):
        return state, topic
    rejected = _check_replicas(state, cmd.replicas)
    if rejected is not None:
        return state, rejected
    old = topic.partitions[cmd.partition]
    if old.status == PARTITION_GONE:
        return state, _gone(cmd.topic, cmd.partition)
    if isinstance(cmd, ReassignPartition):
        outcome = _reassign(state, topic, old, cmd, now_ms)
    else:
        outcome = _step(old, cmd)
    if isinstance(outcome, Rejected):
        return state, outcome
    return with_partition(state, topic, cmd.partition, outcome, now_ms)


def _reassign(
    state: MetadataState,
    topic: TopicInfo,
    old: PartitionInfo,
    cmd: ReassignPartition,
    now_ms: int,
) -> PartitionInfo | Rejected:
    if len(cmd.replicas) != topic.replication_factor:
        return _reject(
            REJECT_INVALID_REPLICAS,
            f"replicas must name {topic.replication_factor} brokers (the replication "
            f"factor), not {len(cmd.replicas)}",
            "replicas",
        )
    leaving = sorted(
        b for b in cmd.replicas if state.brokers[b].decommissioning and b not in old.replicas
    )
    if leaving:
        return _reject(
            REJECT_INVALID_REPLICAS, f"broker(s) {leaving} are decommissioning", "replicas"
        )
    if set(cmd.replicas) == set(old.replicas):  # a new order only: the preferred leader
        return replace(old, replicas=cmd.replicas, target=None, reassign_started_ms=0)
    started = old.reassign_started_ms if old.target == cmd.replicas else now_ms
    return replace(old, target=cmd.replicas, reassign_started_ms=started)


def _step(old: PartitionInfo, cmd: AlterPartitionReplicas) -> PartitionInfo | Rejected:
    target = old.target
    if target is None:
        return _reject(REJECT_INVALID_REPLICAS, "no reassignment in progress", "replicas")
    added = set(cmd.replicas) - set(old.replicas)
    removed = set(old.replicas) - set(cmd.replicas)
    adds_one = len(added) == 1 and not removed and added <= set(target)
    removes_one = (
        len(removed) == 1
        and not added
        and not removed & set(target)
        and set(target) <= set(old.replicas)
    )
    if not (adds_one or removes_one):
        return _reject(
            REJECT_INVALID_REPLICAS,
            f"a step adds one broker of the target {list(target)} or, once all are in, "
            f"removes one that is not: {list(old.replicas)} -> {list(cmd.replicas)}",
            "replicas",
        )
    leader = old.leader if old.leader in cmd.replicas else None
    if set(cmd.replicas) == set(target):
        return replace(old, replicas=target, leader=leader, target=None, reassign_started_ms=0)
    return replace(old, replicas=cmd.replicas, leader=leader)


def _gone(topic: str, partition: int) -> Rejected:
    return _reject(
        REJECT_PARTITION_GONE,
        f"partition {partition} of {topic!r} was decommissioned and is gone",
        "partition",
    )


def apply_partition_lifecycle(
    state: MetadataState, cmd: DecommissionPartition | RemovePartition, now_ms: int
) -> Outcome:
    topic = topic_of(state, cmd)
    if isinstance(topic, Rejected):
        return state, topic
    old = topic.partitions[cmd.partition]
    if old.status == PARTITION_GONE:
        return state, _gone(cmd.topic, cmd.partition)
    if isinstance(cmd, DecommissionPartition):
        if old.status == PARTITION_DECOMMISSIONED:
            return state, Applied(state.metadata_version, topic=topic)  # already so
        active = sum(p.status == PARTITION_ACTIVE for p in topic.partitions)
        if active <= 1:
            return state, _reject(
                REJECT_LAST_PARTITION,
                f"partition {cmd.partition} is the last active partition of {cmd.topic!r}: "
                "add partitions first, or delete the topic",
                "partition",
            )
        new = replace(old, status=PARTITION_DECOMMISSIONED)
    else:
        if old.status != PARTITION_DECOMMISSIONED or old.target is not None:
            return state, _reject(
                REJECT_INVALID_ARGUMENT,
                f"partition {cmd.partition} must be decommissioned and not moving to be removed",
                "partition",
            )
        new = replace(old, status=PARTITION_GONE, replicas=(), leader=None)
    return with_partition(state, topic, cmd.partition, new, now_ms)


def apply_broker_command(
    state: MetadataState, cmd: DecommissionBroker | UnregisterBroker, now_ms: int
) -> Outcome:
    broker = state.brokers.get(cmd.broker_id)
    if broker is None:
        return state, _reject(
            REJECT_UNKNOWN_BROKER, f"broker {cmd.broker_id!r} is not registered", "broker_id"
        )
    if isinstance(cmd, DecommissionBroker):
        if broker.decommissioning:
            return state, Applied(state.metadata_version, broker=broker)  # already so
        rejected = _check_enough_left(state, cmd.broker_id, now_ms)
        if rejected is not None:
            return state, rejected
        new_broker = replace(broker, decommissioning=True)
        brokers = {**state.brokers, cmd.broker_id: new_broker}
    else:
        rejected = unregister_refusal(state, cmd.broker_id)
        if rejected is not None:
            return state, rejected
        new_broker = broker
        brokers = {b: info for b, info in state.brokers.items() if b != cmd.broker_id}
    new_state = bump(state, now_ms, brokers=brokers)
    return new_state, Applied(new_state.metadata_version, broker=new_broker)


def unregister_refusal(state: MetadataState, broker_id: str) -> Rejected | None:
    """Why a registered broker may not be unregistered yet (None: it may): it must be
    decommissioning, hold no replica and be no metadata voter, recorded or wanted. The
    operations driver asks this before proposing `UnregisterBroker`."""
    if not state.brokers[broker_id].decommissioning:
        reason = "must be decommissioned first"
    elif holds_replicas(state, broker_id):
        reason = "still holds replicas"
    elif broker_id in state.voters or broker_id in state.voters_target:
        reason = "is a metadata voter; it must leave the metadata group first"
    else:
        return None
    return _reject(REJECT_BROKER_IN_USE, f"broker {broker_id!r} {reason}", "broker_id")


def _check_enough_left(state: MetadataState, broker_id: str, now_ms: int) -> Rejected | None:
    """Every topic's replication factor must still fit on the brokers that stay."""
    staying = [b for b in state.eligible_brokers(now_ms) if b != broker_id]
    needed = max((t.replication_factor for t in state.topics.values()), default=0)
    if needed > len(staying):
        return _reject(
            REJECT_NOT_ENOUGH_BROKERS,
            f"a topic needs {needed} brokers; {len(staying)} live broker(s) would stay",
            "broker_id",
        )
    return None


def hosts_replica(placement: PartitionInfo, broker_id: str) -> bool:
    """Whether the partition has a replica on `broker_id`, or a reassignment is bringing
    one there (the broker opens it before the leader adds it to the group)."""
    return broker_id in placement.replicas or (
        placement.target is not None and broker_id in placement.target
    )


def holds_replicas(state: MetadataState, broker_id: str) -> bool:
    """Whether any partition has (or is moving to) a replica on `broker_id`."""
    return any(hosts_replica(p, broker_id) for t in state.topics.values() for p in t.partitions)


DOMAIN: Final = Domain(
    name="reassignment",
    commands=(
        CommandSpec(ReassignPartition, apply_partition_command, CODEC),
        CommandSpec(AlterPartitionReplicas, apply_partition_command, CODEC),
        CommandSpec(DecommissionPartition, apply_partition_lifecycle, CODEC),
        CommandSpec(RemovePartition, apply_partition_lifecycle, CODEC, changes_partitions=True),
        CommandSpec(DecommissionBroker, apply_broker_command, CODEC),
        CommandSpec(UnregisterBroker, apply_broker_command, CODEC),
    ),
)
