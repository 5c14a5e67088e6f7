"""Proves that a follower which fell behind a leader's journal compaction catches up through
the snapshot path and ends with the leader's partition log byte for byte.

Three `dmq serve` nodes run with --raft-snapshot-entries 64. A follower of the partition's
group is paused (SIGSTOP), or killed (-9) to restart later from its own files, once it
holds a few entries and no snapshot of its own. The leader then commits several hundred
single-record produces (each sequential request is one Raft entry), so it snapshots and
drops its journal prefix past the follower's last entry: append_entries can no longer
bring the follower up to date. The test checks that precondition on disk (the journals of
both other nodes, either of which may lead, start after the follower's ends), resumes the
follower (SIGCONT or restart), and requires that it installs a snapshot (its group
directory gains a `snapshot` file, which may come a moment after the segments, and its
journal jumps past the gap) and that its segment files become identical to the leader's,
which needs the snapshot restore to copy the missing batches from the leader. (Fetches
relay to the leader, so the follower's own files are what the test compares.)
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
from cluster_harness import DmqCluster, fetch_all, journal_indexes, produce, wait_for

SNAPSHOT_ENTRIES = 64
PRODUCES_WHILE_PAUSED = 6 * SNAPSHOT_ENTRIES


@pytest.mark.slow
@pytest.mark.parametrize("fault", ["sigstop", "kill9"])
def test_follower_behind_compaction_catches_up_through_a_snapshot(
    dmq_cluster: Callable[..., DmqCluster], fault: str
) -> None:
    cluster = dmq_cluster(3, extra_args=["--raft-snapshot-entries", str(SNAPSHOT_ENTRIES)])
    cluster.start_all()
    cluster.create_topic("snap", partitions=1, replication_factor=3)
    group_id = cluster.group("snap", 0)["group_id"]
    for k in range(10):
        produce(cluster["n1"], "snap", [{"value": f"before-{k}", "partition": 0}])
    # The leaders now, not at creation: leader balancing may have moved them since.
    leader = cluster[cluster.leader_of("snap", 0)]
    meta_leader = cluster.metadata_leader()
    followers = [n for n in cluster.nodes.values() if n is not leader]
    # Pausing the metadata leader too would only add an election to the scenario.
    follower = next((n for n in followers if n.node_id != meta_leader), followers[0])
    # Fetches relay to the leader: the follower's own files say what it applied.
    wait_for(
        lambda: follower.segment_bytes("snap", 0) == leader.segment_bytes("snap", 0),
        15.0,
        "the follower applied the first 10",
    )
    follower_journal = follower.group_dir(group_id) / "journal"
    follower_snapshot = follower.group_dir(group_id) / "snapshot"
    assert not follower_snapshot.exists(), "the follower snapshotted before the test began"

    if fault == "sigstop":
        follower.sigstop()
    else:
        cluster.kill9(follower.node_id)
    indexes = journal_indexes(follower_journal)
    assert indexes is not None, "the follower's journal holds no entry"
    follower_last = indexes[1]
    for k in range(PRODUCES_WHILE_PAUSED):
        produce(leader, "snap", [{"value": f"paused-{k}", "partition": 0}])

    leader_journal = leader.group_dir(group_id) / "journal"
    # Both nodes that stayed up, not only the leader: under load an election can move the
    # group's leadership to the other one while the follower is away, and a leader whose
    # journal still holds the follower's next entry catches it up by append_entries.
    others = [n for n in cluster.nodes.values() if n is not follower]

    def compacted_past_follower() -> bool:
        held = [journal_indexes(n.group_dir(group_id) / "journal") for n in others]
        return all(h is not None and h[0] > follower_last + 1 for h in held)

    wait_for(
        compacted_past_follower,
        20.0,
        f"the journals of {[n.node_id for n in others]} starting after the follower's "
        f"last entry {follower_last}",
    )
    print(
        f"{follower.node_id} stopped ({fault}) at index {follower_last}; "
        f"leader {leader.node_id} journal holds {journal_indexes(leader_journal)}"
    )
    if fault == "sigstop":
        follower.sigcont()
    else:
        cluster.restart(follower.node_id)

    expected = fetch_all(leader, "snap", 0)
    assert len(expected) == 10 + PRODUCES_WHILE_PAUSED
    wait_for(
        lambda: follower.segment_bytes("snap", 0) == leader.segment_bytes("snap", 0),
        30.0,
        "the follower's segments equal to the leader's",
    )
    # The restore copies the missing batches into the segments before the installed
    # snapshot is written under its final name: the file may come a moment later.
    wait_for(follower_snapshot.exists, 10.0, "the follower caught up without installing a snapshot")
    # Entries after the catch-up land after the snapshot's index, not after the old tail.
    produce(leader, "snap", [{"value": "after", "partition": 0}])
    wait_for(
        lambda: follower.segment_bytes("snap", 0) == leader.segment_bytes("snap", 0),
        15.0,
        "the follower applied the entry after its catch-up",
    )
    held = journal_indexes(follower_journal)
    assert held is not None and held[0] > follower_last + 1, (
        f"the follower's journal {held} did not jump past its old end {follower_last}"
    )
    print(f"{follower.node_id} journal after catch-up holds {held}")
    assert fetch_all(follower, "snap", 0)[: len(expected)] == expected
    wait_for(
        lambda: all(
            node.segment_bytes("snap", 0) == leader.segment_bytes("snap", 0)
            for node in cluster.nodes.values()
        ),
        15.0,
        "every replica's segments equal to the leader's",
    )
