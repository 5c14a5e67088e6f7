"""Proves that the acks=all contract holds under faults other than a clean kill of one
leader, on three real `dmq serve` processes:

- a partition leader paused (SIGSTOP) while producers keep going through every node:
  the other two elect a new leader and produce resumes (< 6 s, printed); when the old leader
  resumes (SIGCONT) it must not serve or commit anything of its own: it becomes a follower,
  takes the new leader's log, and every replica ends byte-identical, with every
  acknowledged record exactly once at its acknowledged offset. Correctness must not rest
  on "am I the leader?": for a while two nodes think so;
- a rolling series of kill -9 and restarts of each node in turn (the partition leader first)
  while producers go through all three nodes to two partitions: no acknowledged record is
  lost, moved or duplicated, offsets stay dense, and the replicas end byte-identical with
  /v1/cluster/status showing no lag.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest
from cluster_harness import (
    FAILOVER_S_MAX,
    DmqCluster,
    Producer,
    check_log_against_acks,
    fetch_all,
    first_ack_sent_after,
    wait_caught_up,
    wait_for,
    wait_identical_segments,
)


def acked_count(producers: list[Producer]) -> int:
    return sum(len(p.acked) for p in producers)


@pytest.mark.slow
def test_paused_leader_comes_back_as_a_follower_without_divergence(
    dmq_cluster: Callable[..., DmqCluster],
) -> None:
    cluster = dmq_cluster(3).start_all()
    cluster.create_topic("pause", partitions=1, replication_factor=3)
    # Producers through every node: when the leader stops, several requests through it are
    # in flight, and whatever they are answered after it resumes must be true.
    producers = {
        node.node_id: [Producer(node, "pause", f"via-{node.node_id}.{k}").start() for k in range(3)]
        for node in cluster.nodes.values()
    }
    everyone = [p for group in producers.values() for p in group]
    try:
        wait_for(lambda: all(len(p.acked) >= 10 for p in everyone), 20.0, "10 acks each")
        # The leader now, not at creation: leader balancing may have moved it since.
        old_leader = cluster[cluster.leader_of("pause", 0)]
        term_before = cluster.group("pause", 0)["term"]
        through_old = producers[old_leader.node_id]
        others = [p for p in everyone if p.node is not old_leader]
        paused_at = time.monotonic()
        old_leader.sigstop()
        resumed_s = wait_for(
            lambda: first_ack_sent_after(others, paused_at), 30.0, "an ack after the pause"
        )
        before = acked_count(others)
        wait_for(lambda: acked_count(others) >= before + 50, 20.0, "50 acks while paused")
        new_leader = cluster.leader_of("pause", 0)
        assert new_leader != old_leader.node_id
        assert cluster.group("pause", 0)["term"] > term_before
        back_at = time.monotonic()
        old_leader.sigcont()
        wait_for(
            lambda: sum(a.sent > back_at for p in through_old for a in p.acked) >= 20,
            30.0,
            "20 acks through the old leader after it resumed",
        )
    finally:
        for producer in everyone:
            producer.finish()
    straddling = sum(a.sent < paused_at < a.done for p in through_old for a in p.acked)
    print(
        f"paused leader {old_leader.node_id}: produce resumed after {resumed_s:.2f} s; "
        f"{straddling} requests sent to it before the pause were acknowledged after it"
    )
    assert not [e for p in everyone for e in p.errors], [p.errors for p in everyone]
    assert resumed_s < FAILOVER_S_MAX, f"produce resumed only {resumed_s:.2f} s after the pause"

    log = fetch_all(cluster[new_leader], "pause", 0)
    check_log_against_acks(log, everyone)
    wait_identical_segments(cluster, "pause", 1)
    wait_caught_up(cluster, "pause", 0)
    for node in cluster.nodes.values():
        assert fetch_all(node, "pause", 0)[: len(log)] == log, node.node_id


@pytest.mark.slow
def test_rolling_kill_and_restart_of_every_node_loses_and_duplicates_nothing(
    dmq_cluster: Callable[..., DmqCluster],
) -> None:
    cluster = dmq_cluster(3).start_all()
    cluster.create_topic("roll", partitions=2, replication_factor=3)
    first = cluster.leader_of("roll", 0)
    victims = [first, *(node_id for node_id in cluster.nodes if node_id != first)]
    producers = [
        Producer(node, "roll", f"via-{node.node_id}", partitions=(0, 1)).start()
        for node in cluster.nodes.values()
    ]
    try:
        for victim in victims:
            before = acked_count(producers)
            wait_for(lambda b=before: acked_count(producers) >= b + 30, 30.0, "30 acks")
            cluster.kill9(victim)
            down = acked_count(producers)
            wait_for(lambda d=down: acked_count(producers) >= d + 30, 30.0, f"{victim} down")
            cluster.restart(victim)
        wait_for(lambda: all(len(p.acked) >= 20 for p in producers), 30.0, "acks through all")
    finally:
        for producer in producers:
            producer.finish()
    assert not [e for p in producers for e in p.errors], [p.errors for p in producers]
    print(f"rolling restarts: {acked_count(producers)} acks")

    for partition in (0, 1):
        log = fetch_all(cluster.any_live(), "roll", partition)
        check_log_against_acks(log, producers, partition)
        wait_caught_up(cluster, "roll", partition, timeout_s=30.0)
    wait_identical_segments(cluster, "roll", 2)
