"""Bit rot in a closed segment (issue #23's disk faults): refused loudly, never served.

A real `dmq serve`, real segment files changed under it, real HTTP:

- one bit flipped inside a stored record (covered by the batch's CRC-32C): a JSON fetch
  from before the batch answers the records up to it (as a Kafka consumer gets the
  records before a corrupt batch); one from the batch answers 500 `storage_error` naming
  the file and the position; the binary path sends the batch as stored and the
  Python consumer refuses it (StorageError), handing out none of its records; the
  records after it are served; the broker log names the file; after kill -9 and a
  restart the batch is refused again (no index rebuilt over it);
- one bit flipped in a closed segment's batch length: the broker refuses to start and
  says which file and position, rather than serve a log it cannot walk.

Refused, not repaired (log/README.md, "Stored corruption"): on a replicated topic the
other replicas keep serving the partition; healing this replica from them is not built.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from dmq import Consumer
from dmq.errors import StorageError
from tests_support import BrokerProcess

VALUE_PAD = "x" * 300  # ~375-byte batches, ~10 to a 4 KiB segment


def batch_spans(segment: Path) -> list[tuple[int, int]]:
    """(start, end) of every batch in a segment file: base_offset (8 bytes), then the
    batch length (4 bytes, big-endian) counting what follows it."""
    data = segment.read_bytes()
    spans, position = [], 0
    while position < len(data):
        length = int.from_bytes(data[position + 8 : position + 12], "big")
        spans.append((position, position + 12 + length))
        position += 12 + length
    return spans


def flip_bit(path: Path, position: int, mask: int) -> None:
    data = bytearray(path.read_bytes())
    data[position] ^= mask
    path.write_bytes(bytes(data))


def fetch(broker: BrokerProcess, offset: int, max_records: int = 10) -> tuple[int, Any]:
    path = f"/v1/topics/rot/partitions/0/records?offset={offset}&max_records={max_records}"
    status, body = broker.json("GET", path)
    return status, body


def test_a_flipped_bit_in_a_closed_segment_is_refused_loudly_and_never_served(
    broker_factory: Any,
) -> None:
    broker: BrokerProcess = broker_factory("n1").start()
    status, _ = broker.json(
        "POST",
        "/v1/topics",
        {"name": "rot", "partitions": 1, "config": {"segment_bytes": 4096}},
    )
    assert status == 201
    produced = [f"value-{i}-{VALUE_PAD}" for i in range(40)]
    for value in produced:  # one batch each
        status, _ = broker.json("POST", "/v1/topics/rot/records", {"records": [{"value": value}]})
        assert status == 200
    segments = sorted((broker.data_dir / "partitions" / "rot-0").glob("*.log"))
    assert len(segments) >= 3, segments
    closed = segments[1]  # neither the first nor the active one
    base = int(closed.stem)
    spans = batch_spans(closed)
    start, end = spans[2]
    target = base + 2  # the record of the third batch
    flip_bit(closed, (start + end) // 2, 0x01)  # inside its value

    status, body = fetch(broker, base)  # max_records 10: up to the damaged batch
    assert status == 200, body
    assert [r["value"] for r in body["records"]] == produced[base:target]
    assert body["next_offset"] == target

    def refused() -> None:
        status, body = fetch(broker, target)
        assert status == 500, body
        assert body["error"]["code"] == "storage_error"
        assert closed.name in body["error"]["message"]
        assert f"position {start}" in body["error"]["message"]
        assert "CRC" in body["error"]["message"]

    refused()
    with Consumer(broker.url) as consumer:
        consumer.assign([("rot", 0)])
        consumer.seek("rot", 0, target)
        with pytest.raises(StorageError, match="CRC"):
            for _ in range(20):
                for record in consumer.poll(timeout_ms=200):
                    assert record.value == produced[record.offset].encode()
    status, body = fetch(broker, target + 1)
    assert status == 200, body
    assert body["records"][0]["value"] == produced[target + 1]
    assert "storage error" in broker.log() and closed.name in broker.log()

    broker.kill9()
    broker.start()
    refused()

    # A flipped high bit of a batch length in another closed segment: the batch would run
    # past the end of the file, so the segment cannot be walked; the broker says so at start.
    broker.kill9()
    other = segments[0]
    length_at = batch_spans(other)[1][0] + 8
    flip_bit(other, length_at, 0x40)
    with pytest.raises(RuntimeError, match="exited") as stopped:
        broker.start()
    assert other.name in str(stopped.value)
    assert f"position {length_at - 8}" in str(stopped.value)
