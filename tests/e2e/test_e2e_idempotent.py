"""Idempotent producers end to end on a real broker process, over raw HTTP.

Proves that POST /v1/producers allocates ids from the metadata group (the same
transactional id: the same id, epoch + 1); that a retried batch (same producer id, epoch
and sequences) is answered with its original offsets and not written again; that a gap
in the sequence is refused with 409 out_of_order_sequence and an old epoch with 409
producer_fenced; that all of this holds after the broker is killed with SIGKILL and
restarted (the producer state is stored with the applied checkpoint); and that an idempotent JSON
produce spread over two partitions is refused with a 400 naming producer_id; and that
the Python idempotent producer puts a keyed record on its key's partition even when it
is the first record of a topic the broker creates on the spot.
"""

from __future__ import annotations

from typing import Any

from dmq.client import Producer
from dmq.partitioner import partition_for_key
from tests_support import BrokerProcess


def call(broker: BrokerProcess, path: str, body: dict[str, Any], expect: int) -> Any:
    status, doc = broker.json("POST", path, body)
    assert status == expect, (path, body, status, doc)
    return doc


def send(broker: BrokerProcess, producer: dict[str, int], seq: int, values: list[str],
         expect: int = 200) -> Any:  # fmt: skip
    body = {**producer, "base_sequence": seq, "records": [{"value": v} for v in values]}
    return call(broker, "/v1/topics/idem/records?partition=1", body, expect)


def records(broker: BrokerProcess) -> list[str]:
    status, doc = broker.json("GET", "/v1/topics/idem/partitions/1/records?offset=0")
    assert status == 200, doc
    return [r["value"] for r in doc["records"]]


def test_retries_are_written_once_and_fencing_holds_across_a_kill(broker_factory: Any) -> None:
    broker = broker_factory().start()
    call(broker, "/v1/topics", {"name": "idem", "partitions": 2}, 201)
    first = call(broker, "/v1/producers", {"transactional_id": "billing"}, 201)
    assert first["producer_epoch"] == 0
    other = call(broker, "/v1/producers", {}, 201)
    assert other["producer_id"] != first["producer_id"]
    ok = send(broker, first, 0, ["a", "b"])
    assert send(broker, first, 0, ["a", "b"]) == ok  # a retry: same offsets
    send(broker, first, 2, ["c"])
    doc = send(broker, first, 4, ["e"], expect=409)
    assert doc["error"]["code"] == "out_of_order_sequence"
    assert records(broker) == ["a", "b", "c"]

    broker.kill9()
    broker.start()
    assert send(broker, first, 2, ["c"])["offsets"] == [{"partition": 1, "offset": 2}]
    assert send(broker, first, 0, ["a", "b"]) == ok
    assert send(broker, first, 4, ["e"], expect=409)["error"]["code"] == "out_of_order_sequence"
    assert records(broker) == ["a", "b", "c"]

    second = call(broker, "/v1/producers", {"transactional_id": "billing"}, 201)
    assert (second["producer_id"], second["producer_epoch"]) == (first["producer_id"], 1)
    send(broker, second, 0, ["d"])
    assert send(broker, first, 3, ["x"], expect=409)["error"]["code"] == "producer_fenced"
    assert records(broker) == ["a", "b", "c", "d"]
    body = {**second, "base_sequence": 1, "records": [{"value": "p0", "partition": 0},
                                                      {"value": "p1", "partition": 1}]}  # fmt: skip
    doc = call(broker, "/v1/topics/idem/records", body, 400)
    assert doc["error"]["details"]["field"] == "producer_id"


def test_idempotent_keyed_first_record_of_a_new_topic_goes_to_its_key_partition(
    broker_factory: Any,
) -> None:
    broker = broker_factory(extra_args=["--default-partitions", "4"]).start()
    keys = [b"k%d" % i for i in range(12)]
    with Producer(broker.url, idempotent=True) as producer:
        first = producer.send("fresh", b"v0", key=keys[0]).result(30)  # auto-creates it
        rest = [producer.send("fresh", b"v", key=k).result(30) for k in keys[1:]]
        again = producer.send("fresh", b"v1", key=keys[0]).result(30)
    assert first.partition == partition_for_key(keys[0], 4) == again.partition
    assert [m.partition for m in rest] == [partition_for_key(k, 4) for k in keys[1:]]
    between = sum(1 for m in rest if m.partition == first.partition)
    assert again.offset == first.offset + 1 + between  # each sequence there was accepted
