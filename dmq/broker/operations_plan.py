"""The cluster operations' decisions, as pure functions of the catalogue and the leader's view.

`dmq/broker/operations.py` drives the operations (it talks to brokers and proposes
commands); this module only decides: what a reassignment's next step is
(`describe_step`), the metadata voter driver's next step (`next_voter_step`), which
replicas a decommission moves (`replace_brokers`) and which move balances the cluster
(`balancing_move`). No I/O, no clock: tests/broker/test_broker_operations_planning.py
checks them with hypothesis.
"""

from __future__ import annotations

import collections
from dataclasses import dataclass
from typing import Any, Literal

from dmq.metadata.machine import PARTITION_DECOMMISSIONED, MetadataState, PartitionInfo, TopicInfo

# A replica is in sync when it holds the leader's whole log, or is within this many
# entries of the commit index (under load a follower is always an entry or a few behind)
# and answered the leader within REPLICA_LAG_TIME_MAX_S (Kafka's replica.lag.time.max.ms:
# a replica that stopped answering falls out of sync even if no entry was added since).
REPLICA_LAG_ENTRIES_MAX = 64
REPLICA_LAG_TIME_MAX_S = 1.0


def decommissioned_partitions(state: MetadataState) -> list[tuple[TopicInfo, int]]:
    """(topic, partition) of every partition decommissioned and not yet gone, sorted."""
    return [
        (info, p)
        for info in sorted(state.topics.values(), key=lambda t: t.name)
        for p, placement in enumerate(info.partitions)
        if placement.status == PARTITION_DECOMMISSIONED
    ]


def describe_step(placement: PartitionInfo, progress: dict[str, Any]) -> str:
    """Where a reassignment stands, from the catalogue and the partition leader's view
    (the same reading the driver's next step starts from)."""
    target = placement.target
    if target is None:
        return "done"
    members = set(progress["members"])
    strays = sorted(members - set(placement.replicas) - set(target))
    if strays:
        return f"removing stray member {strays[0]}"
    adding = [b for b in target if b not in placement.replicas]
    if adding:
        pending = "recording" if adding[0] in members else "adding"
        return f"{pending} {adding[0]}"
    lagging = [b for b in target if not caught_up(progress, b)]
    if lagging:
        return f"catching up {','.join(lagging)}"
    leaving = [b for b in placement.replicas if b not in target]
    if leaving and progress["leader"] == leaving[0]:
        return f"moving leadership from {leaving[0]}"
    return f"removing {leaving[0]}" if leaving else "finishing"


@dataclass(frozen=True, slots=True)
class VoterStep:
    """The metadata voter driver's next step: record the configuration, add or remove
    one member, hand the leadership to `broker`, wait, or nothing (done)."""

    action: Literal["record", "add", "remove", "transfer", "wait", "done"]
    broker: str | None
    what: str  # for the operations view


def next_voter_step(
    actual: tuple[str, ...],
    recorded: tuple[str, ...],
    target: tuple[str, ...],
    *,
    me: str,
    live: frozenset[str],
    in_sync: frozenset[str],
) -> VoterStep:
    """Group 0's next step (raft/README.md, "Metadata voter changes"), from its leader
    `me`'s configuration `actual`, the catalogue's `recorded` voters and `target`.
    Deterministic, so a new leader reading the same facts takes the same step.

    Record the configuration whenever it differs from the catalogue's (or reached the
    target: the record ends the change); then add the first target broker missing, once
    every live member is in sync and it is live; then, once every target member is in
    sync, remove a member not in the target, the leader last and only after handing its
    leadership to the first target member."""
    if set(actual) != set(recorded) or (target and set(actual) == set(target)):
        return VoterStep("record", None, f"recorded voters {list(actual)}")
    if not target:
        return VoterStep("done", None, "done")
    adding = [b for b in target if b not in actual]
    if adding:
        lagging = [m for m in actual if m in live and m not in in_sync]
        if lagging:
            return VoterStep("wait", None, f"catching up {','.join(lagging)} before {adding[0]}")
        if adding[0] not in live:
            return VoterStep("wait", None, f"waiting for {adding[0]} (not live)")
        return VoterStep("add", adding[0], f"added {adding[0]}")
    lagging = [m for m in target if m not in in_sync]
    if lagging:
        return VoterStep("wait", None, f"catching up {','.join(lagging)}")
    leaving = sorted((b for b in actual if b not in target), key=lambda b: (b == me, b))
    if leaving[0] == me:
        return VoterStep("transfer", target[0], f"moving leadership from {me} to {target[0]}")
    return VoterStep("remove", leaving[0], f"removed {leaving[0]}")


