"""Share groups (queues): the pure state machine, as Kafka's KIP-932 share groups.

Any number of members consume the same partitions at once; each record is acknowledged
on its own. For every (topic, partition) a group has read, a **share-partition** keeps:

- `start_offset`: every offset below it is finished (accepted or archived, or holds no
  record: a compaction gap);
- `end_offset`: the first offset never acquired; fresh records are acquired from here;
- `records`: the in-flight records in [start_offset, end_offset), by offset, each
  AVAILABLE (to be offered again, from `available_ms`), ACQUIRED (locked to `member_id`
  until `locked_until_ms`), ACCEPTED, DEAD_LETTERING (to be copied to the dead-letter
  topic with the group's producer at sequence `dlq_sequence`) or ARCHIVED. An offset in
  the window with no entry was a gap in the log.

Transitions (all at the command's `now_ms`; nothing reads a clock):

1. Before any command touches a share-partition, its expired locks are settled: an
   ACQUIRED record with `locked_until_ms <= now_ms` becomes AVAILABLE, or DEAD_LETTERING
   (reason `max_delivery_attempts`) when it was delivered `max_delivery_attempts` times.
2. `AcquireRecords` takes AVAILABLE records (lowest offset first), then fresh offsets at or
   past `end_offset` from those the broker read from the log, while the window holds at
   most `max_in_flight_records` records; each taken record gets `delivery_count + 1` and a
   lock of `lock_duration_ms`. Records below the log start (retention) are archived. An
   AVAILABLE record at or over `max_delivery_attempts` (the limit was lowered) becomes
   DEAD_LETTERING instead.
3. `AckRecords`: every acknowledged record must be ACQUIRED by the member with its lock
   unexpired, or the whole request is refused (`lock_not_held`) and nothing changes.
   accept -> ACCEPTED; release -> AVAILABLE after `delay_ms` (or DEAD_LETTERING when out of
   attempts); reject -> DEAD_LETTERING (reason `rejected`).
4. `MarkDeadLettered` archives DEAD_LETTERING records once the broker has written them.
5. `start_offset` then moves past every finished record; their entries are dropped.

Invariants (tests/groups/test_share_properties.py): a record is acquired by at most one
member at a time (one entry per offset, one holder per entry); an accepted record is never
acquired again; delivery counts never go down; every offset below `start_offset` is
finished; the window never holds more than `max_in_flight_records` records; a refused
command changes nothing; the same commands give the same state and snapshot JSON.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, replace
from typing import Any, Final

from groups.share_commands import (
    ACK_ACCEPT,
    ACK_REJECT,
    ACK_RELEASE,
    ACK_TYPES,
    AckRecords,
    AcquireRecords,
    DeleteShareGroup,
    ExpireShareLocks,
    JoinShareGroup,
    LeaveShareGroup,
    MarkDeadLettered,
    PutShareGroup,
    SetDeadLetterProducer,
    ShareCommand,
)

AVAILABLE: Final = "available"
ACQUIRED: Final = "acquired"
ACCEPTED: Final = "accepted"
DEAD_LETTERING: Final = "dead_lettering"
ARCHIVED: Final = "archived"
FINISHED: Final = frozenset({ACCEPTED, ARCHIVED})

REASON_REJECTED: Final = "rejected"
REASON_MAX_DELIVERY: Final = "max_delivery_attempts"
REASON_RETENTION: Final = "retention"

REJECT_INVALID_ARGUMENT: Final = "invalid_argument"
REJECT_UNKNOWN_MEMBER: Final = "unknown_member"
REJECT_UNKNOWN_GROUP: Final = "group_not_found"
REJECT_LOCK_NOT_HELD: Final = "lock_not_held"
REJECT_GROUP_NOT_EMPTY: Final = "group_not_empty"
REJECT_TOO_MANY_GROUPS: Final = "too_many_groups"
REJECT_TOO_MANY_MEMBERS: Final = "too_many_members"
REJECT_PRODUCER_CHANGED: Final = "dead_letter_producer_changed"

OFFSET_MAX: Final = 2**63 - 1
DLQ_SUFFIX: Final = ".dlq"  # the default dead-letter topic is "<group>.dlq"
_NAME: Final = re.compile(r"[a-zA-Z0-9._-]+")


@dataclass(frozen=True, slots=True)
class ShareLimits:
    """Bounds applied inside the replicated machine (every replica the same: they change
    with the code, not per broker). Each bounds the metadata snapshot or one command."""

    groups_max: int = 1_000
    members_per_group_max: int = 1_000
    name_chars_max: int = 249
    topics_per_member_max: int = 100
    lock_duration_ms_min: int = 1_000
    lock_duration_ms_max: int = 3_600_000
    max_delivery_attempts_max: int = 100
    max_in_flight_records_max: int = 10_000
    session_timeout_ms_min: int = 1_000
    session_timeout_ms_max: int = 3_600_000
    records_per_command_max: int = 10_000  # acquired or acknowledged by one command
    delay_ms_max: int = 3_600_000  # release with backoff


@dataclass(frozen=True, slots=True)
class ShareConfig:
    lock_duration_ms: int = 30_000  # as Kafka's group.share.record.lock.duration.ms
    max_delivery_attempts: int = 5  # as Kafka's group.share.delivery.attempt.limit
    dead_letter_topic: str = ""  # "" = "<group>.dlq"
    max_in_flight_records: int = 2_000  # as Kafka's group.share.partition.max.record.locks
    session_timeout_ms: int = 45_000  # as Kafka's group.share.session.timeout.ms
    configured_by: str = ""  # whose rights the dead-letter topic is written with


@dataclass(frozen=True, slots=True)
class InFlight:
    state: str
    delivery_count: int  # times acquired; never goes down
    member_id: str = ""  # ACQUIRED: the holder
    locked_until_ms: int = 0  # ACQUIRED: the lock runs out at this time
    available_ms: int = 0  # AVAILABLE: not offered before this time (release with delay)
    reason: str = ""  # DEAD_LETTERING / ARCHIVED: why
    dlq_sequence: int = -1  # DEAD_LETTERING / dead-lettered: the dead-letter producer's sequence


@dataclass(frozen=True, slots=True)
class SharePartition:
    start_offset: int
    end_offset: int
    records: dict[int, InFlight] = field(default_factory=dict)  # sorted by offset; read-only
    accepted: int = 0  # counters since the share-partition began
    archived: int = 0
    dead_lettered: int = 0


@dataclass(frozen=True, slots=True)
class ShareMember:
    member_id: str
    topics: tuple[str, ...]
    joined_ms: int


@dataclass(frozen=True, slots=True)
class ShareGroup:
    name: str
    config: ShareConfig = field(default_factory=ShareConfig)
    members: dict[str, ShareMember] = field(default_factory=dict)  # read-only once built
    partitions: dict[tuple[str, int], SharePartition] = field(default_factory=dict)
    dlq_producer: tuple[int, int] | None = None  # (producer_id, producer_epoch)
    dlq_next_sequence: int = 0  # the next dead letter's sequence; only grows
    changed_ms: int = 0

    @property
    def dead_letter_topic(self) -> str:
        return self.config.dead_letter_topic or self.name + DLQ_SUFFIX


@dataclass(frozen=True, slots=True)
class ShareGroupsState:
    groups: dict[str, ShareGroup] = field(default_factory=dict)  # read-only once built
    limits: ShareLimits = field(default_factory=ShareLimits)


@dataclass(frozen=True, slots=True)
class Acquired:
    """A record handed to a member by `AcquireRecords`."""

    topic: str
    partition: int
    offset: int
    delivery_count: int
    locked_until_ms: int


@dataclass(frozen=True, slots=True)
class Rejected:
    code: str
    message: str
    field: str | None = None


Result = tuple[ShareGroupsState, tuple[Acquired, ...] | Rejected]


# --- apply ------------------------------------------------------------------------------


def apply(state: ShareGroupsState, command: ShareCommand) -> Result:
    """The state after `command` and what it acquired (or why it was refused). Total:
    a refusal returns `state` itself."""
    handler = _HANDLERS.get(type(command))
    if handler is None:
        return state, Rejected(REJECT_INVALID_ARGUMENT, f"unknown command {type(command)}")
    result: Result = handler(state, command)
    return result


def _refuse(state: ShareGroupsState, code: str, message: str, name: str | None = None) -> Result:
    return state, Rejected(code, message, name)


def _check_name(value: str, name: str, limit: int) -> str | None:
    if not 1 <= len(value) <= limit or not _NAME.fullmatch(value):
        return f"{name} must be 1-{limit} characters of [a-zA-Z0-9._-]"
    return None


def _check_topic(value: str, name: str, limit: int) -> str | None:
    """As dmq/topics.py's check_topic_name (groups/ may not import dmq/)."""
    if _check_name(value, name, limit) or value in (".", ".."):
        return f"{name} must be 1-{limit} characters of [a-zA-Z0-9._-] and not '.' or '..'"
    return None


