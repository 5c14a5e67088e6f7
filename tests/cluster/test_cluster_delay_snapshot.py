"""A follower that installs a snapshot copies the delay store from another replica.

Three `dmq serve` nodes with --raft-snapshot-entries 16. Delayed records are scheduled
(some cancelled), a follower of the partition is killed (-9), and the leader takes many
more single-record delayed produces (one Raft entry each), so it snapshots past the
follower's journal. The snapshot names the delay store; it does not carry its records
(dmq/partition/delay.py). On restart the follower installs it and must stream the store
as it was at the snapshot's position from the leader: its replica then counts the same
pending records as the leader's. Leadership then moves to that follower, which releases
every record from its copy: each delivered exactly once, none before its deliver_at,
the cancelled ones never.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest
from cluster_harness import DmqCluster, fetch_all, journal_indexes, retry, wait_for

SNAPSHOT_ENTRIES = 16
DUE_AFTER_S = 12  # every record is due this long after the first schedule


@pytest.mark.slow
def test_a_follower_installing_a_snapshot_copies_the_delay_store(
    dmq_cluster: Callable[..., DmqCluster],
) -> None:
    cluster = dmq_cluster(3, extra_args=["--raft-snapshot-entries", str(SNAPSHOT_ENTRIES)])
    cluster.start_all()
    cluster.create_topic("ds", partitions=1, replication_factor=3)
    info = cluster.group("ds", 0)
    leader = cluster[cluster.leader_of("ds", 0)]
    meta_leader = cluster.metadata_leader()
    followers = [n for n in cluster.nodes.values() if n is not leader]
    follower = next((n for n in followers if n.node_id != meta_leader), followers[0])
    due_ms = int((time.time() + DUE_AFTER_S) * 1000)
    deliver_at: dict[str, int] = {}
    ids: dict[str, str] = {}

    def schedule(values: list[str]) -> None:
        records = [{"value": v, "deliver_at": due_ms + i} for i, v in enumerate(values)]
        resp = retry(lambda: leader.request(
            "POST", "/v1/topics/ds/records", {"records": records}), timeout_s=20)  # fmt: skip
        assert resp.status == 200, resp
        for record, answer in zip(records, resp.json()["offsets"], strict=True):
            deliver_at[record["value"]] = answer["deliver_at"]
            ids[record["value"]] = answer["id"]

    schedule([f"early-{i}" for i in range(40)])
    wait_for(
        lambda: follower.json("GET", "/v1/internal/delay/ds/0")["count"] == 40,
        15.0,
        "the follower applied the first schedules",
    )
    cluster.kill9(follower.node_id)
    follower_last = journal_indexes(follower.group_dir(info["group_id"]) / "journal")
    assert follower_last is not None
    cancelled = {f"early-{i}" for i in range(0, 40, 8)}
    for value in cancelled:
        resp = retry(lambda value=value: leader.request(
            "DELETE", f"/v1/topics/ds/scheduled/{ids[value]}"), timeout_s=20)  # fmt: skip
        assert resp.status == 200, resp
    for k in range(6 * SNAPSHOT_ENTRIES):
        schedule([f"gap-{k}"])
    leader_journal = leader.group_dir(info["group_id"]) / "journal"
    wait_for(
        lambda: (held := journal_indexes(leader_journal)) and held[0] > follower_last[1] + 1,
        20.0,
        "the leader's journal starting after the follower's last entry",
    )
    cluster.restart(follower.node_id)
    pending = len(deliver_at) - len(cancelled)
    wait_for(
        lambda: follower.json("GET", "/v1/internal/delay/ds/0")["count"] == pending,
        30.0,
        f"the restored follower counting {pending} pending",
    )
    assert (follower.group_dir(info["group_id"]) / "snapshot").exists()
    # The restored follower leads and releases from its copy.
    topic_id = int((leader.data_dir / "partitions" / "ds-0" / "topic_id").read_text())
    resp = retry(lambda: leader.request(
        "POST", f"/v1/internal/partitions/ds/0/transfer?topic_id={topic_id}",
        {"target": follower.node_id}), timeout_s=20)  # fmt: skip
    assert resp.status == 200, resp
    wait_for(lambda: cluster.leader_of("ds", 0) == follower.node_id, 20.0, "the transfer")
    print(f"transferred {due_ms / 1000 - time.time():.1f} s before the records are due")
    assert time.time() * 1000 < due_ms, "the test ran past the records' time: raise DUE_AFTER_S"
    wait_for(
        lambda: len(fetch_all(follower, "ds", 0)) >= pending,
        DUE_AFTER_S + 20,
        "every pending record released",
    )
    time.sleep(0.5)
    values = [v for _, _, v in fetch_all(follower, "ds", 0)]
    assert len(values) == len(set(values)), "a record delivered twice"
    assert set(values) == set(deliver_at) - cancelled
    assert follower.json("GET", "/v1/topics/ds/scheduled")["count"] == 0
