"""The Python client's transactions on one real broker: consume-transform-produce.

Proves: `Producer(url, transactional_id=...)` with `begin_transaction`, `send`,
`send_offsets_to_transaction(offsets, consumer)` and `commit_transaction` commits the
output records and the group's input offsets together, and `abort_transaction` neither;
a read_committed `Consumer` (the binary fetch, which filters the aborted ranges the
broker names) sees only committed output while a read_uncommitted one sees all of it;
each commit or abort moves the producer to the epoch the coordinator bumped to (its
sends of the next transaction go through with it); a second producer with the same
transactional id fences the first (`ProducerFenced`);
sending outside a transaction is a programming error.
"""

from __future__ import annotations

from typing import Any

import pytest

from dmq.client import Admin, Consumer, Producer
from dmq.client._transactions import offsets_of
from dmq.errors import ProducerFenced


def read_values(url: str, topic: str, isolation: str) -> list[bytes]:
    with Consumer(url, topic=topic, isolation=isolation) as consumer:  # type: ignore[arg-type]
        out: list[bytes] = []
        for _ in range(4):
            out += [r.value or b"" for r in consumer.poll(timeout_ms=200)]
        return out


def test_consume_transform_produce_commits_output_and_offsets_together(broker: Any) -> None:
    url = broker.url
    with Admin(url) as admin:
        admin.create_topic("in", partitions=1)
        admin.create_topic("out", partitions=2)
    with Producer(url) as plain:
        for i in range(6):
            plain.send("in", f"v{i}".encode(), partition=0)
    group = Consumer(url, group="etl", topics=["in"], auto_commit=False)
    producer = Producer(url, transactional_id="etl-1", linger_ms=0)
    try:
        with pytest.raises(RuntimeError, match="begin_transaction"):
            producer.send("out", b"x")
        polled: list[Any] = []
        for _ in range(50):
            polled += group.poll(timeout_ms=200)
            if len(polled) >= 6:
                break
        assert [r.value for r in polled] == [f"v{i}".encode() for i in range(6)]
        first, rest = polled[:3], polled[3:]
        # Transaction 1: transformed, committed with the input offsets.
        producer.begin_transaction()
        for r in first:
            producer.send("out", (r.value or b"").upper(), partition=r.offset % 2)
        producer.send_offsets_to_transaction(offsets_of(first), group)
        identity = producer.producer_identity()
        producer.commit_transaction()
        # The decision bumped the epoch: the producer goes on with the new one.
        assert producer.producer_identity() == (identity[0], identity[1] + 1)
        # Transaction 2: aborted; neither its output nor its offsets count.
        producer.begin_transaction()
        for r in rest:
            producer.send("out", b"aborted-" + (r.value or b""), partition=r.offset % 2)
        producer.send_offsets_to_transaction(offsets_of(rest), group)
        producer.abort_transaction()
        assert producer.producer_identity() == (identity[0], identity[1] + 2)
        committed = read_values(url, "out", "read_committed")
        assert sorted(committed) == [b"V0", b"V1", b"V2"]
        everything = read_values(url, "out", "read_uncommitted")
        assert len(everything) == 6 and sorted(committed) == sorted(
            v for v in everything if not v.startswith(b"aborted-")
        )
        status, doc = broker.json("GET", "/v1/groups/etl/offsets")
        assert status == 200 and doc["offsets"] == [{"topic": "in", "partition": 0, "offset": 3}]
        # A newer instance fences this one.
        with Producer(url, transactional_id="etl-1", linger_ms=0) as newer:
            newer.begin_transaction()
            producer.begin_transaction()
            future = producer.send("out", b"zombie", partition=0)
            with pytest.raises(ProducerFenced):
                future.result(30)
            newer.send("out", b"new", partition=1)
            newer.commit_transaction()
        assert sorted(read_values(url, "out", "read_committed")) == [b"V0", b"V1", b"V2", b"new"]
    finally:
        group.close()
        producer.close()