def _check_default_dlq(group: str, limit: int) -> str | None:
    """A group without a dead_letter_topic writes to "<group>.dlq": it must be a topic name."""
    if len(group) + len(DLQ_SUFFIX) > limit:
        return (
            f"group is {len(group)} characters: its default dead-letter topic "
            f"'<group>{DLQ_SUFFIX}' would exceed the {limit}-character topic name limit; "
            f"use a group name of at most {limit - len(DLQ_SUFFIX)} characters or set "
            "dead_letter_topic"
        )
    return None


def _in(value: int, low: int, high: int) -> bool:
    return low <= value <= high


def _put(state: ShareGroupsState, cmd: PutShareGroup) -> Result:
    lim = state.limits
    checks = (
        (_in(cmd.lock_duration_ms, lim.lock_duration_ms_min, lim.lock_duration_ms_max),
         "lock_duration_ms", lim.lock_duration_ms_min, lim.lock_duration_ms_max),
        (_in(cmd.max_delivery_attempts, 1, lim.max_delivery_attempts_max),
         "max_delivery_attempts", 1, lim.max_delivery_attempts_max),
        (_in(cmd.max_in_flight_records, 1, lim.max_in_flight_records_max),
         "max_in_flight_records", 1, lim.max_in_flight_records_max),
        (_in(cmd.session_timeout_ms, lim.session_timeout_ms_min, lim.session_timeout_ms_max),
         "session_timeout_ms", lim.session_timeout_ms_min, lim.session_timeout_ms_max),
    )  # fmt: skip
    bad = _check_name(cmd.group, "group", lim.name_chars_max)
    if bad:
        return _refuse(state, REJECT_INVALID_ARGUMENT, bad, "group")
    for ok, name, low, high in checks:
        if not ok:
            return _refuse(
                state, REJECT_INVALID_ARGUMENT, f"{name} must be in [{low}, {high}]", name
            )
    if cmd.session_timeout_ms < cmd.lock_duration_ms:  # an expiry would cut locks short
        return _refuse(
            state, REJECT_INVALID_ARGUMENT,
            f"session_timeout_ms ({cmd.session_timeout_ms}) must be at least lock_duration_ms "
            f"({cmd.lock_duration_ms}): a member's session must outlive its locks",
            "session_timeout_ms",
        )  # fmt: skip
    if cmd.dead_letter_topic:
        bad = _check_topic(cmd.dead_letter_topic, "dead_letter_topic", lim.name_chars_max)
        if bad:
            return _refuse(state, REJECT_INVALID_ARGUMENT, bad, "dead_letter_topic")
    else:
        bad = _check_default_dlq(cmd.group, lim.name_chars_max)
        if bad:
            return _refuse(state, REJECT_INVALID_ARGUMENT, bad, "group")
    config = ShareConfig(
        cmd.lock_duration_ms, cmd.max_delivery_attempts, cmd.dead_letter_topic,
        cmd.max_in_flight_records, cmd.session_timeout_ms, cmd.configured_by,
    )  # fmt: skip
    group = state.groups.get(cmd.group)
    if group is None:
        if len(state.groups) >= lim.groups_max:
            return _refuse(state, REJECT_TOO_MANY_GROUPS, f"at most {lim.groups_max} share groups")
        group = ShareGroup(cmd.group)
    return _with(state, replace(group, config=config, changed_ms=cmd.now_ms)), ()


