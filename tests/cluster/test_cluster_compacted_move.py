"""Proves, on real `dmq serve` processes, that a partition of a compacted topic
(cleanup_policy=compact) moves to a broker that held none of it, through the snapshot path,
without stopping that broker (issue 5; dmq/partition/machine.py `_copy_missing`, log/README.md
invariants 12 and 13).

Three brokers run with --raft-snapshot-entries 64 and compaction every 200 ms. The topic
has one partition, replication factor 2, 1 KiB segments. Its leader receives several
hundred single-request updates to five hot keys, some requests with one hot record, some
with a unique-key record followed by a hot one (compaction then removes a batch's last
record but keeps the batch). A last round rewrites every hot key after the leader's Raft
journal was compacted (its journal no longer starts at entry 1), so every hot record below
the snapshot's log end is superseded, and filler (keys of its own) pushes that round into
closed segments. The test waits until compaction left only the last round of hot keys,
then reassigns the partition: the third broker, which held none of it, replaces the
follower. The new replica must restore the leader's snapshot and copy the batches below
its end from a log whose last batches before that end compaction thinned or removed. The
test checks that every broker keeps running, that the new replica installed a snapshot,
that its log end offset equals the source's, that its own log read from offset 0 (decoded
from its segment files: a fetch would be relayed to the leader) equals the source's read
before the move (the latest value of every key and every unique record, in offset order,
nothing else), and that it applies the next record at the source's end offset.
Without the fix the receiving broker stops (`copied up to ...` or `has nothing from offset`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from cluster_harness import (
    DmqCluster,
    Node,
    fetch_all,
    journal_indexes,
    operations,
    placements,
    produce,
    retry,
    wait_for,
)

from log.records import decode_batch, iter_batches

SNAPSHOT_ENTRIES = 64
HOT_KEYS = [f"hot-{k}" for k in range(5)]
UPDATES = 5 * SNAPSHOT_ENTRIES  # single-request updates before the last round


def local_replica(node: Node, topic: str) -> dict[str, Any]:
    """The node's own report of its replica of `topic`-0 (log offsets, Raft position)."""
    for replica in node.json("GET", "/v1/internal/status")["replicas"]:
        if replica["topic"] == topic and replica["partition"] == 0:
            return replica  # type: ignore[no-any-return]
    raise AssertionError(f"{node.node_id} holds no replica of {topic}-0")


def update(node: Node, topic: str, k: int, hot_value: str) -> None:
    """One request, one Raft entry, one batch: a hot record, after a unique one on odd k."""
    records = [{"key": HOT_KEYS[k % len(HOT_KEYS)], "value": hot_value, "partition": 0}]
    if k % 2:
        records.insert(0, {"key": f"unique-{k}", "value": f"u{k}", "partition": 0})
    produce(node, topic, records)


def local_read(node: Node, topic: str) -> list[tuple[int, str | None, str | None]]:
    """Every record of the node's own replica of `topic`-0, decoded from its segment files
    (a fetch would be relayed to the partition leader): [(offset, key, value)]."""
    records: list[tuple[int, str | None, str | None]] = []
    for _, data in sorted(node.segment_bytes(topic, 0).items()):
        for position, header in iter_batches(data):
            for r in decode_batch(data[position : position + header.size_bytes]).records:
                key = None if r.key is None else r.key.decode()
                records.append((r.offset, key, None if r.value is None else r.value.decode()))
    return records


