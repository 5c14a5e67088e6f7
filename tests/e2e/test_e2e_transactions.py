"""Transactions end to end on one real broker process, over raw HTTP.

Proves: a transaction over three partitions is invisible to read_committed until it
commits and then visible in every partition at once (read_uncommitted sees it at once);
an aborted one is never visible to read_committed, and read_committed stops at the last
stable offset while a transaction is open (the group fetch too); markers are never
served; a new instance of
the transactional id fences the old one and aborts its open transaction; transactional
offsets commit only with the transaction; bad input is a 4xx naming the field, and
changes nothing; all of it holds after kill -9 and a restart (the partition's open and
aborted transactions are stored with its producer state); a commit answered at the
decision (`"wait": "decision"`) is followed by the next transaction's produce, which
lands after the markers. Each commit or abort bumps the producer's epoch (KIP-890 part
2): the answer names the next transaction's producer id and epoch, a retry of the
decision with the old epoch gets the same answer, and a produce with the old epoch is
refused (`producer_fenced`).
"""

from __future__ import annotations

import time
from typing import Any

from tests_support import BrokerProcess

TOPIC = "tx"


def call(broker: BrokerProcess, method: str, path: str, body: Any = None, expect: int = 200) -> Any:
    status, doc = broker.json(method, path, body)
    assert status == expect, (method, path, body, status, doc)
    return doc


def produce(broker: BrokerProcess, tid: str, producer: dict[str, int], partition: int, seq: int,
            values: list[str], expect: int = 200) -> Any:  # fmt: skip
    body = {**producer, "base_sequence": seq, "records": [{"value": v} for v in values]}
    path = f"/v1/topics/{TOPIC}/records?partition={partition}&transactional_id={tid}"
    return call(broker, "POST", path, body, expect)


def following(answer: dict[str, Any]) -> dict[str, int]:
    """The producer identity a commit or abort answer names for the next transaction."""
    return {
        "producer_id": answer["next_producer_id"],
        "producer_epoch": answer["next_producer_epoch"],
    }


def read(broker: BrokerProcess, partition: int, isolation: str) -> tuple[list[str], Any]:
    doc = call(
        broker, "GET",
        f"/v1/topics/{TOPIC}/partitions/{partition}/records?offset=0&isolation={isolation}",
    )  # fmt: skip
    return [r["value"] for r in doc["records"]], doc


def group_offsets(broker: BrokerProcess) -> list[dict[str, Any]]:
    status, doc = broker.json("GET", "/v1/groups/g1/offsets")
    assert status in (200, 404), doc
    return [] if status == 404 else list(doc["offsets"])


def committed_view(broker: BrokerProcess) -> list[list[str]]:
    return [read(broker, p, "read_committed")[0] for p in range(3)]