def _join(state: ShareGroupsState, cmd: JoinShareGroup) -> Result:
    lim = state.limits
    for value, name in ((cmd.group, "group"), (cmd.member_id, "member_id")):
        bad = _check_name(value, name, lim.name_chars_max)
        if bad:
            return _refuse(state, REJECT_INVALID_ARGUMENT, bad, name)
    if not 1 <= len(cmd.topics) <= lim.topics_per_member_max:
        return _refuse(
            state, REJECT_INVALID_ARGUMENT,
            f"topics must name 1 to {lim.topics_per_member_max} topics", "topics",
        )  # fmt: skip
    for t in cmd.topics:
        bad = _check_name(t, "topics", lim.name_chars_max)
        if bad:
            return _refuse(state, REJECT_INVALID_ARGUMENT, bad, "topics")
    group = state.groups.get(cmd.group)
    if group is None:
        if len(state.groups) >= lim.groups_max:
            return _refuse(state, REJECT_TOO_MANY_GROUPS, f"at most {lim.groups_max} share groups")
        bad = _check_default_dlq(cmd.group, lim.name_chars_max)
        if bad:
            return _refuse(state, REJECT_INVALID_ARGUMENT, bad, "group")
        group = ShareGroup(cmd.group, ShareConfig(configured_by=cmd.configured_by))
    if cmd.member_id not in group.members and len(group.members) >= lim.members_per_group_max:
        return _refuse(
            state, REJECT_TOO_MANY_MEMBERS,
            f"share group {cmd.group!r} has {lim.members_per_group_max} members (the most)",
        )  # fmt: skip
    member = ShareMember(cmd.member_id, cmd.topics, cmd.now_ms)
    members = {**group.members, cmd.member_id: member}
    return _with(state, replace(group, members=members, changed_ms=cmd.now_ms)), ()


