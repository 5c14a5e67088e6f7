"""The topics domain of the metadata catalogue: topics, their config, partitions, placement
and leader hints.

Commands: `CreateTopic`, `DeleteTopic`, `AlterTopicConfig`, `AddPartitions` (grows, never
shrinks, as Kafka) and `ReportLeader`. State: `MetadataState.topics` and `next_topic_id`;
the JSON of a partition also carries the reassignment domain's fields (`target`,
`reassign_started_ms`, `status`), written only when they differ from the defaults so that
a catalogue without reassignments reads as it did before they existed.

Rules apply() keeps:

- topic ids are never reused (`next_topic_id` only grows), so a re-created topic is
  distinguishable from a deleted one of the same name; commands that name a partition
  carry the topic id (`state.topic_of`);
- new partitions are placed by dmq/metadata/placement.py on the eligible brokers (live,
  not decommissioning) at the command's time: replicas distinct, counts balanced;
- a leader hint is accepted only for a newer Raft term (or the same leader again), so
  late or reordered hints cannot overwrite a newer one;
- creating, deleting or growing a topic changes the partition set: the domains that
  follow it (consumer groups) update in the same apply (dmq/metadata/shell.py).

What this domain does not check: the meaning of topic config values. The broker validates
them (`dmq.topics.validate_topic_config`) before proposing; here config is only checked to
be a flat object of ints and strings, so that every replica accepts the same commands
whatever version of the broker-side rules it runs.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from typing import Any, Final

from dmq.metadata.codec import FieldCodec
from dmq.metadata.placement import PlacementError, assign_replicas
from dmq.metadata.registry import CommandSpec, Domain
from dmq.metadata.state import (
    COMMAND_VERSION,
    PARTITION_ACTIVE,
    REJECT_INVALID_ARGUMENT,
    REJECT_NOT_ENOUGH_BROKERS,
    REJECT_UNKNOWN_TOPIC,
    TOPIC_NAME_CHARS_MAX,
    Applied,
    ConfigItems,
    MetadataState,
    Outcome,
    PartitionInfo,
    Rejected,
    TopicInfo,
    bump,
    is_int,
    sorted_config,
    topic_of,
    with_partition,
)

_TOPIC_NAME = re.compile(r"[a-zA-Z0-9._-]+")  # fullmatch: "$" would let a trailing \n through

REJECT_INVALID_TOPIC_NAME: Final = "invalid_topic_name"
REJECT_INVALID_PARTITIONS: Final = "invalid_partitions"
REJECT_INVALID_REPLICATION_FACTOR: Final = "invalid_replication_factor"
REJECT_INVALID_CONFIG: Final = "invalid_config"
REJECT_TOPIC_EXISTS: Final = "topic_exists"
REJECT_TOO_MANY_TOPICS: Final = "too_many_topics"
REJECT_STALE_LEADER: Final = "stale_leader"


# --- Commands -------------------------------------------------------------------------------


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
        object.__setattr__(self, "config", sorted_config(self.config))


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
        object.__setattr__(self, "updates", sorted_config(self.updates))
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


TopicCommand = CreateTopic | DeleteTopic | AlterTopicConfig | AddPartitions | ReportLeader

CODEC: Final = FieldCodec(
    {
        "name": "str",
        "topic": "str",
        "leader": "str",
        "partitions": "int",
        "replication_factor": "int",
        "topic_id": "int",
        "partition": "int",
        "term": "int",
        "now_ms": "int",
        "config": "config",
        "updates": "config",
        "removals": "strs",
    }
)


# --- Checks ---------------------------------------------------------------------------------


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
        if not (is_int(value) or isinstance(value, str)):
            return Rejected(
                REJECT_INVALID_CONFIG,
                f"config {key} must be an integer or a string",
                f"{field_name}.{key}",
            )
    return None


def _check_partitions(state: MetadataState, partitions: int, minimum: int) -> Rejected | None:
    maximum = state.config.partitions_per_topic_max
    if not minimum <= partitions <= maximum:
        return Rejected(
            REJECT_INVALID_PARTITIONS,
            f"partitions must be in [{minimum}, {maximum}], not {partitions}",
            "partitions",
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
    # Brokers whose last heartbeat said their disk is below its floor get no new replicas
    # while enough others can take them (a one-broker cluster still places on itself).
    roomy = [b for b in live if state.brokers[b].storage_level != "full"]
    if len(roomy) >= replication_factor:
        live = roomy
    try:
        return assign_replicas(live, partitions, replication_factor, existing)
    except PlacementError as e:  # unreachable after the checks above; never raise in apply
        return Rejected(REJECT_INVALID_ARGUMENT, str(e))


def _unknown_topic(name: str) -> Rejected:
    return Rejected(REJECT_UNKNOWN_TOPIC, f"topic {name!r} does not exist", "name")


# --- Apply ----------------------------------------------------------------------------------


def _create_topic(state: MetadataState, cmd: CreateTopic, now_ms: int) -> Outcome:
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


def _delete_topic(state: MetadataState, cmd: DeleteTopic, now_ms: int) -> Outcome:
    topic = state.topics.get(cmd.name)
    if topic is None:
        return state, _unknown_topic(cmd.name)
    topics = {name: t for name, t in state.topics.items() if name != cmd.name}
    new_state = bump(state, now_ms, topics=topics)
    return new_state, Applied(new_state.metadata_version, topic=topic)


def _alter_config(state: MetadataState, cmd: AlterTopicConfig, now_ms: int) -> Outcome:
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
    new_topic = replace(topic, config=sorted_config(config))
    new_state = bump(state, now_ms, topics={**state.topics, cmd.name: new_topic})
    return new_state, Applied(new_state.metadata_version, topic=new_topic)


def _add_partitions(state: MetadataState, cmd: AddPartitions, now_ms: int) -> Outcome:
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


def _report_leader(state: MetadataState, cmd: ReportLeader, now_ms: int) -> Outcome:
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


# --- JSON -----------------------------------------------------------------------------------


def _to_json(state: MetadataState) -> dict[str, Any]:
    return {
        "topics": {t.name: _topic_to_json(t) for t in state.topics.values()},
        "next_topic_id": state.next_topic_id,
    }


def _topic_to_json(topic: TopicInfo) -> dict[str, Any]:
    return {
        "name": topic.name,
        "topic_id": topic.topic_id,
        "replication_factor": topic.replication_factor,
        "config": dict(topic.config),
        "partitions": [_partition_to_json(p) for p in topic.partitions],
        "created_ms": topic.created_ms,
    }


def _partition_to_json(p: PartitionInfo) -> dict[str, Any]:
    # The reassignment domain's fields only when set: older readers never saw them.
    return {
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


def _from_json(doc: dict[str, Any], state: MetadataState) -> MetadataState:
    topics = {
        name: TopicInfo(
            name=t["name"],
            topic_id=t["topic_id"],
            replication_factor=t["replication_factor"],
            config=sorted_config(t["config"]),
            partitions=tuple(_partition_from_json(p) for p in t["partitions"]),
            created_ms=t["created_ms"],
        )
        for name, t in sorted(doc["topics"].items())
    }
    return replace(state, topics=topics, next_topic_id=doc["next_topic_id"])


def _partition_from_json(p: dict[str, Any]) -> PartitionInfo:
    return PartitionInfo(
        tuple(p["replicas"]),
        p["leader"],
        p["leader_term"],
        tuple(p["target"]) if p.get("target") is not None else None,
        p.get("reassign_started_ms", 0),
        p.get("status", PARTITION_ACTIVE),
    )


DOMAIN: Final = Domain(
    name="topics",
    commands=(
        CommandSpec(CreateTopic, _create_topic, CODEC, changes_partitions=True),
        CommandSpec(DeleteTopic, _delete_topic, CODEC, changes_partitions=True),
        CommandSpec(AlterTopicConfig, _alter_config, CODEC),
        CommandSpec(AddPartitions, _add_partitions, CODEC, changes_partitions=True),
        CommandSpec(ReportLeader, _report_leader, CODEC),
    ),
    json_keys=("topics", "next_topic_id"),
    to_json=_to_json,
    from_json=_from_json,
)
