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
