"""The consumer-group state machine: `apply(state, command) -> (state, events)`.

Pure and deterministic: no clock, no randomness, no I/O; `now_ms` comes in the command and
every iteration is over sorted keys. A refused command returns the state it was given and
one `Rejected` event, so every replica reaches the same state whatever it is sent.

Cooperative (incremental) rebalance, server-side assignment as in Kafka's KIP-848:

1. A change (join, leave, expiry, topic change) recomputes the group's *target*
   assignment with the group's assignor, seeded with the previous target (sticky keeps it).
2. Each member keeps the partitions of its current assignment that stay its own. Those that
   move are *revoking*: the member still holds them (and may commit them) until it
   acknowledges the generation that revoked them (`AckGeneration`, sent by its heartbeat),
   leaves or expires.
3. A partition goes to its new member only when no other member holds it. Members whose
   partitions do not move keep consuming throughout: a join does not stop the whole group.
4. Every change of membership, target or any member's holdings bumps `generation` by one.
   A member's partition carries `since`, the generation it was handed over at.

Invariants (tests/groups/test_groups_properties.py):
- a partition is held (assigned or revoking) by at most one member of a group, always;
- once every member has acknowledged the current generation, every partition of a
  subscribed topic is assigned to a member, and with identical subscriptions the
  members' counts differ by at most one (and `sticky` moves the fewest partitions);
- a commit is accepted only from a member holding the partition at a generation no older
  than `since`: a stale generation cannot commit a partition that moved, even if it came back;
- replaying the same commands gives equal states (and equal JSON).
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass, field, replace
from typing import Any, Final

import re2

from groups.assignors import ASSIGNOR_FUNCTIONS, STICKY, Assignment, TopicPartition
from groups.commands import (
    AckGeneration,
    CommitOffsets,
    DeleteGroup,
    ExpireGroups,
    ExpireMembers,
    GroupCommand,
    JoinGroup,
    LeaveGroup,
    OffsetItem,
    ResetOffsets,
    UpdateTopics,
)

OFFSET_MAX: Final = 2**63 - 1
_NAME = re.compile(r"[a-zA-Z0-9._-]+")  # fullmatch: "$" would let a trailing \n through
# topic_pattern runs inside replicated apply, against every topic on every change: RE2
# matches in time linear in the name (no backtracking), so no pattern can stall the
# metadata replicas (a Python `re` pattern like (a+)+c doubles its time per character).
# RE2 refuses what needs backtracking (backreferences, lookaround) when the member joins.
_PATTERN_OPTIONS = re2.Options()
_PATTERN_OPTIONS.log_errors = False
_PATTERN_OPTIONS.max_mem = 1 << 20  # bytes of compiled program per pattern (1,000 chars)


@dataclass(frozen=True, slots=True)
class GroupsConfig:
    """Limits, part of the replicated state so every replica uses the same (mirrors
    dmq/limits.py, which groups/ may not import). Each bounds the metadata snapshot."""

    groups_max: int = 10_000
    members_per_group_max: int = 1_000
    session_timeout_ms_min: int = 1_000
    session_timeout_ms_max: int = 300_000
    offsets_per_commit_max: int = 10_000
    committed_offsets_per_group_max: int = 100_000
    subscription_topics_max: int = 1_000
    topic_pattern_chars_max: int = 1_000
    name_chars_max: int = 249  # group names, member ids, instance ids


@dataclass(frozen=True, slots=True)
class Held:
    """A partition a member holds: since the generation `since`; revoked at `revoked_at`
    (0 while it is still the member's to keep)."""

    topic: str
    partition: int
    since: int
    revoked_at: int = 0

    @property
    def tp(self) -> TopicPartition:
        return (self.topic, self.partition)


@dataclass(frozen=True, slots=True)
class Member:
    member_id: str
    instance_id: str  # "" for a dynamic member
    topics: tuple[str, ...]
    topic_pattern: str
    session_timeout_ms: int
    joined_ms: int
    held: tuple[Held, ...] = ()  # sorted by (topic, partition)
    assignment_generation: int = 0  # the generation its holdings last changed at

    @property
    def assigned(self) -> tuple[TopicPartition, ...]:
        return tuple(h.tp for h in self.held if h.revoked_at == 0)

    @property
    def revoking(self) -> tuple[TopicPartition, ...]:
        return tuple(h.tp for h in self.held if h.revoked_at != 0)


@dataclass(frozen=True, slots=True)
class Group:
    name: str
    generation: int = 0
    assignor: str = STICKY
    members: dict[str, Member] = field(default_factory=dict)  # read-only once built
    target: dict[TopicPartition, str] = field(default_factory=dict)  # read-only once built
    committed: dict[TopicPartition, int] = field(default_factory=dict)  # read-only once built
    changed_ms: int = 0


@dataclass(frozen=True, slots=True)
class GroupsState:
    config: GroupsConfig = field(default_factory=GroupsConfig)
    topics: dict[str, int] = field(default_factory=dict)  # name -> partitions (catalogue)
    groups: dict[str, Group] = field(default_factory=dict)  # read-only once built
    # Decommissioned and removed partitions (catalogue): never assigned, no offsets.
    gone: frozenset[TopicPartition] = frozenset()


# --- events ---------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class GenerationChanged:
    group: str
    generation: int


@dataclass(frozen=True, slots=True)
class GroupDeleted:
    group: str
    reason: str  # "deleted" | "expired"


@dataclass(frozen=True, slots=True)
class MemberRemoved:
    group: str
    member_id: str
    reason: str  # "left" | "expired" | "replaced"


@dataclass(frozen=True, slots=True)
class OffsetsCommitted:
    group: str
    count: int


@dataclass(frozen=True, slots=True)
class Rejected:
    code: str
    message: str
    field: str | None = None


Event = GenerationChanged | GroupDeleted | MemberRemoved | OffsetsCommitted | Rejected

REJECT_INVALID_ARGUMENT: Final = "invalid_argument"
REJECT_UNKNOWN_MEMBER: Final = "unknown_member"
REJECT_STALE_GENERATION: Final = "stale_generation"
REJECT_GROUP_NOT_EMPTY: Final = "group_not_empty"
REJECT_INCONSISTENT_ASSIGNOR: Final = "inconsistent_assignor"
REJECT_TOO_MANY_GROUPS: Final = "too_many_groups"
REJECT_TOO_MANY_MEMBERS: Final = "too_many_members"
REJECT_UNKNOWN_PARTITION: Final = "unknown_partition"
REJECT_UNKNOWN_GROUP: Final = "group_not_found"

Result = tuple[GroupsState, tuple[Event, ...]]


def _reject(state: GroupsState, code: str, message: str, name: str | None = None) -> Result:
    return state, (Rejected(code, message, name),)


# --- apply ----------------------------------------------------------------------------------


def apply(state: GroupsState, command: GroupCommand) -> Result:
    """The state after `command` and what happened. Never raises for a bad command."""
    match command:
        case UpdateTopics():
            return _update_topics(state, command)
        case JoinGroup():
            return _join(state, command)
        case LeaveGroup():
            return _remove(state, command.group, (command.member_id,), "left", command.now_ms)
        case ExpireMembers():
            return _remove(state, command.group, command.member_ids, "expired", command.now_ms)
        case AckGeneration():
            return _ack(state, command)
        case CommitOffsets():
            return _commit(state, command)
        case ResetOffsets():
            return _reset(state, command)
        case DeleteGroup():
            return _delete_group(state, command)
        case ExpireGroups():
            return _expire_groups(state, command)
    return _reject(state, REJECT_INVALID_ARGUMENT, f"unknown command {type(command).__name__}")


def subscribed_topics(member: Member, topics: dict[str, int]) -> dict[str, int]:
    """The existing topics `member` subscribes to, with their partition counts."""
    if member.topic_pattern:
        pattern = _compile_pattern(member.topic_pattern)
        if pattern is None:  # unreachable for a joined member: refused at join
            return {}
        return {t: n for t, n in sorted(topics.items()) if pattern.fullmatch(t)}
    return {t: topics[t] for t in member.topics if t in topics}


@functools.lru_cache(maxsize=1024)
def _compile_pattern(pattern: str) -> Any:
    """The compiled RE2 pattern, None if RE2 refuses it (same answer on every replica)."""
    try:
        return re2.compile(pattern, options=_PATTERN_OPTIONS)
    except re2.error:
        return None


def _settle(
    group: Group,
    topics: dict[str, int],
    membership_changed: bool,
    now_ms: int,
    gone: frozenset[TopicPartition],
) -> Group:
    """Steps 1-4 of the rebalance; the group unchanged if nothing moved."""
    subs = {m: subscribed_topics(member, topics) for m, member in sorted(group.members.items())}
    assignor = ASSIGNOR_FUNCTIONS[group.assignor]
    target: Assignment = assignor(subs, group.target, gone) if subs else {}
    generation = group.generation + 1
    members = _reconcile(group.members, target, generation)
    if not membership_changed and target == group.target and members == group.members:
        return group
    return replace(group, generation=generation, members=members, target=target, changed_ms=now_ms)


def _reconcile(
    members: dict[str, Member], target: dict[TopicPartition, str], generation: int
) -> dict[str, Member]:
    holders: dict[TopicPartition, str] = {}
    revised: dict[str, list[Held]] = {}
    for mid in sorted(members):
        kept = []
        for h in members[mid].held:
            if h.revoked_at == 0 and target.get(h.tp) != mid:
                h = replace(h, revoked_at=generation)  # step 2: it moves; held until acked
            kept.append(h)
            holders[h.tp] = mid
        revised[mid] = kept
    for tp, mid in sorted(target.items()):
        if holders.get(tp) is None:  # step 3: nobody holds it, hand it over
            revised[mid].append(Held(tp[0], tp[1], generation))
            holders[tp] = mid
    out = {}
    for mid in sorted(members):
        held = tuple(sorted(revised[mid], key=lambda h: h.tp))
        old = members[mid]
        out[mid] = (
            old if held == old.held else replace(old, held=held, assignment_generation=generation)
        )
    return out


def _events_for(old: Group | None, new: Group) -> tuple[Event, ...]:
    if old is None or old.generation != new.generation:
        return (GenerationChanged(new.name, new.generation),)
    return ()


def _with_group(state: GroupsState, group: Group) -> GroupsState:
    groups = dict(state.groups)
    if not group.members and not group.committed:
        groups.pop(group.name, None)  # an empty group without offsets is forgotten
    else:
        groups[group.name] = group
    return replace(state, groups=dict(sorted(groups.items())))


def _update_topics(state: GroupsState, cmd: UpdateTopics) -> Result:
    topics = dict(cmd.topics)
    gone = frozenset(cmd.gone)
    new_state = replace(state, topics=topics, gone=gone)
    events: list[Event] = []
    for group in state.groups.values():
        # Offsets of deleted (or gone) partitions go: a re-created topic starts from its
        # own beginning.
        committed = {
            tp: o
            for tp, o in group.committed.items()
            if tp[1] < topics.get(tp[0], 0) and tp not in gone
        }
        changed = replace(group, committed=committed)
        settled = _settle(changed, topics, False, cmd.now_ms, gone) if group.members else changed
        if settled != group:
            new_state = _with_group(new_state, settled)
            events.extend(_events_for(group, settled))
    return new_state, tuple(events)


def _check_name(value: str, name: str, limit: int, required: bool = True) -> Rejected | None:
    if (value or required) and (not _NAME.fullmatch(value) or len(value) > limit):
        return Rejected(
            REJECT_INVALID_ARGUMENT, f"{name} must be 1-{limit} characters of [a-zA-Z0-9._-]", name
        )
    return None


def _check_join(state: GroupsState, cmd: JoinGroup) -> Rejected | None:
    c = state.config
    bad = (
        _check_name(cmd.group, "group", c.name_chars_max)
        or _check_name(cmd.member_id, "member_id", c.name_chars_max)
        or _check_name(cmd.instance_id, "instance_id", c.name_chars_max, required=False)
    )
    if bad is not None:
        return bad
    if bool(cmd.topics) == bool(cmd.topic_pattern):
        return Rejected(REJECT_INVALID_ARGUMENT, "give either topics or topic_pattern", "topics")
    if len(cmd.topics) > c.subscription_topics_max:
        return Rejected(
            REJECT_INVALID_ARGUMENT, f"at most {c.subscription_topics_max} topics", "topics"
        )
    for topic in cmd.topics:
        if not _NAME.fullmatch(topic) or len(topic) > c.name_chars_max:
            return Rejected(REJECT_INVALID_ARGUMENT, f"invalid topic name {topic!r}", "topics")
    if len(cmd.topic_pattern) > c.topic_pattern_chars_max:
        return Rejected(
            REJECT_INVALID_ARGUMENT,
            f"topic_pattern is longer than {c.topic_pattern_chars_max} characters",
            "topic_pattern",
        )
    if cmd.topic_pattern and _compile_pattern(cmd.topic_pattern) is None:
        return Rejected(
            REJECT_INVALID_ARGUMENT,
            "topic_pattern is not a regular expression RE2 accepts (RE2 syntax: no "
            "backreferences or lookaround, matched in linear time)",
            "topic_pattern",
        )
    if not c.session_timeout_ms_min <= cmd.session_timeout_ms <= c.session_timeout_ms_max:
        return Rejected(
            REJECT_INVALID_ARGUMENT,
            f"session_timeout_ms must be in [{c.session_timeout_ms_min}, "
            f"{c.session_timeout_ms_max}]",
            "session_timeout_ms",
        )
    if cmd.assignor not in ASSIGNOR_FUNCTIONS:
        return Rejected(
            REJECT_INVALID_ARGUMENT,
            f"assignor must be one of {sorted(ASSIGNOR_FUNCTIONS)}",
            "assignor",
        )
    return None


def _join(state: GroupsState, cmd: JoinGroup) -> Result:
    bad = _check_join(state, cmd)
    if bad is not None:
        return state, (bad,)
    old = state.groups.get(cmd.group)
    group = old or Group(cmd.group, assignor=cmd.assignor)
    member = Member(
        cmd.member_id,
        cmd.instance_id,
        cmd.topics,
        cmd.topic_pattern,
        cmd.session_timeout_ms,
        cmd.now_ms,
    )
    existing = group.members.get(cmd.member_id)
    if existing is not None:  # a retried join (the client's own member id): nothing to do
        same = (existing.topics, existing.topic_pattern) == (member.topics, member.topic_pattern)
        if same:
            return state, ()
        return _reject(state, REJECT_INVALID_ARGUMENT, "member_id is taken", "member_id")
    if old is None and len(state.groups) >= state.config.groups_max:
        return _reject(state, REJECT_TOO_MANY_GROUPS, f"at most {state.config.groups_max} groups")
    if not group.members:
        group = replace(group, assignor=cmd.assignor)  # an empty group takes the new assignor
    elif cmd.assignor != group.assignor:
        return _reject(
            state,
            REJECT_INCONSISTENT_ASSIGNOR,
            f"group {cmd.group!r} uses assignor {group.assignor!r}",
            "assignor",
        )
    events: list[Event] = []
    static = next(
        (m for m in group.members.values() if cmd.instance_id and m.instance_id == cmd.instance_id),
        None,
    )
    if static is not None and (static.topics, static.topic_pattern) == (
        cmd.topics,
        cmd.topic_pattern,
    ):
        return _replace_static(state, group, static, member)
    members = dict(group.members)
    if static is not None:  # a static member changed its subscription: an ordinary rejoin
        del members[static.member_id]
        events.append(MemberRemoved(group.name, static.member_id, "replaced"))
    if len(members) >= state.config.members_per_group_max:
        return _reject(
            state,
            REJECT_TOO_MANY_MEMBERS,
            f"at most {state.config.members_per_group_max} members per group",
        )
    members[cmd.member_id] = member
    settled = _settle(replace(group, members=members), state.topics, True, cmd.now_ms, state.gone)
    events.extend(_events_for(old, settled))
    return _with_group(state, settled), tuple(events)


def _replace_static(state: GroupsState, group: Group, old: Member, new: Member) -> Result:
    """A static member's restart takes over its predecessor's partitions without a
    rebalance (Kafka's static membership): no partition moves, every `since` stays, so the
    other members' commits at their generation still pass; the old member id is fenced.
    The generation still goes up by one, as for every membership change."""
    generation = group.generation + 1
    members = {k: v for k, v in group.members.items() if k != old.member_id}
    members[new.member_id] = replace(new, held=old.held, assignment_generation=generation)
    target = {tp: new.member_id if m == old.member_id else m for tp, m in group.target.items()}
    updated = replace(
        group,
        generation=generation,
        members=dict(sorted(members.items())),
        target=target,
        changed_ms=new.joined_ms,
    )
    events = (
        MemberRemoved(group.name, old.member_id, "replaced"),
        GenerationChanged(group.name, generation),
    )
    return _with_group(state, updated), events


def _remove(
    state: GroupsState, name: str, member_ids: tuple[str, ...], reason: str, now_ms: int
) -> Result:
    group = state.groups.get(name)
    gone = [m for m in member_ids if group is not None and m in group.members]
    if group is None or not gone:
        return _reject(
            state, REJECT_UNKNOWN_MEMBER, f"no such member of group {name!r}", "member_id"
        )
    members = {k: v for k, v in group.members.items() if k not in gone}
    settled = _settle(replace(group, members=members), state.topics, True, now_ms, state.gone)
    events: list[Event] = [MemberRemoved(name, m, reason) for m in gone]
    events.extend(_events_for(group, settled))
    return _with_group(state, settled), tuple(events)


def _members(count: int) -> str:
    return f"{count} member" if count == 1 else f"{count} members"


def _delete_group(state: GroupsState, cmd: DeleteGroup) -> Result:
    group = state.groups.get(cmd.group)
    if group is None:
        return _reject(state, REJECT_UNKNOWN_GROUP, f"group {cmd.group!r} does not exist", "group")
    if group.members:
        return _reject(
            state,
            REJECT_GROUP_NOT_EMPTY,
            f"group {cmd.group!r} has {_members(len(group.members))}: only an empty group can "
            "be deleted",
            "group",
        )
    groups = {k: v for k, v in state.groups.items() if k != cmd.group}
    return replace(state, groups=groups), (GroupDeleted(cmd.group, "deleted"),)


def expired_groups(state: GroupsState, retention_ms: int, now_ms: int) -> tuple[str, ...]:
    """Groups without members unchanged for `retention_ms` at `now_ms` (what the metadata
    leader looks for before proposing ExpireGroups, and what apply removes)."""
    return tuple(
        name
        for name, g in sorted(state.groups.items())
        if not g.members and g.changed_ms <= now_ms - retention_ms
    )


def _expire_groups(state: GroupsState, cmd: ExpireGroups) -> Result:
    if cmd.retention_ms < 0:
        return _reject(state, REJECT_INVALID_ARGUMENT, "retention_ms must be >= 0", "retention_ms")
    gone = set(expired_groups(state, cmd.retention_ms, cmd.now_ms))
    if not gone:
        return state, ()
    groups = {k: v for k, v in state.groups.items() if k not in gone}
    return replace(state, groups=groups), tuple(GroupDeleted(g, "expired") for g in sorted(gone))


def _member(state: GroupsState, name: str, member_id: str) -> tuple[Group, Member] | Rejected:
    group = state.groups.get(name)
    member = group.members.get(member_id) if group is not None else None
    if group is None or member is None:
        return _unknown_member(name, member_id)
    return group, member


def _unknown_member(group: str, member_id: str) -> Rejected:
    return Rejected(
        REJECT_UNKNOWN_MEMBER,
        f"{member_id!r} is not a member of group {group!r}: join again",
        "member_id",
    )


def _check_generation(group: Group, generation: int) -> Rejected | None:
    """A member's generation must be one the group has had (never a future one)."""
    if not 0 <= generation <= group.generation:
        return Rejected(
            REJECT_STALE_GENERATION,
            f"generation {generation} is not in [0, {group.generation}]",
            "generation",
        )
    return None


def _ack(state: GroupsState, cmd: AckGeneration) -> Result:
    found = _member(state, cmd.group, cmd.member_id)
    if isinstance(found, Rejected):
        return state, (found,)
    group, member = found
    stale = _check_generation(group, cmd.generation)
    if stale is not None:
        return state, (stale,)
    held = tuple(h for h in member.held if h.revoked_at == 0 or h.revoked_at > cmd.generation)
    if held == member.held:
        return state, ()
    members = {**group.members, member.member_id: replace(member, held=held)}
    settled = _settle(replace(group, members=members), state.topics, False, cmd.now_ms, state.gone)
    return _with_group(state, settled), _events_for(group, settled)


def _check_offsets(state: GroupsState, offsets: tuple[OffsetItem, ...]) -> Rejected | None:
    limit = state.config.offsets_per_commit_max
    if not 1 <= len(offsets) <= limit:
        return Rejected(REJECT_INVALID_ARGUMENT, f"give 1 to {limit} offsets", "offsets")
    seen = set()
    for i, (topic, partition, offset) in enumerate(offsets):
        if not 0 <= partition < state.topics.get(topic, 0) or (topic, partition) in state.gone:
            return Rejected(
                REJECT_UNKNOWN_PARTITION,
                f"offsets[{i}]: topic {topic!r} has no partition {partition}",
                f"offsets[{i}].partition",
            )
        if not 0 <= offset <= OFFSET_MAX:
            return Rejected(
                REJECT_INVALID_ARGUMENT, f"offsets[{i}].offset must be >= 0", f"offsets[{i}].offset"
            )
        if (topic, partition) in seen:
            return Rejected(
                REJECT_INVALID_ARGUMENT, f"offsets[{i}] repeats a partition", f"offsets[{i}]"
            )
        seen.add((topic, partition))
    return None


def _check_holder(group: Group, cmd: CommitOffsets) -> Rejected | None:
    if cmd.member_id == "" and cmd.generation == -1:
        if group.members:
            return Rejected(
                REJECT_GROUP_NOT_EMPTY,
                f"group {group.name!r} has members: commit as one of them",
                "member_id",
            )
        return None
    member = group.members.get(cmd.member_id)
    if member is None:
        return _unknown_member(group.name, cmd.member_id)
    stale = _check_generation(group, cmd.generation)
    if stale is not None:
        return stale
    held = {h.tp: h for h in member.held}
    for i, (topic, partition, _) in enumerate(cmd.offsets):
        h = held.get((topic, partition))
        if h is None or h.since > cmd.generation:
            return Rejected(
                REJECT_STALE_GENERATION,
                f"offsets[{i}]: {topic}/{partition} is not this member's at generation "
                f"{cmd.generation}: rejoin or heartbeat for the current assignment",
                "generation",
            )
    return None


def _commit(state: GroupsState, cmd: CommitOffsets) -> Result:
    bad = _check_offsets(state, cmd.offsets)
    if bad is not None:
        return state, (bad,)
    group = state.groups.get(cmd.group)
    if group is None:
        if cmd.member_id != "":
            return _reject(
                state, REJECT_UNKNOWN_MEMBER, f"group {cmd.group!r} has no members", "member_id"
            )
        bad = _check_name(cmd.group, "group", state.config.name_chars_max)
        if bad is None and len(state.groups) >= state.config.groups_max:
            bad = Rejected(REJECT_TOO_MANY_GROUPS, f"at most {state.config.groups_max} groups")
        group = Group(cmd.group)
    bad = bad or _check_holder(group, cmd)
    if bad is not None:
        return state, (bad,)
    return _store_offsets(state, group, cmd.offsets, cmd.now_ms)


def _store_offsets(
    state: GroupsState, group: Group, offsets: tuple[OffsetItem, ...], now_ms: int
) -> Result:
    committed = dict(group.committed)
    committed.update(((t, p), o) for t, p, o in offsets)
    limit = state.config.committed_offsets_per_group_max
    if len(committed) > limit:
        return _reject(
            state, REJECT_INVALID_ARGUMENT, f"a group keeps at most {limit} offsets", "offsets"
        )
    updated = replace(group, committed=dict(sorted(committed.items())), changed_ms=now_ms)
    return _with_group(state, updated), (OffsetsCommitted(group.name, len(offsets)),)


def store_transactional_offsets(
    state: GroupsState, group_name: str, offsets: list[OffsetItem], now_ms: int
) -> GroupsState:
    """A committed transaction's offsets (dmq/metadata/transactions.py): checked against
    the member's generation when they joined the transaction, stored now whatever the
    group's generation has become, as Kafka does at its commit marker. A group forgotten
    meanwhile is created again with them; the per-group limit was checked when they joined
    the transaction and is not applied again (the decision is already durable)."""
    group = state.groups.get(group_name) or Group(group_name)
    committed = dict(group.committed)
    committed.update(((t, p), o) for t, p, o in offsets if (t, p) not in state.gone)
    updated = replace(group, committed=dict(sorted(committed.items())), changed_ms=now_ms)
    return _with_group(state, updated)


def _reset(state: GroupsState, cmd: ResetOffsets) -> Result:
    bad = _check_offsets(state, cmd.offsets) or _check_name(
        cmd.group, "group", state.config.name_chars_max
    )
    if bad is not None:
        return state, (bad,)
    group = state.groups.get(cmd.group) or Group(cmd.group)
    if group.members:
        return _reject(
            state,
            REJECT_GROUP_NOT_EMPTY,
            f"group {cmd.group!r} has {_members(len(group.members))}: offsets can be reset only "
            "while it is empty",
            "group",
        )
    if cmd.group not in state.groups and len(state.groups) >= state.config.groups_max:
        return _reject(state, REJECT_TOO_MANY_GROUPS, f"at most {state.config.groups_max} groups")
    return _store_offsets(state, group, cmd.offsets, cmd.now_ms)


# --- JSON (the metadata snapshot) --------------------------------------------------------------


def groups_to_json(state: GroupsState) -> dict[str, Any]:
    return {
        "topics": [[t, n] for t, n in sorted(state.topics.items())],
        **({"gone": [[t, p] for t, p in sorted(state.gone)]} if state.gone else {}),
        "groups": [_group_to_json(g) for _, g in sorted(state.groups.items())],
    }


def _group_to_json(g: Group) -> dict[str, Any]:
    return {
        "name": g.name,
        "generation": g.generation,
        "assignor": g.assignor,
        "changed_ms": g.changed_ms,
        "members": [
            {
                "member_id": m.member_id,
                "instance_id": m.instance_id,
                "topics": list(m.topics),
                "topic_pattern": m.topic_pattern,
                "session_timeout_ms": m.session_timeout_ms,
                "joined_ms": m.joined_ms,
                "assignment_generation": m.assignment_generation,
                "held": [[h.topic, h.partition, h.since, h.revoked_at] for h in m.held],
            }
            for _, m in sorted(g.members.items())
        ],
        "target": [[t, p, m] for (t, p), m in sorted(g.target.items())],
        "committed": [[t, p, o] for (t, p), o in sorted(g.committed.items())],
    }


def groups_from_json(doc: dict[str, Any], config: GroupsConfig | None = None) -> GroupsState:
    groups = {}
    for g in doc["groups"]:
        members = {
            m["member_id"]: Member(
                m["member_id"],
                m["instance_id"],
                tuple(m["topics"]),
                m["topic_pattern"],
                m["session_timeout_ms"],
                m["joined_ms"],
                tuple(Held(t, p, s, r) for t, p, s, r in m["held"]),
                m["assignment_generation"],
            )
            for m in g["members"]
        }
        groups[g["name"]] = Group(
            g["name"],
            g["generation"],
            g["assignor"],
            members,
            {(t, p): m for t, p, m in g["target"]},
            {(t, p): o for t, p, o in g["committed"]},
            g["changed_ms"],
        )
    return GroupsState(
        config=config or GroupsConfig(),
        topics={t: n for t, n in doc["topics"]},
        groups=groups,
        gone=frozenset((t, p) for t, p in doc.get("gone", ())),
    )
