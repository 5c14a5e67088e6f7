"""Retention says what it deleted, on a real broker process.

Proves: whenever retention deletes segments the broker logs one INFO line naming the
partition, how many segments, the offsets (how many records) and why: older than
retention_ms, or over retention_bytes; and the offsets it names are the ones a reader
can no longer fetch (416 with the new log start). Before, records vanished without a word.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable

from tests_support import BrokerProcess, wait_for

RETENTION_CHECK_INTERVAL_MS = 200


def _create(broker: BrokerProcess, name: str, config: dict[str, int]) -> None:
    body = {"name": name, "partitions": 1, "config": config}
    assert broker.json("POST", "/v1/topics", body)[0] == 201


def _line(broker: BrokerProcess, partition: str) -> str:
    for line in broker.log().splitlines():
        if "retention deleted" in line and f" of {partition}:" in line:
            return line
    return ""


def test_retention_logs_what_it_deleted_and_why(
    broker_factory: Callable[..., BrokerProcess],
) -> None:
    broker = broker_factory(
        extra_args=["--retention-check-interval-ms", str(RETENTION_CHECK_INTERVAL_MS)]
    ).start()
    _create(broker, "aged", {"retention_ms": 60_000})
    hour_ago_ms = int(time.time() * 1000) - 3_600_000
    old = {"records": [{"value": v, "timestamp": hour_ago_ms} for v in ("a", "b")]}
    assert broker.json("POST", "/v1/topics/aged/records", old)[0] == 200
    wait_for(lambda: _line(broker, "aged-0") != "", 30, "the retention line of aged-0")
    line = _line(broker, "aged-0")
    assert " INFO " in line, line
    assert (
        "retention deleted 1 segment of aged-0: offsets [0, 2) (2 records, fewer if "
        "compacted); 1 segment older than retention_ms (60000)"
    ) in line, line
    status, body = broker.json("GET", "/v1/topics/aged/partitions/0/records?offset=0")
    assert status == 416 and body["error"]["details"]["log_start_offset"] == 2, body

    _create(broker, "sized", {"segment_bytes": 1024, "retention_bytes": 2048})
    for i in range(12):  # about 300 bytes each: a segment rolls every few records
        one = {"records": [{"value": f"{i:03d}" + "x" * 300}]}
        assert broker.json("POST", "/v1/topics/sized/records", one)[0] == 200
    wait_for(lambda: _line(broker, "sized-0") != "", 30, "the retention line of sized-0")
    line = _line(broker, "sized-0")
    found = re.search(r"offsets \[0, (\d+)\)", line)
    assert found is not None and "over retention_bytes (2048)" in line, line
    assert "older than" not in line, line
    status, body = broker.json("GET", "/v1/topics/sized/partitions/0/records?offset=0")
    assert status == 416, body
    assert body["error"]["details"]["log_start_offset"] >= int(found.group(1)), (body, line)
