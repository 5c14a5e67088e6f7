"""Proves, with real `dmq serve` processes on 127.0.0.11.. (every partition a Raft group,
a metadata Raft group owning topics), that:

- a fresh topic's first leaders are the placement's preferred replicas (one per broker
  in turn), elected so, not moved there by the leader balancer;
- any node accepts a produce for any partition and forwards it to the leader: records
  produced with acks=all through each of three nodes are read back through each node at
  the same offsets, every one exactly once (a fetch relays to the leader), and every
  node's own segment files end up byte-identical; right after the last acknowledgement,
  an offsets read or a fetch with consistency=linearizable (the default) through any node
  answers the high watermark that includes it, with no waiting (ReadIndex at the leader);
  consistency=leader is served too; any other value is a 400 naming the field;
- kill -9 of a partition's leader while producers through every node keep producing
  with acks=all, going on with a new value after a 429/503/504 or a connection failure:
  no acknowledged record is lost or duplicated, each one is at the offset its
  acknowledgement gave, and produce through the survivors resumes within 3 s (asserted
  with margin for this loaded 2-core machine: < 6 s, the figure is printed);
- the killed node, restarted, catches up, and once the cluster is quiet every replica's
  segment files (`*.log`) are byte-identical (the leader stamps offsets and times into
  the command, every replica appends the same bytes);
- with five nodes of which only n1-n3 vote in the metadata group, a non-voter creates
  topics, produces and fetches (forwarding), and kill -9 of the metadata leader leaves a
  new voter leading and topic creation working again.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest
from cluster_harness import (
    FAILOVER_S_MAX,
    DmqCluster,
    Node,
    Producer,
    check_log_against_acks,
    fetch_all,
    first_ack_sent_after,
    placements,
    produce,
    retry,
    wait_caught_up,
    wait_for,
    wait_identical_segments,
)


def test_produce_through_every_node_is_read_through_every_node_at_the_same_offsets(
    dmq_cluster: Callable[..., DmqCluster],
) -> None:
    cluster = dmq_cluster(3).start_all()
    # A fresh topic's first leaders are the placement's preferred replicas (balanced over
    # the brokers), not whichever replica's timer fired first: 1 in 729 by chance.
    cluster.create_topic("placed", partitions=6, replication_factor=3)
    preferred = [replicas[0] for replicas in placements(cluster["n1"], "placed")]
    assert sorted(preferred) == ["n1", "n1", "n2", "n2", "n3", "n3"], preferred
    assert [cluster.leader_of("placed", p) for p in range(6)] == preferred
    cluster.create_topic("orders", partitions=2, replication_factor=3, via=cluster["n2"])
    expected: dict[int, dict[int, str]] = {0: {}, 1: {}}  # partition -> offset -> value
    for node in cluster.nodes.values():
        for partition in (0, 1):
            values = [f"{node.node_id}-p{partition}-{k}" for k in range(5)]
            records = [
                {"key": f"k{k}", "value": v, "partition": partition} for k, v in enumerate(values)
            ]
            offsets = produce(node, "orders", records)
            assert [p for p, _ in offsets] == [partition] * 5
            for value, (_, offset) in zip(values, offsets, strict=True):
                assert offset not in expected[partition], f"offset {offset} given twice"
                expected[partition][offset] = value
    for node in cluster.nodes.values():
        for partition in (0, 1):
            base = f"/v1/topics/orders/partitions/{partition}"
            for query in ("", "?consistency=linearizable", "?consistency=leader"):
                offsets = node.json("GET", f"{base}/offsets{query}")
                # leader: the leader's state at once, complete here too (it is not deposed)
                assert offsets["high_watermark"] == 15, (node.node_id, query, offsets)
            fetched = node.json("GET", f"{base}/records?offset=14&consistency=linearizable")
            assert [r["offset"] for r in fetched["records"]] == [14], fetched
        bad = node.request("GET", "/v1/topics/orders/partitions/0/records?consistency=strong")
        assert bad.status == 400 and bad.json()["error"]["details"]["field"] == "consistency", bad
    for partition in (0, 1):
        want = sorted(expected[partition].items())
        assert [offset for offset, _ in want] == list(range(15)), "offsets are not dense"
        for node in cluster.nodes.values():
            # A follower serves what it has applied: wait for it to have everything.
            got = wait_for(
                lambda node=node, partition=partition: (
                    records if len(records := fetch_all(node, "orders", partition)) >= 15 else None
                ),
                15.0,
                f"15 records of orders-{partition} through {node.node_id}",
            )
            assert [(offset, value) for offset, _, value in got] == want, node.node_id
    wait_identical_segments(cluster, "orders", 2)
    # Each node describes its own replicas, followers' too, though the tick thread has a
    # follower's offsets mirrored on the event loop only every FOLLOWER_MIRROR_INTERVAL_S.
    for node in cluster.nodes.values():
        parts = node.json("GET", "/v1/topics/orders")["partitions"]
        ends = [(p["high_watermark"], p["log_end_offset"]) for p in parts]
        assert ends == [(15, 15), (15, 15)], (node.node_id, ends)


@pytest.mark.slow
def test_leader_killed_mid_stream_no_acked_record_lost_or_duplicated_and_it_catches_up(
    dmq_cluster: Callable[..., DmqCluster],
) -> None:
    cluster = dmq_cluster(3).start_all()
    cluster.create_topic("stream", partitions=1, replication_factor=3)
    producers = {
        node.node_id: Producer(node, "stream", f"via-{node.node_id}").start()
        for node in cluster.nodes.values()
    }
    try:
        wait_for(lambda: all(len(p.acked) >= 20 for p in producers.values()), 20.0, "20 acks each")
        # The leader now, not at creation: leader balancing may have moved it since.
        leader = cluster.leader_of("stream", 0)
        term_before = cluster.group("stream", 0)["term"]
        others = [p for node_id, p in producers.items() if node_id != leader]
        killed_at = time.monotonic()
        cluster.kill9(leader)
        resumed_s = wait_for(
            lambda: first_ack_sent_after(others, killed_at), 30.0, "an ack after the kill"
        )
        acked_then = sum(len(p.acked) for p in others)
        wait_for(lambda: sum(len(p.acked) for p in others) >= acked_then + 50, 20.0, "50 more acks")
    finally:
        for producer in producers.values():
            producer.finish()
    print(f"failover: produce resumed {resumed_s:.2f} s after kill -9 of the leader {leader}")
    everyone = list(producers.values())
    assert not [e for p in everyone for e in p.errors], [p.errors for p in everyone]
    assert resumed_s < FAILOVER_S_MAX, f"produce resumed only {resumed_s:.2f} s after the kill"
    new_leader = cluster.leader_of("stream", 0)
    assert new_leader != leader
    assert cluster.group("stream", 0)["term"] > term_before

    survivor = cluster[new_leader]
    log = fetch_all(survivor, "stream", 0)
    check_log_against_acks(log, everyone)

    restarted = cluster.restart(leader)
    for node in cluster.nodes.values():
        got = wait_for(
            lambda node=node: (
                records if len(records := fetch_all(node, "stream", 0)) >= len(log) else None
            ),
            30.0,
            f"{len(log)} records through {node.node_id}",
        )
        assert got[: len(log)] == log, f"{node.node_id} serves a different log"
    files = wait_identical_segments(cluster, "stream", 1)
    assert sum(len(data) for data in files.values()) > 0
    # The restarted node holds the whole log itself, not just a forwarder's view.
    assert restarted.segment_bytes("stream", 0) == files
    # /v1/cluster/status says so too: three replicas at one commit index, no lag.
    wait_caught_up(cluster, "stream", 0)


@pytest.mark.slow
def test_five_nodes_non_voters_serve_and_metadata_leader_failover(
    dmq_cluster: Callable[..., DmqCluster],
) -> None:
    voters = ["n1", "n2", "n3"]
    cluster = dmq_cluster(5, metadata_voters=voters).start_all(timeout_s=90.0)
    n4, n5 = cluster["n4"], cluster["n5"]
    brokers = {b["node_id"] for b in n5.json("GET", "/v1/cluster/status")["brokers"]}
    assert brokers == set(cluster.nodes)

    cluster.create_topic("five", partitions=2, replication_factor=3, via=n5)
    sent = {0: [f"a-{k}" for k in range(10)], 1: [f"b-{k}" for k in range(10)]}
    for partition, values in sent.items():
        via = n4 if partition == 0 else n5
        produce(via, "five", [{"value": v, "partition": partition} for v in values])
    for partition, values in sent.items():
        for via in (n4, n5):
            got = wait_for(
                lambda via=via, partition=partition: (
                    r if len(r := fetch_all(via, "five", partition)) >= 10 else None
                ),
                15.0,
                f"five-{partition} through {via.node_id}",
            )
            assert [(o, v) for o, _, v in got] == list(enumerate(values))

    meta_leader = cluster.metadata_leader()
    assert meta_leader in voters
    meta_group = cluster.group(None, None)
    assert {r["node_id"] for r in meta_group["replicas"]} >= set(voters)
    killed_at = time.monotonic()
    cluster.kill9(meta_leader)
    via = n4 if meta_leader != "n4" else n5
    resp = retry(
        lambda: via.request(
            "POST", "/v1/topics", {"name": "after", "partitions": 1, "replication_factor": 3}
        ),
        timeout_s=30.0,
    )
    created_s = time.monotonic() - killed_at
    print(f"metadata failover: topic created {created_s:.2f} s after kill -9 of {meta_leader}")
    assert resp.status == 201, resp
    new_meta_leader = cluster.metadata_leader()
    assert new_meta_leader in voters and new_meta_leader != meta_leader
    cluster.leader_of("after", 0)
    [(_, offset)] = retry_produce(n5, "after", [{"value": "x", "partition": 0}])
    assert (offset, "x") in [(o, v) for o, _, v in fetch_all(n4, "after", 0)]
    # The old topic still takes writes (its partitions may have lost their leader too).
    [(_, offset)] = retry_produce(n4, "five", [{"value": "a-10", "partition": 0}])
    assert offset >= 10 and (offset, "a-10") in [(o, v) for o, _, v in fetch_all(n5, "five", 0)]


def retry_produce(
    node: Node, topic: str, records: list[dict[str, str | int]]
) -> list[tuple[int, int]]:
    resp = retry(
        lambda: node.request("POST", f"/v1/topics/{topic}/records?acks=all", {"records": records}),
        timeout_s=30.0,
    )
    assert resp.status == 200, resp
    return [(item["partition"], item["offset"]) for item in resp.json()["offsets"]]
