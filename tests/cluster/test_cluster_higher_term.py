"""Proves on real `dmq serve` processes that a broker whose Raft term for a partition is
above the leader's rejoins the partition's group (raft/higher_term.py; issue 39, item 2).

Three brokers, one partition replicated on all three. A follower of the partition (not the
metadata leader) is killed (-9) once it holds the first records; the leader commits more
without it; while it is down, its group's term is raised 5 above the leader's in its
journal's meta file (`journal.meta`, the format of raft/journal.py: two 512-byte slots of
`u32 len | u32 crc32c | u64 seq | JSON {term, voted_for, commit_index}`), which is the
state a broker is left in after campaigning alone (a leadership transfer to it just before
it was cut off, or a build without pre-vote). It is restarted. It must catch up: within a
bound of a few election timeouts (plus the restart's own start-up), every replica of the
group is at one commit index with lag 0 under a leader whose term is above the raised
one, its segment files equal the leader's, and a record produced after that reaches them
too. Without the answer with the higher term, the leader's lower-term append_entries are
dropped unanswered and it stays behind for good (its replica's lag never falls).
"""

from __future__ import annotations

import json
import struct
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import crc32c
import pytest
from cluster_harness import DmqCluster, produce, wait_caught_up, wait_for

META_SLOT_BYTES = 512
META_HEADER = struct.Struct("<IIQ")  # len, crc32c(json), seq
TERM_RAISED_BY = 5
RECORDS_WHILE_DOWN = 30
# The default election timeout is at most 0.8 s: the group takes the broker back in a few
# (the leader steps down on its first heartbeat answered, then one pre-vote and one
# election); the margin is for a loaded 2-core machine. Without the fix: never.
REJOIN_S_MAX = 20.0


def raise_term(meta_path: Path, by: int) -> tuple[int, int]:
    """Write a newer slot with the term raised by `by` (vote cleared); (old, new) term."""
    data = meta_path.read_bytes()
    best: tuple[int, dict[str, Any]] | None = None
    for slot in range(2):
        raw = data[slot * META_SLOT_BYTES : (slot + 1) * META_SLOT_BYTES]
        if len(raw) < META_HEADER.size:
            continue
        length, crc, seq = META_HEADER.unpack_from(raw)
        payload = raw[META_HEADER.size : META_HEADER.size + length]
        valid = seq and len(payload) == length and crc32c.crc32c(payload) == crc
        if valid and (best is None or seq > best[0]):
            best = (seq, json.loads(payload))
    assert best is not None, f"{meta_path} holds no valid slot"
    seq, meta = best
    old = int(meta["term"])
    payload = json.dumps({**meta, "term": old + by, "voted_for": None}).encode()
    slot_bytes = META_HEADER.pack(len(payload), crc32c.crc32c(payload), seq + 1) + payload
    with meta_path.open("r+b") as file:
        file.seek(((seq + 1) % 2) * META_SLOT_BYTES)
        file.write(slot_bytes)
    return old, old + by


@pytest.mark.slow
def test_a_broker_whose_term_is_above_the_leaders_rejoins_its_partition_group(
    dmq_cluster: Callable[..., DmqCluster],
) -> None:
    cluster = dmq_cluster(3)
    cluster.start_all()
    cluster.create_topic("term", partitions=1, replication_factor=3)
    group_id = cluster.group("term", 0)["group_id"]
    for k in range(10):
        produce(cluster["n1"], "term", [{"value": f"before-{k}", "partition": 0}])
    leader = cluster[cluster.leader_of("term", 0)]
    meta_leader = cluster.metadata_leader()
    followers = [n for n in cluster.nodes.values() if n is not leader]
    # The metadata leader too would only add a metadata election to the scenario.
    behind = next((n for n in followers if n.node_id != meta_leader), followers[0])
    wait_for(
        lambda: behind.segment_bytes("term", 0) == leader.segment_bytes("term", 0),
        15.0,
        "the follower applied the first 10",
    )
    cluster.kill9(behind.node_id)
    for k in range(RECORDS_WHILE_DOWN):
        produce(leader, "term", [{"value": f"down-{k}", "partition": 0}])
    leader_term = int(cluster.group("term", 0)["term"])
    old, raised = raise_term(behind.group_dir(group_id) / "journal.meta", TERM_RAISED_BY)
    assert raised > leader_term, (old, raised, leader_term)
    print(f"{behind.node_id}: term {old} -> {raised}; the leader's is {leader_term}")

    restarted_at = time.monotonic()
    cluster.restart(behind.node_id)  # returns once the broker answers /readyz
    ready_s = time.monotonic() - restarted_at
    group = wait_caught_up(cluster, "term", 0, timeout_s=REJOIN_S_MAX)
    print(
        f"ready {ready_s:.2f} s after the restart, caught up {time.monotonic() - restarted_at:.2f} s"
    )
    assert group["term"] > raised, f"caught up under term {group['term']}, not above {raised}"
    leader = cluster[group["leader"]]
    wait_for(
        lambda: behind.segment_bytes("term", 0) == leader.segment_bytes("term", 0),
        15.0,
        "the rejoined broker's segments equal to the leader's",
    )
    produce(leader, "term", [{"value": "after", "partition": 0}])
    wait_for(
        lambda: behind.segment_bytes("term", 0) == leader.segment_bytes("term", 0),
        15.0,
        "the rejoined broker applied a record produced after",
    )
