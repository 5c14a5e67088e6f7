"""Behaviour under concurrency and shutdown, on a real broker process.

Proves: requests racing a topic config change get 200 or a retriable 503, never a
500; a long-poll parked when SIGTERM arrives is answered (200, no records) rather
than failed; `?value_encoding=base64` applies to JSON bodies that do not say.
"""

from __future__ import annotations

import base64
import json
import threading
import time
from typing import Any

from tests_support import BrokerProcess


def test_requests_racing_config_changes_never_get_a_500(broker: BrokerProcess) -> None:
    broker.json("POST", "/v1/topics", {"name": "t", "partitions": 2})
    statuses: list[int] = []
    stop = threading.Event()

    def produce() -> None:
        while not stop.is_set():
            status, _ = broker.json(
                "POST", "/v1/topics/t/records", {"records": [{"value": "x", "partition": 1}]}
            )
            statuses.append(status)
            status, _ = broker.json("GET", "/v1/topics/t")
            statuses.append(status)

    threads = [threading.Thread(target=produce) for _ in range(3)]
    for t in threads:
        t.start()
    try:
        for i in range(8):
            status, _ = broker.json(
                "PATCH", "/v1/topics/t/config", {"config": {"retention_ms": 100000 + i}}
            )
            assert status == 200
    finally:
        stop.set()
        for t in threads:
            t.join(30)
    assert statuses and set(statuses) <= {200, 503}, sorted(set(statuses))
    assert "Traceback" not in broker.log()


def test_a_parked_long_poll_is_answered_at_shutdown(broker: BrokerProcess) -> None:
    broker.json("POST", "/v1/topics", {"name": "t", "partitions": 1})
    result: dict[str, Any] = {}

    def fetch() -> None:
        status, body = broker.json(
            "GET", "/v1/topics/t/partitions/0/records?offset=0&wait_ms=20000"
        )
        result["status"], result["body"] = status, body

    thread = threading.Thread(target=fetch)
    thread.start()
    time.sleep(0.5)
    assert broker.stop() == 0
    thread.join(30)
    assert result["status"] == 200
    assert result["body"]["records"] == [] and result["body"]["next_offset"] == 0


def test_query_value_encoding_applies_to_a_json_body(broker: BrokerProcess) -> None:
    body = json.dumps({"records": [{"value": base64.b64encode(b"\x00hello").decode()}]}).encode()
    status, _ = broker.json("POST", "/v1/topics/b/records?value_encoding=base64", body)
    assert status == 200
    _, got = broker.json("GET", "/v1/topics/b/partitions/0/records?value_encoding=base64")
    assert base64.b64decode(got["records"][0]["value"]) == b"\x00hello"