def _leave(state: ShareGroupsState, cmd: LeaveShareGroup) -> Result:
    group = state.groups.get(cmd.group)
    if group is None:
        return _refuse(state, REJECT_UNKNOWN_GROUP, f"share group {cmd.group!r} does not exist")
    gone = set(cmd.member_ids) & set(group.members)
    if not gone:
        return state, ()
    members = {m: v for m, v in group.members.items() if m not in gone}
    group = replace(group, members=members, changed_ms=cmd.now_ms)
    for tp in sorted(group.partitions):
        sp = _settle(group, group.partitions[tp], cmd.now_ms)
        records = dict(sp.records)
        for offset, r in sp.records.items():
            if r.state == ACQUIRED and r.member_id in gone:  # as a release without delay
                records[offset] = _acked(group, r, ACK_RELEASE, cmd.now_ms)
        group = _with_partition(group, tp, _advance(replace(sp, records=records)))
    return _with(state, group), ()


def _member(state: ShareGroupsState, name: str, member_id: str) -> ShareGroup | Rejected:
    group = state.groups.get(name)
    if group is None or member_id not in group.members:
        return Rejected(
            REJECT_UNKNOWN_MEMBER,
            f"{member_id!r} is not a member of share group {name!r} (it left, expired or "
            "never joined): join again",
            "member_id",
        )
    return group


def _acquire(state: ShareGroupsState, cmd: AcquireRecords) -> Result:
    group = _member(state, cmd.group, cmd.member_id)
    if isinstance(group, Rejected):
        return state, group
    lim = state.limits
    if not 1 <= cmd.max_records <= lim.records_per_command_max:
        return _refuse(
            state, REJECT_INVALID_ARGUMENT,
            f"max_records must be in [1, {lim.records_per_command_max}]", "max_records",
        )  # fmt: skip
    topics = set(group.members[cmd.member_id].topics)
    fresh_total = sum(len(item[3]) for item in cmd.partitions)
    if fresh_total > lim.records_per_command_max:  # bounds the command (and the Raft log)
        return _refuse(
            state, REJECT_INVALID_ARGUMENT,
            f"{fresh_total} fresh offsets: at most {lim.records_per_command_max} per command",
            "partitions",
        )  # fmt: skip
    seen: set[tuple[str, int]] = set()
    for topic, partition, log_start, fresh, read_end in cmd.partitions:
        if topic not in topics or (topic, partition) in seen or partition < 0:
            return _refuse(
                state, REJECT_INVALID_ARGUMENT,
                f"{topic}-{partition} is not a partition of the member's topics, or twice",
                "partitions",
            )  # fmt: skip
        seen.add((topic, partition))
        if not (0 <= log_start <= OFFSET_MAX and 0 <= read_end <= OFFSET_MAX):
            return _refuse(state, REJECT_INVALID_ARGUMENT, "offsets out of range", "partitions")
        if list(fresh) != sorted(set(fresh)) or any(not 0 <= o < read_end for o in fresh):
            return _refuse(
                state, REJECT_INVALID_ARGUMENT,
                "fresh offsets must be ascending, distinct and below read_end_offset",
                "partitions",
            )  # fmt: skip
    taken: list[Acquired] = []
    budget = cmd.max_records
    for topic, partition, log_start, fresh, read_end in cmd.partitions:
        sp = group.partitions.get((topic, partition)) or SharePartition(log_start, log_start)
        sp = _archive_below(_settle(group, sp, cmd.now_ms), log_start)
        sp, got = _take(group, sp, topic, partition, cmd, fresh, read_end, budget)
        budget -= len(got)
        taken.extend(got)
        group = _with_partition(group, (topic, partition), sp)
    return _with(state, group), tuple(taken)


