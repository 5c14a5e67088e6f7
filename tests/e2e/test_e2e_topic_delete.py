"""Deleting a topic under its live consumers, on a real broker process.

Proves: a fetch long-polling on a partition when its topic is deleted answers 404
topic_not_found, as a fetch that arrives after the delete, under every encoding (JSON,
NDJSON, binary batches), within a fraction of its wait_ms, never 500; and a `dmq consume
--group --follow` process goes on through the delete, as Kafka's group consumers do: it
does not exit, prints no internal error, and prints the records of the topic created
again under the same name.
"""

from __future__ import annotations

import json
import queue
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from typing import IO

import pytest

from tests_support import BrokerProcess, wait_for

WAIT_MS = 20_000  # the fetch's wait: the delete must end it long before


def _fetch(url: str, accept: str | None, out: dict[str, object]) -> None:
    req = urllib.request.Request(f"{url}/v1/topics/events/partitions/0/records?wait_ms={WAIT_MS}")
    if accept is not None:
        req.add_header("Accept", accept)
    started = time.monotonic()
    try:
        with urllib.request.urlopen(req, timeout=60) as resp:
            out["status"], out["body"] = resp.status, resp.read()
    except urllib.error.HTTPError as err:
        out["status"], out["body"] = err.code, err.read()
    out["elapsed_s"] = time.monotonic() - started


@pytest.mark.parametrize("accept", [None, "application/x-ndjson", "application/vnd.dmq.batches"])
def test_a_waiting_fetch_answers_topic_not_found_when_its_topic_is_deleted(
    broker: BrokerProcess, accept: str | None
) -> None:
    assert broker.json("POST", "/v1/topics", {"name": "events", "partitions": 1})[0] == 201
    out: dict[str, object] = {}
    fetcher = threading.Thread(target=_fetch, args=(broker.url, accept, out))
    fetcher.start()
    wait_for(lambda: _waiting_fetches(broker) == 1, 10, "the fetch to park")
    assert broker.request("DELETE", "/v1/topics/events")[0] == 200
    fetcher.join(60)
    assert out["status"] == 404, out
    assert json.loads(out["body"])["error"]["code"] == "topic_not_found"  # type: ignore[arg-type]
    assert out["elapsed_s"] < WAIT_MS / 1000 / 2, out  # ended by the delete, not the wait
    # The same answer as a fetch that comes after the delete.
    assert broker.request("GET", "/v1/topics/events/partitions/0/records")[0] == 404
    assert "AssertionError" not in broker.log()


def _waiting_fetches(broker: BrokerProcess) -> int:
    _, _, body = broker.request("GET", "/metrics")
    for line in body.decode().splitlines():
        if line.startswith("dmq_fetch_waiting "):
            return int(float(line.split()[1]))
    raise AssertionError("no dmq_fetch_waiting metric")


def _lines(stream: IO[str], into: queue.Queue[str]) -> None:
    for line in stream:
        into.put(line.rstrip("\n"))


def _next_line(lines: queue.Queue[str], timeout_s: float) -> str:
    try:
        return lines.get(timeout=timeout_s)
    except queue.Empty:
        raise AssertionError(f"no line printed in {timeout_s} s") from None


def test_a_group_consumer_goes_on_through_a_topic_delete(broker: BrokerProcess) -> None:
    assert broker.json("POST", "/v1/topics", {"name": "events", "partitions": 1})[0] == 201
    consumer = subprocess.Popen(
        [sys.executable, "-m", "dmq", "--url", broker.url,
         "consume", "events", "--group", "live", "--follow"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    lines: queue.Queue[str] = queue.Queue()
    assert consumer.stdout is not None
    threading.Thread(target=_lines, args=(consumer.stdout, lines), daemon=True).start()
    try:
        produce = {"records": [{"value": "before"}]}
        assert broker.json("POST", "/v1/topics/events/records", produce)[0] == 200
        assert _next_line(lines, 30) == "before"
        assert broker.request("DELETE", "/v1/topics/events")[0] == 200
        time.sleep(3)  # long enough for its parked fetch to be answered and the next one
        assert consumer.poll() is None, consumer.communicate(timeout=10)
        assert broker.json("POST", "/v1/topics", {"name": "events", "partitions": 1})[0] == 201
        produce = {"records": [{"value": "after"}]}
        assert broker.json("POST", "/v1/topics/events/records", produce)[0] == 200
        assert _next_line(lines, 30) == "after"
    finally:
        consumer.terminate()
        _, err = consumer.communicate(timeout=30)
    assert "internal_error" not in err, err
    assert "AssertionError" not in broker.log()
