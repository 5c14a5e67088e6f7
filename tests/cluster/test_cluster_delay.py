"""Delayed records on three real `dmq serve` processes, with the partition leader killed.

Proves that 300 records produced with delays of 0.5-4 s (through a follower, whose
proposals reach the leader), with a kill -9 of the partition leader 1.5 s in and its
restart, are each delivered exactly once, none before its deliver_at (checked against
the moment a poller first saw it) and the cancelled ones never; afterwards every
replica's log holds each exactly once and `GET .../scheduled` counts none pending. The
lateness it saw is printed (a failover is in the middle: not asserted). On the same
cluster, a filtered fetch and a filtered group fetch answer the same matches through
every broker (followers relay the filter to the partition leader).
"""

from __future__ import annotations

import random
import statistics
import time
import urllib.parse
from typing import Any

from cluster_harness import DmqCluster, fetch_all, retry, wait_for, wait_identical_segments

RECORDS = 300
CANCELLED = 10


def test_delayed_records_once_never_early_across_a_leader_kill(dmq_cluster: Any) -> None:
    cluster: DmqCluster = dmq_cluster(3).start_all()
    cluster.create_topic("d", partitions=1, replication_factor=3)
    leader = cluster.leader_of("d", 0)
    via = cluster[next(n for n in cluster.nodes if n != leader)]
    rng = random.Random(18)
    deliver_at: dict[str, int] = {}
    ids: dict[str, str] = {}
    start = time.time()
    for chunk in range(3):
        records = [
            {"value": f"r{chunk * 100 + i}", "delay_ms": rng.randint(500, 4000)} for i in range(100)
        ]
        resp = retry(lambda records=records: via.request(
            "POST", "/v1/topics/d/records", {"records": records}), timeout_s=20)  # fmt: skip
        assert resp.status == 200, resp
        for record, answer in zip(records, resp.json()["offsets"], strict=True):
            assert answer["offset"] is None and answer["deliver_at"] >= start * 1000
            deliver_at[record["value"]] = answer["deliver_at"]
            ids[record["value"]] = answer["id"]
    cancelled = set(sorted(deliver_at, key=lambda v: -deliver_at[v])[:CANCELLED])
    for value in cancelled:
        resp = retry(lambda value=value: via.request(
            "DELETE", f"/v1/topics/d/scheduled/{ids[value]}"), timeout_s=20)  # fmt: skip
        assert resp.status == 200, resp
    summary = via.json("GET", "/v1/topics/d/scheduled")
    assert 0 < summary["count"] <= RECORDS - CANCELLED

    seen: dict[str, float] = {}
    offset, killed, restarted = 0, False, False
    deadline = time.monotonic() + 40
    while len(seen) < RECORDS - CANCELLED and time.monotonic() < deadline:
        if not killed and time.time() - start > 1.5:
            cluster.kill9(leader)
            killed = True
        elif killed and not restarted and time.time() - start > 3.0:
            cluster.restart(leader)
            restarted = True
        query = urllib.parse.urlencode({"offset": offset, "max_records": 1000, "wait_ms": 100})
        try:
            resp = via.request("GET", f"/v1/topics/d/partitions/0/records?{query}")
        except OSError:
            continue
        if resp.status != 200:
            time.sleep(0.05)
            continue
        now_ms = time.time() * 1000
        doc = resp.json()
        for r in doc["records"]:
            assert r["value"] not in seen, f"{r['value']} delivered twice"
            seen[r["value"]] = now_ms
        offset = doc["next_offset"]
    assert killed and restarted
    assert set(seen) == set(deliver_at) - cancelled
    early = {v: deliver_at[v] - t for v, t in seen.items() if t < deliver_at[v]}
    assert not early, f"delivered before deliver_at (ms early): {early}"
    lateness = sorted(t - deliver_at[v] for v, t in seen.items())
    print(
        f"lateness seen by a poller, ms: p50 {statistics.median(lateness):.0f}, "
        f"max {lateness[-1]:.0f} (a leader kill -9 at 1.5 s, restart at 3 s)"
    )
    # Every replica, the restarted one included, holds each record exactly once (the
    # segment files are byte-identical, and the leader's log has each once) and has
    # nothing pending.
    wait_identical_segments(cluster, "d", 1)
    values = [v for _, _, v in fetch_all(via, "d", 0)]
    assert sorted(values) == sorted(set(deliver_at) - cancelled)
    for node in cluster.nodes.values():
        wait_for(
            lambda node=node: node.json("GET", "/v1/topics/d/scheduled")["count"] == 0 or None,
            30,
            f"nothing pending on {node.node_id}",
        )
    check_filtered_fetches_through_every_broker(cluster)


def check_filtered_fetches_through_every_broker(cluster: DmqCluster) -> None:
    """A filtered fetch and a filtered group fetch answer the same through the leader and
    through followers (which relay the filter to the leader)."""
    cluster.create_topic("f", partitions=1, replication_factor=3)
    records = [{"key": f"k{i}", "value": str(i), "partition": 0,
                "headers": {"tag": "red" if i % 5 == 0 else "blue", "n": str(i)}}
               for i in range(50)]  # fmt: skip
    resp = retry(lambda: cluster.any_live().request(
        "POST", "/v1/topics/f/records", {"records": records}), timeout_s=20)  # fmt: skip
    assert resp.status == 200, resp
    query = urllib.parse.urlencode({"filter": "tag = 'red' AND n >= 10", "max_records": 100})
    for node in cluster.live():
        resp = retry(lambda node=node: node.request(
            "GET", f"/v1/topics/f/partitions/0/records?{query}"), timeout_s=20)  # fmt: skip
        assert resp.status == 200, resp
        doc = resp.json()
        assert [r["value"] for r in doc["records"]] == [str(i) for i in range(10, 50, 5)]
        assert doc["next_offset"] == 50
        join = retry(lambda node=node: node.request(
            "POST", f"/v1/groups/g-{node.node_id}/members", {"topics": ["f"]}), timeout_s=20)  # fmt: skip
        member = join.json()["member_id"]
        path = f"/v1/groups/g-{node.node_id}/members/{member}/records?tags=red&wait_ms=2000"
        doc = retry(lambda path=path, node=node: node.request("GET", path), timeout_s=20).json()
        (part,) = doc["partitions"]
        assert [r["value"] for r in part["records"]] == [str(i) for i in range(0, 50, 5)]
        assert part["next_offset"] == 50