def _take(
    group: ShareGroup, sp: SharePartition, topic: str, partition: int, cmd: AcquireRecords,
    fresh: tuple[int, ...], read_end: int, budget: int,
) -> tuple[SharePartition, list[Acquired]]:  # fmt: skip
    """Redeliveries first (lowest offset first), then fresh offsets, within the window.
    An available record already delivered max_delivery_attempts times (the limit was
    lowered since) goes to the dead-letter topic instead."""
    records = dict(sp.records)
    lock_until = cmd.now_ms + group.config.lock_duration_ms
    attempts = group.config.max_delivery_attempts
    got: list[Acquired] = []

    def lock(offset: int, count: int) -> None:
        records[offset] = InFlight(ACQUIRED, count, cmd.member_id, lock_until)
        got.append(Acquired(topic, partition, offset, count, lock_until))

    for offset, r in sp.records.items():
        if r.state == AVAILABLE and r.delivery_count >= attempts:
            records[offset] = InFlight(DEAD_LETTERING, r.delivery_count, reason=REASON_MAX_DELIVERY)
            continue
        if len(got) >= budget:
            continue
        if r.state == AVAILABLE and r.available_ms <= cmd.now_ms:
            lock(offset, r.delivery_count + 1)
    end = sp.end_offset
    room = group.config.max_in_flight_records - len(records)
    for offset in fresh:
        if offset < end:
            continue  # acquired meanwhile by another poll that read the same records
        if len(got) >= budget or room <= 0:
            break
        lock(offset, 1)
        room -= 1
        end = offset + 1
    else:
        if len(got) < budget and room > 0:
            end = max(end, read_end)  # every fresh record was taken: skip the gap after
    new = replace(sp, records=dict(sorted(records.items())), end_offset=end)
    return _advance(new), got


def _ack(state: ShareGroupsState, cmd: AckRecords) -> Result:
    group = _member(state, cmd.group, cmd.member_id)
    if isinstance(group, Rejected):
        return state, group
    lim = state.limits
    if not 1 <= len(cmd.acks) <= lim.records_per_command_max:
        return _refuse(
            state, REJECT_INVALID_ARGUMENT,
            f"acks must hold 1 to {lim.records_per_command_max} records", "acks",
        )  # fmt: skip
    if len({(t, p, o) for t, p, o, _, _ in cmd.acks}) != len(cmd.acks):
        return _refuse(state, REJECT_INVALID_ARGUMENT, "a record is acknowledged twice", "acks")
    for _, _, _, kind, delay_ms in cmd.acks:
        if kind not in ACK_TYPES:
            return _refuse(
                state, REJECT_INVALID_ARGUMENT, f"type must be one of {ACK_TYPES}", "type"
            )
        if not 0 <= delay_ms <= lim.delay_ms_max:
            return _refuse(
                state, REJECT_INVALID_ARGUMENT, f"delay_ms must be in [0, {lim.delay_ms_max}]",
                "delay_ms",
            )  # fmt: skip
    by_tp: dict[tuple[str, int], list[tuple[int, str, int]]] = {}
    for t, p, o, kind, delay_ms in cmd.acks:
        by_tp.setdefault((t, p), []).append((o, kind, delay_ms))
    for tp in sorted(by_tp):
        sp = group.partitions.get(tp)
        if sp is None:
            return _not_held(state, tp, by_tp[tp][0][0])
        sp = _settle(group, sp, cmd.now_ms)
        records = dict(sp.records)
        for offset, kind, delay_ms in by_tp[tp]:
            r = records.get(offset)
            if r is None or r.state != ACQUIRED or r.member_id != cmd.member_id:
                return _not_held(state, tp, offset)
            records[offset] = _acked(group, r, kind, cmd.now_ms + delay_ms)
        sp = _count(replace(sp, records=records), sp.records)
        group = _with_partition(group, tp, _advance(sp))
    return _with(state, group), ()


