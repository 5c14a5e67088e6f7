"""Partition assignors: which member of a group consumes which partition.

Pure functions of their arguments (no clock, no randomness, no dict-order dependence:
every input is sorted first), so every replica computes the same assignment.

- `range`: per topic, the subscribed members (sorted by id) get contiguous runs of
  partitions, the first `partitions % members` one more (Kafka's RangeAssignor).
- `roundrobin`: every subscribed (topic, partition), sorted, dealt in turn to the members
  subscribed to its topic (Kafka's RoundRobinAssignor).
- `sticky`: keeps each member's partitions as far as balance allows and moves the fewest
  (Kafka's StickyAssignor): with identical subscriptions the counts differ by at most one
  and the number of partitions that change member is the least any such balance needs.

An assignor returns a map {(topic, partition): member_id} covering every partition that
has at least one subscribed member and is not in `gone` (decommissioned and removed
partitions: their numbers stay taken, so counts alone do not say which exist), and only
those.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Set
from typing import Final

TopicPartition = tuple[str, int]
Assignment = dict[TopicPartition, str]
# member_id -> the subscribed topics that exist, with their partition counts.
Subscriptions = Mapping[str, Mapping[str, int]]
Gone = Set[TopicPartition]
NONE_GONE: Final[frozenset[TopicPartition]] = frozenset()

RANGE: Final = "range"
ROUND_ROBIN: Final = "roundrobin"
STICKY: Final = "sticky"
ASSIGNORS: Final = (RANGE, ROUND_ROBIN, STICKY)


def _eligible(subscriptions: Subscriptions, gone: Gone) -> dict[TopicPartition, list[str]]:
    """Every subscribed partition -> the sorted members subscribed to its topic."""
    out: dict[TopicPartition, list[str]] = {}
    for member in sorted(subscriptions):
        for topic, count in subscriptions[member].items():
            for p in range(count):
                if (topic, p) not in gone:
                    out.setdefault((topic, p), []).append(member)
    return {tp: out[tp] for tp in sorted(out)}


def assign_range(
    subscriptions: Subscriptions, previous: Mapping[TopicPartition, str], gone: Gone = NONE_GONE
) -> Assignment:
    del previous  # range is not sticky
    by_topic: dict[str, tuple[int, list[str]]] = {}
    for member in sorted(subscriptions):
        for topic, count in subscriptions[member].items():
            by_topic.setdefault(topic, (count, []))[1].append(member)
    out: Assignment = {}
    for topic in sorted(by_topic):
        count, members = by_topic[topic]
        existing = [p for p in range(count) if (topic, p) not in gone]
        base, extra = divmod(len(existing), len(members))
        i_next = 0
        for i, member in enumerate(members):
            for _ in range(base + (1 if i < extra else 0)):
                out[(topic, existing[i_next])] = member
                i_next += 1
    return out


def assign_round_robin(
    subscriptions: Subscriptions, previous: Mapping[TopicPartition, str], gone: Gone = NONE_GONE
) -> Assignment:
    del previous
    members = sorted(subscriptions)
    out: Assignment = {}
    turn = 0
    for tp, eligible in _eligible(subscriptions, gone).items():
        # The next member in the global rotation that subscribes to this topic.
        allowed = set(eligible)
        while members[turn % len(members)] not in allowed:
            turn += 1
        out[tp] = members[turn % len(members)]
        turn += 1
    return out


def assign_sticky(
    subscriptions: Subscriptions, previous: Mapping[TopicPartition, str], gone: Gone = NONE_GONE
) -> Assignment:
    eligible = _eligible(subscriptions, gone)
    members = sorted(subscriptions)
    if not members or not eligible:
        return {}
    kept: dict[str, list[TopicPartition]] = {m: [] for m in members}
    for tp in eligible:
        owner = previous.get(tp)
        if owner is not None and owner in eligible[tp]:
            kept[owner].append(tp)
    # Quotas: floor or ceil of the fair share; the ceil goes to the members that already
    # hold the most, which keeps the most partitions where they are.
    base, extra = divmod(len(eligible), len(members))
    order = sorted(members, key=lambda m: (-len(kept[m]), m))
    quota = {m: base + (1 if i < extra else 0) for i, m in enumerate(order)}
    out: Assignment = {}
    counts = dict.fromkeys(members, 0)
    for m in members:
        for tp in kept[m][: quota[m]]:
            out[tp] = m
            counts[m] += 1
    for tp, candidates in eligible.items():
        if tp in out:
            continue
        under = [m for m in candidates if counts[m] < quota[m]]
        # With different subscriptions the quotas may not fit; then the least loaded takes it.
        pool = under or candidates
        member = min(pool, key=lambda m: (counts[m], m))
        out[tp] = member
        counts[member] += 1
    return out


ASSIGNOR_FUNCTIONS: Final[
    dict[str, Callable[[Subscriptions, Mapping[TopicPartition, str], Gone], Assignment]]
] = {RANGE: assign_range, ROUND_ROBIN: assign_round_robin, STICKY: assign_sticky}
