"""Proves, on real `dmq serve` processes under a steady produce and consume load, that a
cluster grows from 3 to 5 brokers and shrinks back to 3 without losing, duplicating or
reordering a record (dmq/broker/operations.py):

- the first three brokers know only each other; two more start later listing everyone,
  register through the metadata group and become Raft peers of the first three
  (`RaftNode.add_peer`), and automatic balancing moves replicas onto them until every
  broker holds within one replica of the others;
- both new brokers are then decommissioned: their replicas move back (new replica added
  and caught up before the old one is removed), they leave the catalogue, and they hold
  no partition directory any more (their data directories may be deleted);
- every acknowledged record is read back exactly once at its offset and in order, the
  consumer (long-polling through a broker that stays) saw each partition's log as a gap-free
  prefix, and the partition leaders end balanced to within one per broker.
"""

from __future__ import annotations

import collections
import time
import urllib.parse
from collections.abc import Callable
from dataclasses import dataclass, field

import pytest
from cluster_harness import (
    RETRIABLE_STATUSES,
    DmqCluster,
    LoadThread,
    Node,
    Producer,
    check_log_against_acks,
    fetch_all,
    operations,
    wait_for,
)

PARTITIONS = 6
MOVE_TIMEOUT_S = 180.0  # every replica move of the test, on a loaded 2-core machine


@dataclass(eq=False)
class Consumer(LoadThread):
    """Long-polls every partition in turn through one node; records what it read."""

    node: Node
    topic: str
    partitions: int
    seen: dict[int, list[tuple[int, str | None]]] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)

    def _run(self) -> None:
        offsets = [0] * self.partitions
        while not self.stop.is_set():
            for p in range(self.partitions):
                query = urllib.parse.urlencode({"offset": offsets[p], "wait_ms": 100})
                try:
                    resp = self.node.request(
                        "GET", f"/v1/topics/{self.topic}/partitions/{p}/records?{query}"
                    )
                except OSError:
                    continue
                if resp.status != 200:
                    if resp.status not in RETRIABLE_STATUSES:
                        self.errors.append(f"{p}@{offsets[p]}: {resp!r}")
                    continue
                answer = resp.json()
                for record in answer["records"]:
                    self.seen.setdefault(p, []).append((record["offset"], record["value"]))
                offsets[p] = answer["next_offset"]


def replica_counts(node: Node, topic: str) -> dict[str, int]:
    counts: collections.Counter[str] = collections.Counter()
    for p in node.json("GET", f"/v1/topics/{topic}")["partitions"]:
        counts.update(p["replicas"])
    return dict(counts)


def balanced_onto(node: Node, topic: str, brokers: list[str]) -> dict[str, int] | None:
    """The replica counts once no operation runs and they are within one on `brokers`."""
    if operations(node)["reassignments"]:
        return None
    counts = replica_counts(node, topic)
    spread = [counts.get(b, 0) for b in brokers]
    ok = set(counts) <= set(brokers) and max(spread) - min(spread) <= 1
    return counts if ok else None


@pytest.mark.slow
def test_grow_3_to_5_then_shrink_to_3_under_load(dmq_cluster: Callable[..., DmqCluster]) -> None:
    cluster = dmq_cluster(5, metadata_voters=["n1", "n2", "n3"])
    first, joiners = ["n1", "n2", "n3"], ["n4", "n5"]
    cluster.limit_peers(first, first)
    for node_id in first:
        cluster[node_id].start()
    cluster.wait_ready([cluster[n] for n in first])
    cluster.create_topic("grow", partitions=PARTITIONS, replication_factor=3)
    producers = [
        Producer(cluster["n1"], "grow", "pa", partitions=(0, 1, 2)).start(),
        Producer(cluster["n2"], "grow", "pb", partitions=(3, 4, 5)).start(),
    ]
    consumer = Consumer(cluster["n3"], "grow", PARTITIONS).start()
    started = time.monotonic()
    try:
        wait_for(lambda: all(len(p.acked) >= 10 for p in producers), 30.0, "10 acks each")
        for node_id in joiners:
            cluster[node_id].start()
        cluster.wait_ready([cluster[n] for n in joiners])
        grown = wait_for(
            lambda: balanced_onto(cluster["n1"], "grow", first + joiners),
            MOVE_TIMEOUT_S,
            "replicas balanced onto 5 brokers",
        )
        print(f"grown to 5 in {time.monotonic() - started:.1f} s: {grown}")
        assert all(grown.get(b, 0) >= 3 for b in joiners), grown
        for node_id in joiners:
            cluster["n1"].json("POST", f"/v1/cluster/brokers/{node_id}/decommission")
        shrunk = wait_for(
            lambda: balanced_onto(cluster["n1"], "grow", first),
            MOVE_TIMEOUT_S,
            "replicas back on 3 brokers",
        )
        print(f"shrunk to 3 in {time.monotonic() - started:.1f} s: {shrunk}")
        wait_for(
            lambda: (
                sorted(b["node_id"] for b in cluster["n1"].json("GET", "/v1/cluster")["brokers"])
                == first
            ),
            30.0,
            "decommissioned brokers unregistered",
        )
        for node_id in joiners:
            left = wait_for(
                lambda n=node_id: not list((cluster[n].data_dir / "partitions").iterdir()) or None,
                30.0,
                f"{node_id} holds no partition",
            )
            assert left
            cluster.kill9(node_id)
        acked = sum(len(p.acked) for p in producers)
        wait_for(
            lambda: sum(len(p.acked) for p in producers) >= acked + 20, 30.0, "acks after shrink"
        )
    finally:
        for producer in producers:
            producer.finish()
        consumer.finish()
    assert not any(p.errors for p in producers), [p.errors for p in producers]
    assert not consumer.errors, consumer.errors[:5]
    for p in range(PARTITIONS):
        log = fetch_all(cluster["n1"], "grow", p)
        check_log_against_acks(log, producers, partition=p)
        seen = consumer.seen.get(p, [])
        assert seen == [(offset, value) for offset, _, value in log[: len(seen)]], p
    leaders = wait_for(
        lambda: _leaders_balanced(cluster, first), 60.0, "leaders within one per broker"
    )
    print(f"leaders per broker: {leaders}")


def _leaders_balanced(cluster: DmqCluster, brokers: list[str]) -> dict[str, int] | None:
    """Groups led per broker (the partitions and the metadata group: what leader
    balancing evens out, raft/README.md) once within one of each other."""
    counts = dict.fromkeys(brokers, 0)
    for group in cluster.status()["groups"]:
        if group["topic"] not in ("grow", None):
            continue
        if group["leader"] not in counts:
            return None
        counts[group["leader"]] += 1
    print(f"leaders: {counts}")
    return counts if max(counts.values()) - min(counts.values()) <= 1 else None