def describe_voters_step(voters: tuple[str, ...], target: tuple[str, ...]) -> str:
    """Where a voter change stands, from the catalogue alone (brokers that do not lead)."""
    adding = [b for b in target if b not in voters]
    if adding:
        return f"adding {adding[0]}"
    leaving = [b for b in voters if b not in target]
    return f"removing {leaving[0]}" if leaving else "recording"


def caught_up(progress: dict[str, Any], member: str) -> bool:
    if member == progress["leader"]:
        return True
    if member not in progress["members"]:
        return False
    match = int(progress["match_index"].get(member, 0))
    if match >= int(progress["last_index"]):
        return True
    # pysyncobj dates a member's last response at its addition, and every follower's at
    # an election, with its match index reset to 0: until it acknowledged an entry, the
    # age is no evidence that it answers (a member added a moment ago would count as
    # in sync in a short log; raft/README.md, "Metadata voter changes").
    if match <= 0:
        return False
    age_s = float(progress.get("response_age_s", {}).get(member, float("inf")))
    recent = age_s <= REPLICA_LAG_TIME_MAX_S
    return recent and match >= int(progress["commit_index"]) - REPLICA_LAG_ENTRIES_MAX


def progress_fraction(progress: dict[str, Any], target: list[str] | None) -> float:
    """How far the slowest target member's log is, 0..1 (the bar of `dmq cluster status`)."""
    if not target:
        return 1.0
    commit = max(1, int(progress["commit_index"]))
    worst = min(
        commit if b == progress["leader"] else int(progress["match_index"].get(b, 0))
        for b in target
    )
    return round(min(1.0, worst / commit), 4)


def replica_counts(state: MetadataState) -> collections.Counter[str]:
    """Replicas per broker, counting targets of running reassignments as placed."""
    counts: collections.Counter[str] = collections.Counter({b: 0 for b in state.brokers})
    for info in state.topics.values():
        for placement in info.partitions:
            for b in placement.target if placement.target is not None else placement.replicas:
                counts[b] += 1
    return counts


def replace_brokers(
    replicas: tuple[str, ...],
    leaving: set[str],
    eligible: list[str],
    counts: collections.Counter[str],
) -> tuple[str, ...] | None:
    """`replicas` with each leaving broker replaced by the eligible one holding the fewest
    (ties by id), keeping positions (so a preferred leader is replaced in place)."""
    out = list(replicas)
    for i, b in enumerate(out):
        if b not in leaving:
            continue
        choices = [e for e in eligible if e not in out]
        if not choices:
            return None
        new = min(choices, key=lambda e: (counts[e], e))
        counts[new] += 1
        counts[b] -= 1
        out[i] = new
    return tuple(out)


def balancing_move(
    state: MetadataState, eligible: list[str]
) -> tuple[TopicInfo, int, tuple[str, ...]] | None:
    """One replica from the fullest eligible broker to the emptiest, if they differ by
    more than one; the partition chosen is the first (by topic, partition) that the
    emptiest broker does not hold. Deterministic, so two leaders in a row agree."""
    counts = replica_counts(state)

    def ranked(broker: str) -> tuple[int, str]:
        return counts[broker], broker

    fullest = max(eligible, key=ranked)
    emptiest = min(eligible, key=ranked)
    if counts[fullest] - counts[emptiest] <= 1:
        return None
    for info in sorted(state.topics.values(), key=lambda t: t.name):
        for p, placement in enumerate(info.partitions):
            if fullest in placement.replicas and emptiest not in placement.replicas:
                target = tuple(emptiest if b == fullest else b for b in placement.replicas)
                return info, p, target
    return None
