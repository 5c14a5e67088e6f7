"""Delayed records on one real broker process: the CLI, the HTTP answers, the limits, a
restart with records pending.

Proves that `dmq produce --delay` schedules each line (printing its id), that nothing is
fetchable before its time and each record is after it, exactly once; that
`GET .../scheduled` counts pending records and names the next due time, a cancelled
record never arrives and a second cancel is a 404; that a delay over max_delay_ms, both
deliver_at and delay_ms, and acks other than all are 400s naming the field; and that
records still pending when the broker stops are delivered after it restarts. And that an
idempotent producer's delayed produce retried (the same producer_id, epoch and
base_sequence) is answered with the first one's ids and delivered once, while one with
delay_ms instead of deliver_at is a 400.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.request
from typing import Any

from log.records import Record, encode_batch
from tests_support import ROOT, BrokerProcess, wait_for


def call(broker: BrokerProcess, method: str, path: str, body: dict[str, Any] | None = None,
         expect: int = 200) -> Any:  # fmt: skip
    status, doc = broker.json(method, path, body)
    assert status == expect, (method, path, status, doc)
    return doc


def values(broker: BrokerProcess, topic: str) -> list[str]:
    doc = call(broker, "GET", f"/v1/topics/{topic}/partitions/0/records?max_records=1000")
    return [r["value"] for r in doc["records"]]


def test_cli_count_cancel_limits_and_restart(broker_factory: Any) -> None:
    broker = broker_factory(extra_args=[
        "--max-delay-ms", "60000", "--batch-bytes-max", "65536", "--record-bytes-max", "65536",
    ]).start()  # fmt: skip
    call(broker, "POST", "/v1/topics", {"name": "d", "partitions": 1}, expect=201)
    before_ms = time.time() * 1000
    cli = subprocess.run(
        [sys.executable, "-m", "dmq", "--url", broker.url, "produce", "d", "--delay", "1500ms"],
        input=b"one\ntwo\nthree\n", capture_output=True, cwd=ROOT, timeout=30,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )  # fmt: skip
    assert cli.returncode == 0, cli.stderr
    answers = [json.loads(line) for line in cli.stdout.decode().splitlines()]
    assert [a["offset"] for a in answers] == [None] * 3
    assert all(before_ms + 1500 <= a["deliver_at"] <= time.time() * 1000 + 1500 for a in answers)
    summary = call(broker, "GET", "/v1/topics/d/scheduled")
    assert summary["count"] == 3 and summary["next_deliver_at"] == answers[0]["deliver_at"]
    call(broker, "DELETE", f"/v1/topics/d/scheduled/{answers[1]['id']}")
    assert call(broker, "GET", "/v1/topics/d/scheduled")["count"] == 2
    doc = call(broker, "DELETE", f"/v1/topics/d/scheduled/{answers[1]['id']}", expect=404)
    assert doc["error"]["details"]["field"] == "id"
    assert values(broker, "d") == []  # nothing before its time
    while time.time() * 1000 < answers[2]["deliver_at"] + 3000 and len(values(broker, "d")) < 2:
        time.sleep(0.05)
    assert time.time() * 1000 >= answers[2]["deliver_at"]
    assert values(broker, "d") == ["one", "three"]
    assert call(broker, "GET", "/v1/topics/d/scheduled")["count"] == 0

    # Limits and bad input: 400 naming the field.
    doc = call(broker, "POST", "/v1/topics/d/records",
               {"records": [{"value": "x", "delay_ms": 60_001}]}, expect=400)  # fmt: skip
    assert doc["error"]["details"] == {"field": "records[0].delay_ms", "limit": 60_000}
    doc = call(broker, "POST", "/v1/topics/d/records",
               {"records": [{"value": "x", "delay_ms": 1, "deliver_at": 1}]}, expect=400)  # fmt: skip
    assert doc["error"]["details"]["field"] == "records[0].delay_ms"
    doc = call(broker, "POST", "/v1/topics/d/records?acks=1&delay_ms=1000",
               {"records": [{"value": "x"}]}, expect=400)  # fmt: skip
    assert doc["error"]["details"]["field"] == "acks"
    doc = call(broker, "DELETE", "/v1/topics/d/scheduled/nonsense", expect=400)
    assert doc["error"]["details"]["field"] == "id"

    # A binary batch with X-Dmq-Delay-Ms; and 200 KB of delayed records in one request,
    # more than one Raft entry holds (batch_bytes_max 64 KiB): scheduled in several.
    batch = encode_batch([Record(None, b"bin-%d" % i, (), 0) for i in range(3)])
    req = urllib.request.Request(
        f"{broker.url}/v1/topics/b/records?partition=0", data=batch, method="POST",
        headers={"Content-Type": "application/vnd.dmq.batch", "X-Dmq-Delay-Ms": "300"},
    )  # fmt: skip
    with urllib.request.urlopen(req, timeout=30) as resp:
        assert [a["offset"] for a in json.loads(resp.read())["offsets"]] == [None] * 3
    big = [{"value": f"{i:04d}" + "x" * 2000, "partition": 0, "delay_ms": 300} for i in range(100)]
    answers = call(broker, "POST", "/v1/topics/big/records", {"records": big})["offsets"]
    assert len({a["id"] for a in answers}) == 100
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and (
        len(values(broker, "b")) < 3 or len(values(broker, "big")) < 100
    ):
        time.sleep(0.05)
    assert values(broker, "b") == ["bin-0", "bin-1", "bin-2"]
    assert [v[:4] for v in values(broker, "big")] == [f"{i:04d}" for i in range(100)]

    # Pending across a restart: delivered after it, once. Due well after the restart (a
    # loaded run once took longer than 2.5 s to restart, and the record was out already).
    deliver_at = int(time.time() * 1000) + 8000
    call(broker, "POST", "/v1/topics/d/records",
         {"records": [{"value": "after", "deliver_at": deliver_at}]})  # fmt: skip
    broker.stop()
    broker.start()
    assert call(broker, "GET", "/v1/topics/d/scheduled")["count"] == 1
    while time.time() * 1000 < deliver_at + 5000 and "after" not in values(broker, "d"):
        time.sleep(0.05)
    assert time.time() * 1000 >= deliver_at
    assert values(broker, "d") == ["one", "three", "after"]


def test_an_idempotent_delayed_produce_retried_is_scheduled_once(broker: BrokerProcess) -> None:
    call(broker, "POST", "/v1/topics", {"name": "idd", "partitions": 2}, expect=201)
    producer = call(broker, "POST", "/v1/producers", {}, expect=201)
    at = int(time.time() * 1000) + 1_500
    body = {**producer, "base_sequence": 0,
            "records": [{"value": "a", "deliver_at": at}, {"value": "b", "deliver_at": at + 1}]}  # fmt: skip
    path = "/v1/topics/idd/records?partition=1"
    first = call(broker, "POST", path, body)
    assert [o["offset"] for o in first["offsets"]] == [None, None]
    assert call(broker, "POST", path, body) == first  # a retry after a timeout
    assert call(broker, "GET", "/v1/topics/idd/scheduled")["count"] == 2
    relative = {**producer, "base_sequence": 2, "records": [{"value": "c", "delay_ms": 100}]}
    doc = call(broker, "POST", path, relative, expect=400)
    assert doc["error"]["details"]["field"] == "records[0].deliver_at"
    deadline = time.monotonic() + 20
    got: list[str] = []
    while time.monotonic() < deadline and len(got) < 2:
        doc = call(broker, "GET", "/v1/topics/idd/partitions/1/records?wait_ms=500")
        got = [r["value"] for r in doc["records"]]
    assert time.time() * 1000 >= at and got == ["a", "b"]
    assert call(broker, "POST", path, body) == first  # still recognised once delivered
    time.sleep(0.3)
    doc = call(broker, "GET", "/v1/topics/idd/partitions/1/records?wait_ms=0")
    assert [r["value"] for r in doc["records"]] == ["a", "b"]


def delay_partitions(broker: BrokerProcess) -> float:
    """The broker's dmq_delay_partitions gauge."""
    status, _, body = broker.request("GET", "/metrics")
    assert status == 200
    for line in body.decode().splitlines():
        if line.startswith("dmq_delay_partitions "):
            return float(line.split()[1])
    raise AssertionError("no dmq_delay_partitions in /metrics")