@pytest.mark.slow
def test_a_compacted_partition_moves_to_a_new_broker_through_a_snapshot(
    dmq_cluster: Callable[..., DmqCluster],
) -> None:
    cluster = dmq_cluster(
        3,
        extra_args=[
            "--raft-snapshot-entries", str(SNAPSHOT_ENTRIES),
            "--retention-check-interval-ms", "200",
        ],
    ).start_all()  # fmt: skip
    body = {
        "name": "kv",
        "partitions": 1,
        "replication_factor": 2,
        "config": {"cleanup_policy": "compact", "segment_bytes": 1024},
    }
    resp = retry(lambda: cluster["n1"].request("POST", "/v1/topics", body), timeout_s=30.0)
    assert resp.status == 201, resp
    [before_placement] = placements(cluster["n1"], "kv")
    [target_id] = [n for n in cluster.nodes if n not in before_placement]
    source = cluster[cluster.leader_of("kv", 0)]  # the replica the new one copies from
    target = cluster[target_id]
    group_id = cluster.group("kv", 0)["group_id"]

    latest: dict[str, str] = {}
    uniques: dict[str, str] = {}
    for k in range(UPDATES):
        update(source, "kv", k, f"v{k}")
        latest[HOT_KEYS[k % len(HOT_KEYS)]] = f"v{k}"
        if k % 2:
            uniques[f"unique-{k}"] = f"u{k}"
    source_journal = source.group_dir(group_id) / "journal"
    wait_for(
        lambda: (journal_indexes(source_journal) or (0, 0))[0] > SNAPSHOT_ENTRIES,
        30.0,
        "the source's Raft journal compacted (a snapshot replaces its prefix)",
    )
    # A last round supersedes every hot record below the snapshot's end; filler (keys of
    # its own, never superseded) closes the segments that hold the round, so compaction
    # cleans them on every replica.
    for j, key in enumerate(HOT_KEYS):
        produce(source, "kv", [{"key": key, "value": f"last-{j}", "partition": 0}])
        latest[key] = f"last-{j}"
    for j in range(8):
        value = f"f{j}-" + "x" * 300
        produce(source, "kv", [{"key": f"filler-{j}", "value": value, "partition": 0}])
        uniques[f"filler-{j}"] = value
    produced = UPDATES + len(uniques) + len(HOT_KEYS)

    def compacted() -> list[tuple[int, str | None, str | None]] | None:
        records = fetch_all(source, "kv", 0)
        hot = [r for r in records if r[1] in HOT_KEYS]
        return records if len(hot) == len(HOT_KEYS) else None

    before = wait_for(compacted, 30.0, "compaction keeping only the last round of hot keys")
    source_end = local_replica(source, "kv")["log_end_offset"]
    print(f"{len(before)} of {produced} records left; source log end {source_end}")

    # The new replica joins, the other follower leaves; the leader stays.
    replicas = [target_id, source.node_id]
    answer = source.json(
        "POST", "/v1/cluster/reassignments", {"topic": "kv", "partition": 0, "replicas": replicas}
    )
    assert answer["target"] == replicas
    wait_for(
        lambda: (
            sorted(placements(source, "kv")[0]) == sorted(replicas)
            and not operations(source)["reassignments"]
        ),
        60.0,
        "the reassignment done",
    )
    assert target.alive, f"{target_id} stopped:\n{target.log_tail()}"
    assert (target.group_dir(group_id) / "snapshot").exists(), "no snapshot installed"
    assert local_replica(target, "kv")["log_end_offset"] == source_end
    # The new replica applied the entries after the snapshot as they were written; its own
    # compaction (every 200 ms, closed segments only) then removes what they superseded.
    # Under load that takes a few rounds: wait for it rather than read the first state.
    after = wait_for(
        lambda: (read := local_read(target, "kv")) == before and read,
        30.0,
        "the new replica's compaction reaching the source's state",
    )
    assert after == before
    kept = {key: value for _, key, value in after if key is not None}
    assert {k: kept[k] for k in latest} == latest  # the last value of every key
    assert {k: kept[k] for k in uniques} == uniques  # unique keys are never removed
    assert len(after) == len(kept)  # and nothing else
    # New records land after the source's end on both replicas.
    [(_, offset)] = produce(source, "kv", [{"key": "after", "value": "a", "partition": 0}])
    assert offset == source_end
    wait_for(
        lambda: local_read(target, "kv")[-1] == (source_end, "after", "a"),
        15.0,
        "the new replica applying the next record",
    )
    assert all(node.alive for node in cluster.nodes.values())