def test_commit_abort_fence_and_offsets_on_one_broker(broker_factory: Any) -> None:
    broker = broker_factory().start()
    call(broker, "POST", "/v1/topics", {"name": TOPIC, "partitions": 3}, 201)
    p = call(broker, "POST", "/v1/producers", {"transactional_id": "t1"}, 201)
    for part in range(3):
        produce(broker, "t1", p, part, 0, [f"a{part}"])
    assert committed_view(broker) == [[], [], []]
    values, doc = read(broker, 0, "read_uncommitted")
    assert values == ["a0"] and doc["last_stable_offset"] == 0
    listed = call(broker, "GET", "/v1/transactions")["transactions"]
    assert [(t["transactional_id"], t["state"]) for t in listed] == [("t1", "ongoing")]
    assert listed[0]["partitions"] == [f"{TOPIC}:0", f"{TOPIC}:1", f"{TOPIC}:2"]
    done = call(broker, "POST", "/v1/transactions/t1/commit", {k: p[k] for k in p})
    assert done["state"] == "complete_commit"
    q = following(done)  # the epoch bumped with the decision
    assert q == {"producer_id": p["producer_id"], "producer_epoch": p["producer_epoch"] + 1}
    assert committed_view(broker) == [["a0"], ["a1"], ["a2"]]
    # A commit again is a retry of the same decision (the same next epoch); an abort now
    # is another state; a produce with the old epoch is fenced.
    again = call(broker, "POST", "/v1/transactions/t1/commit", p)
    assert again["state"] == "complete_commit" and following(again) == q
    doc = call(broker, "POST", "/v1/transactions/t1/abort", p, 409)
    assert doc["error"]["code"] == "invalid_txn_state"
    doc = produce(broker, "t1", p, 0, 1, ["late"], expect=409)
    assert doc["error"]["code"] == "producer_fenced"

    # Aborted: never visible to read_committed; read_uncommitted saw it. The new epoch
    # starts its sequences over.
    produce(broker, "t1", q, 0, 0, ["b0"])
    produce(broker, "t1", q, 1, 0, ["b1"])
    doc = call(broker, "POST", "/v1/transactions/t1/abort", q)
    assert doc["state"] == "complete_abort"
    q = following(doc)
    assert committed_view(broker) == [["a0"], ["a1"], ["a2"]]
    assert read(broker, 0, "read_uncommitted")[0] == ["a0", "b0"]

    # An open transaction holds read_committed back at its first offset (the LSO), even
    # for records written after it by plain producers.
    first = produce(broker, "t1", q, 0, 0, ["c0"])["offsets"][0]["offset"]
    call(
        broker, "POST", f"/v1/topics/{TOPIC}/records?partition=0", {"records": [{"value": "plain"}]}
    )
    values, doc = read(broker, 0, "read_committed")
    assert values == ["a0"] and doc["last_stable_offset"] == first
    # The group fetch takes the same isolation.
    member = call(broker, "POST", "/v1/groups/readers/members", {"topics": [TOPIC]}, 201)
    path = f"/v1/groups/readers/members/{member['member_id']}/records?isolation=read_committed"
    parts = call(broker, "GET", path)["partitions"]
    assert sorted(r["value"] for p in parts for r in p["records"]) == ["a0", "a1", "a2"]
    call(broker, "DELETE", f"/v1/groups/readers/members/{member['member_id']}", None, 204)

    # A new instance fences the old one and aborts its open transaction.
    p2 = call(broker, "POST", "/v1/producers", {"transactional_id": "t1"}, 201)
    assert p2["producer_epoch"] == q["producer_epoch"] + 1
    doc = produce(broker, "t1", q, 1, 0, ["zombie"], expect=409)
    assert doc["error"]["code"] == "producer_fenced"
    deadline = time.monotonic() + 10
    while read(broker, 0, "read_committed")[0] != ["a0", "plain"]:
        assert time.monotonic() < deadline, read(broker, 0, "read_committed")
        time.sleep(0.05)
    assert call(broker, "GET", "/v1/transactions/t1")["state"] == "complete_abort"

    # Bad input: each a 4xx naming what is wrong, nothing changed.
    doc = call(
        broker, "POST", "/v1/transactions/nope/commit", {"producer_id": 1, "producer_epoch": 0}, 404
    )
    assert doc["error"]["code"] == "transaction_not_found"
    doc = call(broker, "POST", "/v1/transactions/t1/commit", p, 409)
    assert doc["error"]["code"] == "producer_fenced"
    doc = call(broker, "POST", "/v1/transactions/t1/commit", p2, 409)
    assert doc["error"]["code"] == "invalid_txn_state"
    doc = call(broker, "GET", f"/v1/topics/{TOPIC}/partitions/0/records?isolation=dirty", None, 400)
    assert doc["error"]["details"]["field"] == "isolation"

    # Transactional offsets: committed with the transaction only.
    offsets = {**p2, "group": "g1", "offsets": [{"topic": TOPIC, "partition": 0, "offset": 2}]}
    produce(broker, "t1", p2, 2, 0, ["d2"])
    call(broker, "POST", "/v1/transactions/t1/offsets", offsets)
    p3 = following(call(broker, "POST", "/v1/transactions/t1/abort", p2))
    assert group_offsets(broker) == []
    call(broker, "POST", "/v1/transactions/t1/offsets", {**offsets, **p3})
    produce(broker, "t1", p3, 2, 0, ["e2"])
    p4 = following(call(broker, "POST", "/v1/transactions/t1/commit", p3))
    assert committed_view(broker) == [["a0", "plain"], ["a1"], ["a2", "e2"]]
    assert group_offsets(broker) == [{"topic": TOPIC, "partition": 0, "offset": 2}]

    broker.kill9()
    broker.start()
    assert committed_view(broker) == [["a0", "plain"], ["a1"], ["a2", "e2"]]
    first = produce(broker, "t1", p4, 1, 0, ["f1"])["offsets"][0]["offset"]
    assert read(broker, 1, "read_committed")[1]["last_stable_offset"] == first
    assert read(broker, 1, "read_uncommitted")[0] == ["a1", "b1", "f1"]

    # Answered once the decision is durable; the next transaction's produce waits on the
    # broker for the markers (its add queued behind them) and lands after them.
    doc = call(broker, "POST", "/v1/transactions/t1/commit", {**p4, "wait": "decision"})
    assert doc["state"] in ("prepare_commit", "complete_commit")
    p5 = following(doc)
    produce(broker, "t1", p5, 1, 0, ["g1"])
    call(broker, "POST", "/v1/transactions/t1/abort", p5)
    assert read(broker, 1, "read_committed")[0] == ["a1", "f1"]
    doc = call(broker, "POST", "/v1/transactions/t1/commit", {**p5, "wait": "soon"}, 400)
    assert doc["error"]["details"]["field"] == "wait"


def test_an_idle_transactional_id_is_forgotten_with_its_transaction(broker_factory: Any) -> None:
    """After --transactional-id-expiration-ms unused, the id and its transaction record go
    (before ExpireTransactions the record stayed listed, and counted against
    transactional_ids_max, for ever); an open transaction keeps its id; both hold after
    kill -9 and a replay; the id then starts again at a new producer id."""
    broker = broker_factory(extra_args=["--transactional-id-expiration-ms", "1500"]).start()
    call(broker, "POST", "/v1/topics", {"name": TOPIC, "partitions": 1}, 201)
    old = call(broker, "POST", "/v1/producers", {"transactional_id": "old"}, 201)
    produce(broker, "old", old, 0, 0, ["a"])
    call(broker, "POST", "/v1/transactions/old/commit", old)
    busy = call(broker, "POST", "/v1/producers", {"transactional_id": "busy"}, 201)
    produce(broker, "busy", busy, 0, 0, ["b"])  # left open, within its 60 s timeout

    def listed() -> list[tuple[str, str]]:
        doc = call(broker, "GET", "/v1/transactions")
        return [(t["transactional_id"], t["state"]) for t in doc["transactions"]]

    assert listed() == [("busy", "ongoing"), ("old", "complete_commit")]
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and len(listed()) > 1:
        time.sleep(0.2)
    assert listed() == [("busy", "ongoing")]
    broker.kill9()
    broker.start()
    assert listed() == [("busy", "ongoing")]
    again = call(broker, "POST", "/v1/producers", {"transactional_id": "old"}, 201)
    assert again["producer_id"] not in (old["producer_id"], busy["producer_id"])
    assert again["producer_epoch"] == 0
