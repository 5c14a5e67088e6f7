"""Proves, on real `dmq serve` processes, that a partition moves between brokers without
losing or duplicating a record (dmq/broker/operations.py, raft/membership.py):

- a reassignment to a broker that holds no replica yet, with producers running through
  the other brokers, is interrupted by kill -9 of the receiving broker once it opened its
  replica (added to the Raft group or about to be); while it is down no old replica is
  removed (never fewer than the replication factor in sync); after its restart the
  reassignment completes: the catalogue and the Raft group hold exactly the target, the
  leaving broker's replica directory is deleted, every acknowledged record is read back
  exactly once at its offset and in order, and the new replica's segments are
  byte-identical to the others';
- the metadata leader driving a move is killed (-9) halfway: a new one completes it while
  the old one is down, and the old one, restarted, deletes the replica it no longer holds;
- a move whose group cannot commit the add without the new replica completes (the new
  broker opens its replica before it is added): a partition with one replica, and a
  partition of three whose replica being replaced is on a broker that is down; a
  reassignment and a partition decommission asked through an observer answer 202;
- bad requests (reassignments, voter changes, decommissions) are refused with a 4xx
  naming the field.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest
from cluster_harness import (
    Ack,
    DmqCluster,
    Node,
    Producer,
    check_log_against_acks,
    fetch_all,
    operations,
    placements,
    produce,
    wait_for,
    wait_identical_segments,
)

PRELOAD_REQUESTS = 40  # x 100 records of ~1 KiB: ~4 MB the new replica must copy
PRELOAD_RECORDS = 100


def preload_partition(node: Node, topic: str) -> Producer:
    """~4 MB in partition 0, so that a new replica takes a while to catch up. The records
    are acknowledged like any: the returned producer (never started) holds them."""
    preload = Producer(node, topic, "preload")
    for k in range(PRELOAD_REQUESTS):
        values = [f"pre-{k}-{i}-" + "x" * 1000 for i in range(PRELOAD_RECORDS)]
        sent = time.monotonic()
        answers = produce(node, topic, [{"value": v, "partition": 0} for v in values])
        preload.attempts += values
        preload.acked += [
            Ack(v, p, offset, sent, time.monotonic())
            for v, (p, offset) in zip(values, answers, strict=True)
        ]
    return preload


@pytest.mark.slow
def test_reassignment_interrupted_by_kill9_of_the_new_replica_completes_after_restart(
    dmq_cluster: Callable[..., DmqCluster],
) -> None:
    cluster = dmq_cluster(4, metadata_voters=["n1", "n2", "n3"]).start_all()
    cluster.create_topic("move", partitions=1, replication_factor=3)
    [before] = placements(cluster["n1"], "move")
    [joiner] = [n for n in cluster.nodes if n not in before]
    leader = cluster.leader_of("move", 0)
    # Move the replica of the current leader: leadership must move first.
    target = [joiner, *[b for b in before if b != leader]]
    preload = preload_partition(cluster[before[0]], "move")
    stayers = [b for b in before if b != leader]
    producers = [Producer(cluster[b], "move", f"p-{b}").start() for b in stayers]
    try:
        wait_for(lambda: all(len(p.acked) >= 10 for p in producers), 30.0, "10 acks each")
        answer = cluster["n1"].json(
            "POST", "/v1/cluster/reassignments",
            {"topic": "move", "partition": 0, "replicas": target},
        )  # fmt: skip
        assert answer["target"] == target and not answer["done"]
        # The new broker opened its replica (it does once the target names it; the leader
        # adds it to the group once it is open: either may have happened at the kill).
        wait_for(lambda: cluster[joiner].partition_dir("move", 0).exists(), 30.0,
                 "joiner opened its replica")  # fmt: skip
        cluster.kill9(joiner)
        killed_at = time.monotonic()
        time.sleep(3.0)
        # Down, it is not added or falls behind the producers: nothing may be removed.
        [during] = placements(cluster["n1"], "move")
        assert set(before) <= set(during) <= set(before) | {joiner}, during
        ops = operations(cluster["n1"])["reassignments"]
        assert [o["target"] for o in ops] == [target]
        cluster[joiner].start()
        cluster.wait_ready([cluster[joiner]])
        wait_for(lambda: placements(cluster["n1"], "move")[0] == target, 60.0, "reassignment done")
        print(f"reassignment done {time.monotonic() - killed_at:.1f} s after the kill")
        assert operations(cluster["n1"])["reassignments"] == []
        acked_before_stop = sum(len(p.acked) for p in producers)
        wait_for(
            lambda: sum(len(p.acked) for p in producers) >= acked_before_stop + 20,
            30.0,
            "20 acks after the move",
        )
    finally:
        for producer in producers:
            producer.finish()
    assert not any(p.errors for p in producers), [p.errors for p in producers]
    new_leader = cluster.leader_of("move", 0)
    assert new_leader in target
    group = cluster.group("move", 0)
    assert sorted(r["node_id"] for r in group["replicas"]) == sorted(target)
    wait_for(lambda: not cluster[leader].partition_dir("move", 0).exists(), 30.0, "old dir gone")
    log = fetch_all(cluster[new_leader], "move", 0)
    assert len(log) >= PRELOAD_REQUESTS * PRELOAD_RECORDS
    check_log_against_acks(log, [preload, *producers])
    live_targets = DmqCluster.__new__(DmqCluster)
    live_targets.nodes = {b: cluster[b] for b in target}
    wait_identical_segments(live_targets, "move", 1)


@pytest.mark.slow
def test_reassignment_survives_kill9_of_the_metadata_leader_driving_it(
    dmq_cluster: Callable[..., DmqCluster],
) -> None:
    """The metadata leader drives every operation. Kill -9 it (and, to hold the move
    halfway, the receiving broker) once the new replica opened: a new metadata leader
    takes over and completes the move while the old driver is still down; restarted, the
    old driver deletes the replica it no longer holds."""
    cluster = dmq_cluster(4, metadata_voters=["n1", "n2", "n3"]).start_all()
    cluster.create_topic("drive", partitions=1, replication_factor=3)
    [before] = placements(cluster["n1"], "drive")
    [joiner] = [n for n in cluster.nodes if n not in before]
    driver = cluster.metadata_leader()
    assert driver in before  # the first three hold every replica (placement ties by id)
    target = [joiner, *[b for b in before if b != driver]]
    stayers = [b for b in before if b != driver]
    preload = preload_partition(cluster[stayers[0]], "drive")
    producers = [Producer(cluster[b], "drive", f"p-{b}").start() for b in stayers]
    try:
        wait_for(lambda: all(len(p.acked) >= 10 for p in producers), 30.0, "10 acks each")
        via = cluster[stayers[0]]
        via.json(
            "POST", "/v1/cluster/reassignments",
            {"topic": "drive", "partition": 0, "replicas": target},
        )  # fmt: skip
        # The joiner opens its replica as soon as the target names it (before the leader
        # adds it, which may or may not have happened at the kill).
        wait_for(lambda: cluster[joiner].partition_dir("drive", 0).exists(), 30.0,
                 "joiner opened its replica")  # fmt: skip
        cluster.kill9(joiner)
        cluster.kill9(driver)
        time.sleep(1.0)
        held = set(placements(via, "drive")[0])
        assert set(before) <= held <= set(before) | {joiner}, held  # nothing removed
        cluster[joiner].start()
        cluster.wait_ready([cluster[joiner]])
        wait_for(lambda: placements(via, "drive")[0] == target, 60.0, "move done, driver down")
        assert cluster.metadata_leader() != driver and not cluster[driver].alive
        acked = sum(len(p.acked) for p in producers)
        wait_for(lambda: sum(len(p.acked) for p in producers) >= acked + 20, 30.0, "acks")
    finally:
        for producer in producers:
            producer.finish()
    cluster[driver].start()
    cluster.wait_ready([cluster[driver]])
    wait_for(lambda: not cluster[driver].partition_dir("drive", 0).exists(), 30.0, "old dir gone")
    assert not any(p.errors for p in producers), [p.errors for p in producers]
    check_log_against_acks(fetch_all(via, "drive", 0), [preload, *producers])
    assert operations(via)["reassignments"] == []


def test_moves_that_need_the_new_replica_to_commit_its_addition_complete(
    dmq_cluster: Callable[..., DmqCluster],
) -> None:
    """Adding b to a group whose other live members are not a majority of the group with
    b (one replica; or three, one of them on a dead broker being replaced) commits only
    once b answers: b's broker must open the replica before the leader adds it."""
    cluster = dmq_cluster(
        4, metadata_voters=["n1", "n2", "n3"], extra_args=["--auto-balance-replicas", "false"]
    ).start_all()  # only the moves asked for here
    via = cluster["n1"]
    cluster.create_topic("solo", partitions=1, replication_factor=1)
    [[holder]] = placements(via, "solo")
    solo = [f"s{i}" for i in range(30)]
    produce(via, "solo", [{"value": v, "partition": 0} for v in solo])
    mover = next(n for n in cluster.nodes if n != holder)
    # Asked through n4, an observer of the metadata group: its proposal's answer carries
    # only the version, the operation doc comes from its state (it was a 500).
    answer = cluster["n4"].request(
        "POST", "/v1/cluster/reassignments", {"topic": "solo", "partition": 0, "replicas": [mover]}
    )
    assert answer.status == 202 and answer.json()["target"] == [mover], answer
    cluster.create_topic("retire", partitions=2, replication_factor=1)
    answer = cluster["n4"].request("POST", "/v1/topics/retire/partitions/1/decommission")
    assert answer.status == 202 and answer.json()["status"] == "decommissioned", answer
    wait_for(lambda: placements(via, "solo") == [[mover]], 60.0, "one-replica move done")
    produce(via, "solo", [{"value": "after", "partition": 0}])
    assert [v for _, _, v in fetch_all(via, "solo", 0)] == [*solo, "after"]

    cluster.create_topic("dead", partitions=1, replication_factor=3)
    [before] = placements(via, "dead")
    [spare] = [n for n in cluster.nodes if n not in before]
    down = next(b for b in before if b != cluster.metadata_leader() and b != "n1")
    values = [f"d{i}" for i in range(30)]
    produce(via, "dead", [{"value": v, "partition": 0} for v in values])
    cluster.kill9(down)
    target = [spare if b == down else b for b in before]
    via.json(
        "POST", "/v1/cluster/reassignments", {"topic": "dead", "partition": 0, "replicas": target}
    )
    wait_for(lambda: placements(via, "dead") == [target], 60.0, "dead broker's replica replaced")
    produce(via, "dead", [{"value": "after", "partition": 0}])
    assert [v for _, _, v in fetch_all(cluster[spare], "dead", 0)] == [*values, "after"]
    cluster[down].start()
    cluster.wait_ready([cluster[down]])
    wait_for(lambda: not cluster[down].partition_dir("dead", 0).exists(), 30.0, "old dir gone")