def test_the_release_duty_looks_only_at_partitions_holding_records(broker_factory: Any) -> None:
    """The release duty looks at the replicas whose store holds records, not at every
    replica every 50 ms (dmq/broker/delay.py): with 16 partitions and one delayed record,
    one; after a kill -9 and a restart, the store's record found at open, still one,
    and the record released at its time; none once it is."""
    broker = broker_factory().start()
    call(broker, "POST", "/v1/topics", {"name": "q", "partitions": 16}, expect=201)
    call(broker, "POST", "/v1/topics/q/records?partition=3", {"records": [{"value": "now"}]})
    assert delay_partitions(broker) == 0
    deliver_at = int(time.time() * 1000) + 8000
    call(broker, "POST", "/v1/topics/q/records?partition=5",
         {"records": [{"value": "later", "deliver_at": deliver_at}]})  # fmt: skip
    assert delay_partitions(broker) == 1
    broker.kill9()
    broker.start()
    assert call(broker, "GET", "/v1/topics/q/scheduled")["count"] == 1
    assert delay_partitions(broker) == 1
    assert time.time() * 1000 < deliver_at, "the restart took longer than the delay: no proof"

    def released() -> bool:
        doc = call(broker, "GET", "/v1/topics/q/partitions/5/records?max_records=10")
        return [r["value"] for r in doc["records"]] == ["later"]

    wait_for(released, 15, "the delayed record")
    assert time.time() * 1000 >= deliver_at
    wait_for(lambda: delay_partitions(broker) == 0, 5, "the emptied store to leave the registry")
    assert call(broker, "GET", "/v1/topics/q/scheduled")["count"] == 0