def _not_held(state: ShareGroupsState, tp: tuple[str, int], offset: int) -> Result:
    return _refuse(
        state, REJECT_LOCK_NOT_HELD,
        f"{tp[0]}-{tp[1]} offset {offset} is not locked to this member (its lock expired, "
        "another member holds it, or it was never delivered to it): nothing was acknowledged",
        "acks",
    )  # fmt: skip


def _acked(group: ShareGroup, r: InFlight, kind: str, available_ms: int) -> InFlight:
    if kind == ACK_ACCEPT:
        return InFlight(ACCEPTED, r.delivery_count)
    if kind == ACK_REJECT:
        return InFlight(DEAD_LETTERING, r.delivery_count, reason=REASON_REJECTED)
    assert kind == ACK_RELEASE
    if r.delivery_count >= group.config.max_delivery_attempts:
        return InFlight(DEAD_LETTERING, r.delivery_count, reason=REASON_MAX_DELIVERY)
    return InFlight(AVAILABLE, r.delivery_count, available_ms=available_ms)


def _count(sp: SharePartition, old: dict[int, InFlight]) -> SharePartition:
    """`sp` with its counters moved by the records that became accepted or archived since
    `old` (its records before the change)."""

    def became(state: str) -> int:
        return sum(
            1 for o, r in sp.records.items()
            if r.state == state and (o not in old or old[o].state != state)
        )  # fmt: skip

    accepted, archived = became(ACCEPTED), became(ARCHIVED)
    return replace(sp, accepted=sp.accepted + accepted, archived=sp.archived + archived)


def _sequence_dead_letters(
    group: ShareGroup, sp: SharePartition
) -> tuple[SharePartition, ShareGroup]:
    """Give each new dead letter the group producer's next sequence, in offset order."""
    records = dict(sp.records)
    seq = group.dlq_next_sequence
    for offset, r in sp.records.items():
        if r.state == DEAD_LETTERING and r.dlq_sequence < 0:
            records[offset] = replace(r, dlq_sequence=seq)
            seq += 1
    return replace(sp, records=records), replace(group, dlq_next_sequence=seq)


def _settle(group: ShareGroup, sp: SharePartition, now_ms: int) -> SharePartition:
    """Step 1: locks that ran out by `now_ms`. Dead-letter sequences are given by the
    callers that store the group (`_with_partition` does it)."""
    if not any(r.state == ACQUIRED and r.locked_until_ms <= now_ms for r in sp.records.values()):
        return sp
    records = dict(sp.records)
    attempts = group.config.max_delivery_attempts
    for offset, r in sp.records.items():
        if r.state == ACQUIRED and r.locked_until_ms <= now_ms:
            if r.delivery_count >= attempts:
                records[offset] = InFlight(
                    DEAD_LETTERING, r.delivery_count, reason=REASON_MAX_DELIVERY
                )
            else:
                records[offset] = InFlight(AVAILABLE, r.delivery_count, available_ms=now_ms)
    return replace(sp, records=records)


def _archive_below(sp: SharePartition, log_start: int) -> SharePartition:
    """Records retention removed from the log can be neither delivered nor dead-lettered."""
    if log_start <= sp.start_offset:
        return sp
    records = {
        o: (r if o >= log_start or r.state in FINISHED else InFlight(ARCHIVED, r.delivery_count,
                                                                     reason=REASON_RETENTION))
        for o, r in sp.records.items()
    }  # fmt: skip
    new = _count(replace(sp, records=records, end_offset=max(sp.end_offset, log_start)), sp.records)
    return _advance(new, floor=log_start)


def _advance(sp: SharePartition, floor: int = 0) -> SharePartition:
    """Step 5: the start moves past finished records (and gaps); their entries go."""
    start = sp.end_offset
    for offset, r in sp.records.items():
        if r.state not in FINISHED:
            start = offset
            break
    start = max(sp.start_offset, min(start, sp.end_offset), min(floor, sp.end_offset))
    records = {o: r for o, r in sp.records.items() if o >= start}
    return replace(sp, start_offset=start, records=records)