def test_reassignment_requests_are_checked(dmq_cluster: Callable[..., DmqCluster]) -> None:
    cluster = dmq_cluster(3).start_all()
    cluster.create_topic("chk", partitions=1, replication_factor=2)
    node = cluster["n1"]
    cases = [
        ({"topic": "chk", "partition": 0, "replicas": ["n1"]}, 400, "replicas"),
        ({"topic": "chk", "partition": 0, "replicas": ["n1", "n1"]}, 400, "replicas"),
        ({"topic": "chk", "partition": 0, "replicas": ["n1", "zz"]}, 400, "replicas"),
        ({"topic": "chk", "partition": 5, "replicas": ["n1", "n2"]}, 404, "partition"),
        ({"topic": "nope", "partition": 0, "replicas": ["n1", "n2"]}, 404, "topic"),
        ({"topic": "chk", "partition": 0, "replicas": "n1"}, 400, "replicas"),
        ({"topic": "chk", "partition": 0, "replicas": ["n1"] * 17}, 400, "replicas"),
        ({"topic": "chk", "partition": 0, "replicas": ["n1", "n2"], "x": 1}, 400, "x"),
    ]
    for body, status, field in cases:
        resp = node.request("POST", "/v1/cluster/reassignments", body)
        assert resp.status == status, (body, resp)
        if field is not None:
            assert resp.json()["error"]["details"]["field"] == field, (body, resp)
    for body, field in (
        ({"voters": "n1"}, "voters"),
        ({"voters": []}, "voters"),
        ({"voters": ["n1"] * 17}, "voters"),
        ({"voters": ["n1", 7]}, "voters"),
        ({"voters": ["n1", "zz"]}, "voters"),  # not a registered broker
        ({"voters": ["n1", "n2", "n3"], "x": 1}, "x"),
    ):
        resp = node.request("POST", "/v1/cluster/metadata-voters", body)
        assert resp.status == 400, (body, resp)
        assert resp.json()["error"]["details"]["field"] == field, (body, resp)
    resp = node.request("POST", "/v1/cluster/brokers/n1/decommission")
    assert resp.status == 400, resp
    assert resp.json()["error"]["details"]["field"] == "broker_id", resp
