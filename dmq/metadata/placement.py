"""Partition placement: which brokers hold the replicas of new partitions, and which leads.

Pure and deterministic (no clock, no randomness): the metadata state machine calls it inside
a replicated apply, so every replica must compute the same answer from the same inputs.
Ties are always broken by broker id.

Two steps per call:

1. **Replica sets**, greedily, one partition at a time: the `replication_factor` brokers with
   the fewest replicas so far (existing topics counted), ties by broker id. Invariant: if the
   replica counts of `brokers` differed by at most 1 before the call, they differ by at most
   1 after it. (Counts are m or m+1; taking the rf lowest either leaves them in {m, m+1} or,
   when every m is taken, moves them all to {m+1, m+2}.) So on a fixed broker set, any
   sequence of creations and partition additions keeps replicas balanced to within one.
   Deletions and broker changes can unbalance it; nothing here moves existing replicas.
2. **Preferred leaders** (the first replica of each tuple), as a bounded b-matching:
   partitions are matched to one of their own replicas, each broker up to a target found by
   water-filling the existing leader counts; when no complete matching fits the targets,
   every target grows by one and the matching resumes. Invariant: for one topic on brokers
   with equal replica and leader counts (e.g. an empty cluster) and `partitions` a multiple
   of the broker count, every broker leads exactly `partitions / len(brokers)`: the graph is
   biregular, so a perfect matching at the water-filling targets exists (Hall).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

Replicas = tuple[str, ...]


class PlacementError(ValueError):
    """The request cannot be placed: e.g. more replicas than brokers."""


def assign_replicas(
    brokers: Sequence[str],
    partitions: int,
    replication_factor: int,
    existing: Mapping[str, Sequence[Sequence[str]]],
) -> list[Replicas]:
    """Replicas of `partitions` new partitions, leader first.

    `brokers` are the brokers that may receive replicas (the live ones), sorted and distinct;
    `existing` maps every topic to its current per-partition replica lists (leader first);
    replicas on brokers not in `brokers` are not counted.
    """
    _check(brokers, partitions, replication_factor)
    replica_counts = _counts(brokers, (r for parts in existing.values() for r in parts))
    leader_counts = _counts(brokers, (r[:1] for parts in existing.values() for r in parts))
    replica_sets: list[list[str]] = []
    for _ in range(partitions):
        chosen = sorted(brokers, key=lambda b: (replica_counts[b], b))[:replication_factor]
        for broker in chosen:
            replica_counts[broker] += 1
        replica_sets.append(sorted(chosen))
    leaders = _match_leaders(brokers, replica_sets, leader_counts)
    return [
        (leader, *[b for b in replica_set if b != leader])
        for leader, replica_set in zip(leaders, replica_sets, strict=True)
    ]


def _check(brokers: Sequence[str], partitions: int, replication_factor: int) -> None:
    if list(brokers) != sorted(set(brokers)):
        raise PlacementError("brokers must be sorted and distinct")
    if partitions < 0:
        raise PlacementError(f"partitions must be >= 0, not {partitions}")
    if replication_factor < 1:
        raise PlacementError(f"replication_factor must be >= 1, not {replication_factor}")
    if replication_factor > len(brokers):
        raise PlacementError(
            f"replication_factor {replication_factor} is more than the "
            f"{len(brokers)} available broker(s)"
        )


def _counts(brokers: Sequence[str], replica_lists: Iterable[Sequence[str]]) -> dict[str, int]:
    counts = dict.fromkeys(brokers, 0)
    for replicas in replica_lists:
        for broker in replicas:
            if broker in counts:
                counts[broker] += 1
    return counts


def _water_fill(
    brokers: Sequence[str], leader_counts: dict[str, int], total: int
) -> dict[str, int]:
    """How many of `total` new leaders each broker takes to even out the leader counts."""
    targets = dict.fromkeys(brokers, 0)
    for _ in range(total):
        broker = min(brokers, key=lambda b: (leader_counts[b] + targets[b], b))
        targets[broker] += 1
    return targets


def _match_leaders(
    brokers: Sequence[str], replica_sets: list[list[str]], leader_counts: dict[str, int]
) -> list[str]:
    """One leader per partition among its replicas, each broker within its capacity
    (Kuhn's augmenting paths for a b-matching; capacities grow by one when stuck)."""
    capacity = _water_fill(brokers, leader_counts, len(replica_sets))
    led: dict[str, list[int]] = {b: [] for b in brokers}
    leader_of: list[str | None] = [None] * len(replica_sets)

    def augment(partition: int, visited: set[str]) -> bool:
        for broker in replica_sets[partition]:
            if broker in visited:
                continue
            visited.add(broker)
            if len(led[broker]) < capacity[broker]:
                _take(partition, broker)
                return True
            for other in list(led[broker]):
                if augment(other, visited):
                    led[broker].remove(other)  # `other` moved to another broker
                    _take(partition, broker)
                    return True
        return False

    def _take(partition: int, broker: str) -> None:
        led[broker].append(partition)
        leader_of[partition] = broker

    for partition in range(len(replica_sets)):
        while not augment(partition, set()):
            for broker in brokers:
                capacity[broker] += 1
    result = [b for b in leader_of if b is not None]
    if len(result) != len(replica_sets):  # pragma: no cover - invariant
        raise AssertionError("every partition must have a leader")
    return result