def _expire_locks(state: ShareGroupsState, cmd: ExpireShareLocks) -> Result:
    for name in sorted(state.groups):
        group = state.groups[name]
        for tp in sorted(group.partitions):
            sp = _settle(group, group.partitions[tp], cmd.now_ms)
            if sp is not group.partitions[tp]:
                group = _with_partition(group, tp, _advance(sp))
        if group is not state.groups[name]:
            state = _with(state, group)
    return state, ()


def _set_producer(state: ShareGroupsState, cmd: SetDeadLetterProducer) -> Result:
    group = state.groups.get(cmd.group)
    if group is None:
        return _refuse(state, REJECT_UNKNOWN_GROUP, f"share group {cmd.group!r} does not exist")
    if cmd.producer_id < 0 or cmd.producer_epoch < 0:
        return _refuse(state, REJECT_INVALID_ARGUMENT, "producer id and epoch must be >= 0")
    current = -1 if group.dlq_producer is None else group.dlq_producer[0]
    if group.dlq_producer is not None and cmd.replaces_producer_id != current:
        return _refuse(
            state, REJECT_PRODUCER_CHANGED,
            f"share group {cmd.group!r} writes dead letters with producer {current}, not "
            f"{cmd.replaces_producer_id}: read the state again",
        )  # fmt: skip
    return _with(state, replace(group, dlq_producer=(cmd.producer_id, cmd.producer_epoch))), ()


def _mark_dead_lettered(state: ShareGroupsState, cmd: MarkDeadLettered) -> Result:
    group = state.groups.get(cmd.group)
    if group is None:
        return _refuse(state, REJECT_UNKNOWN_GROUP, f"share group {cmd.group!r} does not exist")
    by_tp: dict[tuple[str, int], set[int]] = {}
    for t, p, o in cmd.records:
        by_tp.setdefault((t, p), set()).add(o)
    for tp in sorted(by_tp):
        sp = group.partitions.get(tp)
        if sp is None:
            continue  # the topic was deleted meanwhile
        records = dict(sp.records)
        done = 0
        for offset in sorted(by_tp[tp]):
            r = records.get(offset)
            if r is not None and r.state == DEAD_LETTERING:  # a repeated mark does nothing
                records[offset] = replace(r, state=ARCHIVED)
                done += 1
        sp = replace(sp, records=records, archived=sp.archived + done,
                     dead_lettered=sp.dead_lettered + done)  # fmt: skip
        group = _with_partition(group, tp, _advance(sp))
    return _with(state, group), ()


def _delete(state: ShareGroupsState, cmd: DeleteShareGroup) -> Result:
    group = state.groups.get(cmd.group)
    if group is None:
        return _refuse(state, REJECT_UNKNOWN_GROUP, f"share group {cmd.group!r} does not exist")
    if group.members:
        return _refuse(
            state, REJECT_GROUP_NOT_EMPTY,
            f"share group {cmd.group!r} has {len(group.members)} "
            f"member{'' if len(group.members) == 1 else 's'}", "group",
        )  # fmt: skip
    if dead_letters(group):  # they would never reach the dead-letter topic
        return _refuse(
            state, REJECT_GROUP_NOT_EMPTY,
            f"share group {cmd.group!r} has dead letters still to write: try again soon",
            "group",
        )  # fmt: skip
    return replace(state, groups={n: g for n, g in state.groups.items() if n != cmd.group}), ()


def _with_partition(group: ShareGroup, tp: tuple[str, int], sp: SharePartition) -> ShareGroup:
    sp, group = _sequence_dead_letters(group, sp)
    partitions = dict(sorted({**group.partitions, tp: sp}.items()))
    return replace(group, partitions=partitions)


def _with(state: ShareGroupsState, group: ShareGroup) -> ShareGroupsState:
    return replace(state, groups=dict(sorted({**state.groups, group.name: group}.items())))


