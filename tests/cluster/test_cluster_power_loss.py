"""Proves the acks=all contract across a power loss of the whole cluster: a record whose
produce was acknowledged survives, once, at the offset its acknowledgement gave.

Three `dmq serve` nodes run with DMQ_DURABLE_TRACE=1: every Raft journal appends its
durable length after each fdatasync to `journal.durable` (raft/journal.py), and every
partition segment appends its durable length after each fsync to `<base>.log.durable`
(log/segment.py). Producers through every node stream single-record acks=all produces to
three partitions (whoever leads them). All nodes are killed (-9) at once, right after an
acknowledgement, mid-stream; every journal and every segment file is cut back to its last
durable length, which drops exactly what a power cut could (written, in the page cache,
not synced). In two cases the journal compaction threshold
is out of reach, so the journals are never rewritten; in the third a snapshot is taken
every 64 entries, so the journal prefixes are dropped and the partitions' segments must
hold what they replaced (a rewritten journal is synced whole, so only trace lines after
the rewrite can cut it).
(The partitions' `raft-applied` checkpoints are not cut: a power cut may as well keep
their unsynced tail, which then describes log data that is gone; open must cope.)

Then two nodes restart, a majority (the one left down led partition 0 before the cut, or
followed it): every acknowledged record must be readable through them at its acknowledged
offset, no value may appear twice, and each producer's acknowledgements must be in offset
order. Then the third restarts and every replica's segment files must become
byte-identical.

The negative control runs the same steps with --raft-durability none (no journal
fdatasync, so nothing is traced as durable): the cut then loses acknowledged records,
which shows that the simulation bites.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from cluster_harness import (
    ClusterError,
    DmqCluster,
    Node,
    Producer,
    fetch_all,
    produce,
    retry,
    wait_for,
)

from log.segment import DURABLE_TRACE_SUFFIX
from raft.journal import DURABLE_TRACE_FILE, HEADER_BYTES, JOURNAL_FILE

TOPIC = "pl"
PARTITIONS = 3
PRODUCERS_PER_NODE = 3
STREAM_S = 2.5
SNAPSHOTS_OFF = 1_000_000  # journal entries per snapshot: out of reach
SNAPSHOTS_OFTEN = 64  # many snapshots: journal prefixes dropped, the segments must hold


def last_traced(trace: Path, default: int, size: int) -> int:
    """The last durable length a trace records for a file of `size` bytes now. After a
    journal compaction ("rewrite": the file was replaced by a synced copy) only later
    lines describe the new file; with none, nothing of it is known to be unsynced."""
    lines = trace.read_text().split() if trace.exists() else []
    if "rewrite" in lines:
        lines = lines[len(lines) - lines[::-1].index("rewrite") :]
        default = size
    return min(int(lines[-1]) if lines else default, size)


def cut_to_durable(data_dir: Path) -> tuple[int, int]:
    """Truncate every Raft journal and every segment under data_dir to its last traced
    durable length. Returns the bytes cut from (journals, segments)."""
    journal_cut = segment_cut = 0
    for journal in (data_dir / "raft" / "groups").glob(f"*/{JOURNAL_FILE}"):
        size = journal.stat().st_size
        # A suffix truncation not yet followed by a sync leaves the trace above the size.
        durable = last_traced(journal.with_name(DURABLE_TRACE_FILE), HEADER_BYTES, size)
        os.truncate(journal, durable)
        journal_cut += size - durable
    for segment in (data_dir / "partitions").glob("*/*.log"):
        size = segment.stat().st_size
        durable = last_traced(segment.with_name(segment.name + DURABLE_TRACE_SUFFIX), 0, size)
        os.truncate(segment, durable)
        segment_cut += size - durable
    return journal_cut, segment_cut


def journals_compacted(cluster: DmqCluster) -> int:
    """How many Raft journals dropped a prefix after a snapshot (their trace says so)."""
    traces = [
        node.data_dir / "raft" / "groups" / group.name / DURABLE_TRACE_FILE
        for node in cluster.nodes.values()
        for group in (node.data_dir / "raft" / "groups").iterdir()
    ]
    return sum(trace.exists() and "rewrite" in trace.read_text().split() for trace in traces)


def read_partition(node: Node, partition: int) -> list[tuple[int, str | None, str | None]]:
    """Every record of a partition through node; an unknown topic reads as empty."""
    try:
        return fetch_all(node, TOPIC, partition)
    except ClusterError as error:
        if "topic_not_found" in str(error) or "partition_not_found" in str(error):
            return []
        raise


def stream_then_cut_power(
    cluster: DmqCluster,
) -> tuple[list[Producer], str, tuple[int, int]]:
    """Start the cluster, stream produces, kill every node right after an acknowledgement
    and cut every file to its durable length. Returns (producers, the node that led
    partition 0, bytes cut from journals and segments)."""
    cluster.start_all()
    cluster.create_topic(TOPIC, partitions=PARTITIONS, replication_factor=3)
    leaders = {p: cluster.leader_of(TOPIC, p) for p in range(PARTITIONS)}
    producers = [
        Producer(node, TOPIC, f"{node.node_id}.{k}", partitions=tuple(range(PARTITIONS)))
        for node in cluster.nodes.values()
        for k in range(PRODUCERS_PER_NODE)
    ]
    for producer in producers:
        producer.start()
    try:
        time.sleep(STREAM_S)
        # Cut the power just after an acknowledgement: more are being written and synced.
        seen = sum(len(p.acked) for p in producers)
        wait_for(lambda: sum(len(p.acked) for p in producers) > seen, 10.0, "an ack", 0.0005)
        cluster.kill_all()
    finally:
        for producer in producers:
            producer.finish()
    assert not [e for p in producers for e in p.errors], [p.errors for p in producers]
    cut = (0, 0)
    for node in cluster.nodes.values():
        journals, segments = cut_to_durable(node.data_dir)
        cut = (cut[0] + journals, cut[1] + segments)
    print(f"leaders {leaders}; acked {sum(len(p.acked) for p in producers)}; cut {cut} bytes")
    return producers, leaders[0], cut


def missing_acks(
    producers: list[Producer], logs: dict[int, list[tuple[int, str | None, str | None]]]
) -> list[tuple[str, int, int]]:
    """Acknowledged (value, partition, offset) not found exactly there."""
    at = {(p, offset): value for p, log in logs.items() for offset, _, value in log}
    return [
        (ack.value, ack.partition, ack.offset)
        for producer in producers
        for ack in producer.acked
        if at.get((ack.partition, ack.offset)) != ack.value
    ]


@pytest.mark.slow
@pytest.mark.parametrize(
    ("stays_down", "snapshot_entries"),
    [("leader", SNAPSHOTS_OFF), ("follower", SNAPSHOTS_OFF), ("leader", SNAPSHOTS_OFTEN)],
)
def test_acknowledged_records_survive_power_loss_of_every_node(
    dmq_cluster: Callable[..., DmqCluster], stays_down: str, snapshot_entries: int
) -> None:
    cluster = dmq_cluster(
        3,
        extra_args=["--raft-snapshot-entries", str(snapshot_entries)],
        env={"DMQ_DURABLE_TRACE": "1"},
    )
    producers, leader_id, (journal_cut, segment_cut) = stream_then_cut_power(cluster)
    if stays_down == "leader":
        down_id = leader_id
    else:
        down_id = next(node_id for node_id in cluster.nodes if node_id != leader_id)
    acked = [ack for p in producers for ack in p.acked]
    assert len(acked) > 100, "nothing at stake: the test proved nothing"
    assert journal_cut + segment_cut > 0, "the cut dropped nothing: the test proved nothing"
    compacted = journals_compacted(cluster)
    print(f"journals compacted: {compacted}")
    if snapshot_entries == SNAPSHOTS_OFTEN:
        assert compacted > 0, "no journal was compacted: the case proved nothing more"

    two = [node for node in cluster.nodes.values() if node.node_id != down_id]
    for node in two:
        node.start()
    cluster.wait_ready(two, timeout_s=90.0)
    logs = {}
    for partition in range(PARTITIONS):
        # A new leader commits the entries of the old term with one of its own; its offset
        # says where the committed log ends.
        after = retry(
            lambda partition=partition: two[0].request(
                "POST",
                f"/v1/topics/{TOPIC}/records?acks=all",
                {"records": [{"value": f"after-{partition}", "partition": partition}]},
            ),
            timeout_s=30.0,
        )
        assert after.status == 200, after
        end = after.json()["offsets"][0]["offset"] + 1
        logs[partition] = wait_for(
            lambda partition=partition, end=end: (
                log if len(log := read_partition(two[1], partition)) >= end else None
            ),
            30.0,
            f"{TOPIC}-{partition} through {two[1].node_id} up to offset {end}",
        )
    missing = missing_acks(producers, logs)
    assert not missing, f"{len(missing)} of {len(acked)} acks not at their offset: {missing[:5]}"
    for partition, log in logs.items():
        values = [value for _, _, value in log]
        assert len(values) == len(set(values)), f"{TOPIC}-{partition}: a value stored twice"
        assert [offset for offset, _, _ in log] == list(range(len(log)))
    for producer in producers:
        for partition in range(PARTITIONS):
            offsets = [a.offset for a in producer.acked if a.partition == partition]
            assert offsets == sorted(offsets), f"{producer.name}: acks out of order"

    third = cluster.restart(down_id, timeout_s=90.0)
    for partition in range(PARTITIONS):
        wait_for(
            lambda partition=partition: all(
                node.segment_bytes(TOPIC, partition)
                == cluster[two[0].node_id].segment_bytes(TOPIC, partition)
                for node in cluster.nodes.values()
            ),
            30.0,
            f"identical segments of {TOPIC}-{partition} on all three nodes",
        )
        assert read_partition(third, partition)[: len(logs[partition])] == logs[partition]
    produce(third, TOPIC, [{"value": "last", "partition": 0}])


@pytest.mark.slow
def test_without_fsync_the_same_power_loss_loses_acknowledged_records(
    dmq_cluster: Callable[..., DmqCluster],
) -> None:
    cluster = dmq_cluster(
        3,
        extra_args=["--raft-snapshot-entries", str(SNAPSHOTS_OFF), "--raft-durability", "none"],
        env={"DMQ_DURABLE_TRACE": "1"},
    )
    producers, _, _ = stream_then_cut_power(cluster)
    assert sum(len(p.acked) for p in producers) > 100
    for node in cluster.nodes.values():
        node.start()
    cluster.wait_ready(timeout_s=90.0)
    logs = {p: read_partition(cluster["n1"], p) for p in range(PARTITIONS)}
    assert missing_acks(producers, logs) != []
