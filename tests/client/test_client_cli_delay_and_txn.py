"""`dmq delay list|cancel` and `dmq txn describe|abort`, run as the real command against a
real broker process.

Proves:
- the schedule ids `dmq produce --delay` prints cancel with `dmq delay cancel`; `dmq delay
  list` counts what waits per partition (table and `--output json`, the API's answer),
  and a cancelled id cannot be cancelled twice (an error naming it, exit 1);
- `dmq txn describe` shows an open transaction (ongoing, its partition); `dmq txn abort`
  aborts it with the transaction's own producer id and epoch: a read_committed consumer
  never prints its record, its producer is fenced, and a second abort is refused saying
  the transaction is no longer ongoing.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from dmq.client import Producer
from dmq.errors import DmqError
from tests_support import BrokerProcess


def dmq(
    broker: BrokerProcess, *argv: str, stdin: str | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "dmq", "--url", broker.url, *argv],
        input=stdin, capture_output=True, text=True, timeout=60,
    )  # fmt: skip


def test_delayed_records_are_listed_and_cancelled_by_the_ids_produce_printed(
    broker: BrokerProcess,
) -> None:
    assert broker.json("POST", "/v1/topics", {"name": "later", "partitions": 2})[0] == 201
    produced = dmq(broker, "produce", "later", "--partition", "1", "--delay", "1h", stdin="a\nb\n")
    assert produced.returncode == 0, produced
    ids = [json.loads(line)["id"] for line in produced.stdout.splitlines()]
    assert len(ids) == 2, produced.stdout
    table = dmq(broker, "delay", "list", "later")
    assert table.returncode == 0, table
    lines = table.stdout.splitlines()
    assert lines[0].split() == ["PARTITION", "SCHEDULED", "NEXT-DELIVER-AT"], lines
    assert [line.split()[:2] for line in lines[1:]] == [["0", "0"], ["1", "2"]], lines
    assert lines[1].split()[2] == "-" and lines[2].split()[2].endswith("Z"), lines
    assert "2 records scheduled in later" in table.stderr

    cancelled = dmq(broker, "delay", "cancel", "later", ids[0])
    assert cancelled.returncode == 0 and f"cancelled {ids[0]}" in cancelled.stderr, cancelled
    doc = json.loads(dmq(broker, "delay", "list", "later", "--output", "json").stdout)
    assert doc["count"] == 1 and doc["partitions"][1]["count"] == 1, doc
    again = dmq(broker, "delay", "cancel", "later", ids[0])
    assert again.returncode == 1, again
    assert "error: not_found:" in again.stderr and ids[0] in again.stderr, again.stderr


def test_an_open_transaction_is_described_and_aborted(broker: BrokerProcess) -> None:
    assert broker.json("POST", "/v1/topics", {"name": "t", "partitions": 1})[0] == 201
    producer = Producer(broker.url, transactional_id="left-open", linger_ms=0)
    try:
        producer.begin_transaction()
        producer.send("t", b"never-read", partition=0).result(30)
        described = dmq(broker, "txn", "describe", "left-open")
        assert described.returncode == 0, described
        head, row = described.stdout.splitlines()
        assert head.split()[:2] == ["TRANSACTIONAL-ID", "STATE"], head
        assert row.split()[:2] == ["left-open", "ongoing"] and "t:0" in row, row

        aborted = dmq(broker, "txn", "abort", "left-open", "--output", "json")
        assert aborted.returncode == 0, aborted
        assert json.loads(aborted.stdout)["state"] in ("prepare_abort", "complete_abort")
        assert dmq(broker, "consume", "t").stdout == ""  # read_committed: not the record
        state = json.loads(dmq(broker, "txn", "describe", "left-open", "--output", "json").stdout)
        assert state["state"] in ("prepare_abort", "complete_abort"), state
        with pytest.raises(DmqError):  # fenced: its epoch was bumped by the abort
            producer.commit_transaction()
    finally:
        producer.close()
    refused = dmq(broker, "txn", "abort", "left-open")
    assert refused.returncode == 1, refused
    assert "is complete_abort, not ongoing: nothing to abort" in refused.stderr, refused.stderr