def follow_topics(state: ShareGroupsState, topics: dict[str, int]) -> ShareGroupsState:
    """Drop share-partitions of deleted topics (or beyond a topic's partitions): a topic
    created again under the name starts over. `topics`: name -> partition count."""
    changed = False
    groups = dict(state.groups)
    for name, group in state.groups.items():
        keep = {tp: sp for tp, sp in group.partitions.items() if tp[1] < topics.get(tp[0], 0)}
        if len(keep) != len(group.partitions):
            groups[name] = replace(group, partitions=keep)
            changed = True
    return replace(state, groups=groups) if changed else state


_HANDLERS: Final[dict[type[Any], Any]] = {
    PutShareGroup: _put,
    JoinShareGroup: _join,
    LeaveShareGroup: _leave,
    AcquireRecords: _acquire,
    AckRecords: _ack,
    ExpireShareLocks: _expire_locks,
    SetDeadLetterProducer: _set_producer,
    MarkDeadLettered: _mark_dead_lettered,
    DeleteShareGroup: _delete,
}


# --- views (for the broker; not part of apply) -----------------------------------------------


def expired_locks(state: ShareGroupsState, now_ms: int) -> bool:
    """Whether some lock has run out by `now_ms` (the leader then proposes ExpireShareLocks)."""
    return any(
        r.state == ACQUIRED and r.locked_until_ms <= now_ms
        for g in state.groups.values()
        for sp in g.partitions.values()
        for r in sp.records.values()
    )


def dead_letters(group: ShareGroup) -> list[tuple[int, str, int, int, InFlight]]:
    """The group's records waiting for the dead-letter topic, by sequence:
    (dlq_sequence, topic, partition, offset, record)."""
    found = [
        (r.dlq_sequence, tp[0], tp[1], o, r)
        for tp, sp in group.partitions.items()
        for o, r in sp.records.items()
        if r.state == DEAD_LETTERING
    ]
    return sorted(found, key=lambda x: x[0])


def offerable(sp: SharePartition, now_ms: int) -> bool:
    """Whether an AcquireRecords at `now_ms` would find a redelivery here."""
    return any(
        (r.state == AVAILABLE and r.available_ms <= now_ms)
        or (r.state == ACQUIRED and r.locked_until_ms <= now_ms)
        for r in sp.records.values()
    )


# --- JSON (the metadata snapshot) -------------------------------------------------------------


def share_groups_to_json(state: ShareGroupsState) -> dict[str, Any]:
    return {name: _group_to_json(g) for name, g in sorted(state.groups.items())}


def _group_to_json(g: ShareGroup) -> dict[str, Any]:
    c = g.config
    return {
        # configured_by only when set: a snapshot without one reads as before
        "config": [c.lock_duration_ms, c.max_delivery_attempts, c.dead_letter_topic,
                   c.max_in_flight_records, c.session_timeout_ms,
                   *([c.configured_by] if c.configured_by else [])],
        "members": [[m.member_id, list(m.topics), m.joined_ms] for m in g.members.values()],
        "partitions": [
            [t, p, sp.start_offset, sp.end_offset, sp.accepted, sp.archived, sp.dead_lettered,
             [[o, r.state, r.delivery_count, r.member_id, r.locked_until_ms, r.available_ms,
               r.reason, r.dlq_sequence] for o, r in sp.records.items()]]
            for (t, p), sp in g.partitions.items()
        ],
        "dlq_producer": None if g.dlq_producer is None else list(g.dlq_producer),
        "dlq_next_sequence": g.dlq_next_sequence,
        "changed_ms": g.changed_ms,
    }  # fmt: skip


def share_groups_from_json(doc: dict[str, Any], limits: ShareLimits) -> ShareGroupsState:
    groups = {}
    for name, g in sorted(doc.items()):
        members = {m: ShareMember(m, tuple(topics), joined) for m, topics, joined in g["members"]}
        partitions = {
            (t, p): SharePartition(
                start, end,
                {o: InFlight(*rest) for o, *rest in records},
                accepted, archived, dead,
            )
            for t, p, start, end, accepted, archived, dead, records in g["partitions"]
        }  # fmt: skip
        producer = g["dlq_producer"]
        groups[name] = ShareGroup(
            name, ShareConfig(*g["config"]), members, partitions,
            None if producer is None else (producer[0], producer[1]),
            g["dlq_next_sequence"], g["changed_ms"],
        )  # fmt: skip
    return ShareGroupsState(groups, limits)
