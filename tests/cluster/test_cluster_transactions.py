"""A transaction over three partitions on three real brokers, with the transaction
coordinator's leader (the metadata group's) killed with SIGKILL after the decision to
commit is durable and before any marker is written (`DMQ_TXN_MARKER_DELAY_MS` opens that
window). Proves: the new metadata leader finds the prepared transaction and completes it;
read_committed readers (the Python client's, polling every partition through a broker
that stays up) never see part of the transaction, nor any of it before the commit, and
see all of it after; a read_uncommitted reader sees the records at once; the producer,
re-created with the same transactional id afterwards, fences nothing it should not and
commits again.
"""

from __future__ import annotations

import threading
import time
from typing import Any

from cluster_harness import DmqCluster, wait_for

from dmq.client import Consumer, Producer

TOPIC = "txn"
PER_PARTITION = 20


def read_all(url: str, isolation: str) -> dict[int, list[bytes]]:
    with Consumer(url, isolation=isolation) as consumer:  # type: ignore[arg-type]
        consumer.assign([(TOPIC, p) for p in range(3)])
        out: dict[int, list[bytes]] = {0: [], 1: [], 2: []}
        for record in consumer.poll(timeout_ms=300):
            out[record.partition].append(record.value or b"")
        for _ in range(3):
            for record in consumer.poll(timeout_ms=100):
                out[record.partition].append(record.value or b"")
        return out


def test_a_prepared_commit_survives_the_coordinator_leader_kill(dmq_cluster: Any) -> None:
    cluster: DmqCluster = dmq_cluster(3, env={"DMQ_TXN_MARKER_DELAY_MS": "2000"}).start_all()
    cluster.create_topic(TOPIC, 3, 3)
    leader = cluster.metadata_leader()
    survivor = cluster.any_live(exclude=[leader])
    seen: list[dict[int, int]] = []
    stop = threading.Event()

    def watch() -> None:  # a read_committed reader polling every partition all along
        while not stop.is_set():
            counts = {p: len(v) for p, v in read_all(survivor.url, "read_committed").items()}
            seen.append(counts)

    producer = Producer(survivor.url, transactional_id="t1", linger_ms=0)
    producer.begin_transaction()
    for p in range(3):
        for i in range(PER_PARTITION):
            producer.send(TOPIC, f"{p}-{i}".encode(), partition=p)
    producer.flush()
    uncommitted = read_all(survivor.url, "read_uncommitted")
    assert [len(uncommitted[p]) for p in range(3)] == [PER_PARTITION] * 3
    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    outcome: list[BaseException | None] = []

    def commit() -> None:
        try:
            producer.commit_transaction()
            outcome.append(None)
        except BaseException as error:  # noqa: BLE001 - reported below
            outcome.append(error)

    committer = threading.Thread(target=commit, daemon=True)
    committer.start()

    def state() -> str | None:
        resp = survivor.request("GET", "/v1/transactions/t1")
        return resp.json().get("state") if resp.status == 200 else None

    wait_for(lambda: state() == "prepare_commit", 20, "the decision to commit")
    cluster.kill9(leader)  # the decision is durable, no marker is written yet
    assert all(counts == {0: 0, 1: 0, 2: 0} for counts in seen), seen
    wait_for(lambda: state() == "complete_commit", 60, "the new leader completes it")
    assert cluster.metadata_leader() != leader
    committed = read_all(survivor.url, "read_committed")
    assert committed == {p: [f"{p}-{i}".encode() for i in range(PER_PARTITION)] for p in range(3)}
    stop.set()
    watcher.join(30)
    committer.join(60)
    # Never part of it: each poll of the reader saw each partition empty or complete (the
    # partitions are read one after the other, so a poll may straddle the markers).
    assert seen and all(c in (0, PER_PARTITION) for counts in seen for c in counts.values())
    assert outcome and (outcome[0] is None or "Timeout" in type(outcome[0]).__name__), outcome
    producer.close()

    cluster.restart(leader)
    with Producer(survivor.url, transactional_id="t1", linger_ms=0) as again:
        again.begin_transaction()
        again.send(TOPIC, b"second", partition=0)
        again.commit_transaction()
    deadline = time.monotonic() + 20
    while read_all(survivor.url, "read_committed")[0][-1:] != [b"second"]:
        assert time.monotonic() < deadline
        time.sleep(0.1)


def _committed_values(url: str) -> list[bytes | None]:
    with Consumer(url, isolation="read_committed") as consumer:
        consumer.assign([("trim", 0)])
        values = [r.value for r in consumer.poll(timeout_ms=1000)]
        for _ in range(3):
            values += [r.value for r in consumer.poll(timeout_ms=200)]
        return values


def _stored_transactions(node: Any, topic: str) -> dict[str, Any]:
    """The partition's transaction state as this replica stored it (`raft-producers`)."""
    from dmq.partition.machine import PRODUCER_STATE, _read_producer_state

    stored = _read_producer_state(node.partition_dir(topic, 0) / PRODUCER_STATE)
    assert stored is not None
    return stored[3].to_doc()


def test_the_aborted_list_shrinks_on_every_replica_once_retention_moves_the_start(
    dmq_cluster: Any,
) -> None:
    """Aborted transactions on a partition of 3 replicas, then retention (1 s, small
    segments) moves each replica's log start past them: the leader proposes a trim and
    every replica's stored list ends empty, with the same horizon; read_committed still
    returns the records left, none of the aborted ones, after a restart of all."""
    cluster: DmqCluster = dmq_cluster(
        3, extra_args=["--retention-check-interval-ms", "200"]
    ).start_all()
    node = cluster.any_live()
    body = {"name": "trim", "partitions": 1, "replication_factor": 3,
            "config": {"segment_bytes": 1024, "retention_ms": 1500}}  # fmt: skip
    assert node.request("POST", "/v1/topics", body).status == 201
    cluster.leader_of("trim", 0)
    producer = Producer(node.url, transactional_id="trim", linger_ms=0)
    for i in range(6):
        producer.begin_transaction()
        producer.send("trim", b"x" * 700, partition=0)
        producer.flush()
        if i % 2:
            producer.commit_transaction()
        else:
            producer.abort_transaction()
    producer.close()
    assert _committed_values(node.url) == [b"x" * 700] * 3
    time.sleep(2.0)  # every record expires; the next records stay
    with Producer(node.url, linger_ms=0) as plain:
        plain.send("trim", b"kept", partition=0)
        plain.flush()

    def trimmed() -> bool:
        leader = cluster[cluster.leader_of("trim", 0)]
        doc = leader.json("GET", "/v1/topics/trim")
        return bool(doc["partitions"][0].get("log_start_offset"))

    wait_for(trimmed, timeout_s=20, what="retention moves the log start")
    time.sleep(1.5)  # a few upkeep rounds: the leader proposes the trim
    for n in cluster.live():
        assert n.proc is not None
        n.proc.terminate()  # a clean stop stores the state
        n.proc.wait(15)
    stored = [_stored_transactions(n, "trim") for n in cluster.nodes.values()]
    assert all(s["aborted"] == [] and "kept" not in s for s in stored), stored
    assert len({s.get("horizon") for s in stored}) == 1 and stored[0]["horizon"] > 0, stored
    cluster.start_all()
    url = cluster.any_live().url
    with Producer(url, linger_ms=0) as plain:
        plain.send("trim", b"after", partition=0)
        plain.flush()
    values = _committed_values(url)  # "kept" may have expired meanwhile
    assert values in ([b"kept", b"after"], [b"after"]), values
