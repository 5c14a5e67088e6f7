"""A data directory written by an earlier dmq opens unchanged and serves what it held.

The fixture `data/datadir-145193a.tar.gz` was written by a single broker built from commit
145193a, before the code moved into its current packages (the script beside it says how):
a topic `orders` (3 partitions, ten keyed records with headers), a compacted topic
`profiles`, an idempotent producer id, and a group `workers` with a committed offset. A real
`dmq serve` of today's code starts on a copy of it and must answer with all of it, and go on
taking writes at the next offsets.
"""

from __future__ import annotations

import tarfile
from pathlib import Path
from typing import Any

from tests_support import BrokerProcess

FIXTURE = Path(__file__).parent / "data" / "datadir-145193a.tar.gz"


def _records(broker: BrokerProcess, topic: str, partition: int) -> list[dict[str, Any]]:
    status, body = broker.json("GET", f"/v1/topics/{topic}/partitions/{partition}/records?offset=0")
    assert status == 200, body
    return list(body["records"])


def test_a_data_dir_from_before_the_move_serves_its_records_groups_and_producers(
    tmp_path: Path,
) -> None:
    data_dir = tmp_path / "data"
    data_dir.mkdir()
    with tarfile.open(FIXTURE) as archive:
        archive.extractall(data_dir, filter="data")
    broker = BrokerProcess(data_dir).start()
    try:
        status, body = broker.json("GET", "/v1/topics")
        assert status == 200
        assert sorted(t["name"] for t in body["topics"]) == ["orders", "profiles"]

        orders = [r for p in range(3) for r in _records(broker, "orders", p)]
        assert sorted((r["key"], r["value"]) for r in orders) == [
            (f"k{i}", f"v{i}") for i in range(10)
        ]
        for r in orders:
            i = int(r["key"][1:])
            assert r["timestamp"] == 1700000000000 + i
            assert r["headers"] == [{"key": "h", "value": f"x{i}"}]
        assert [(r["offset"], r["value"]) for r in _records(broker, "profiles", 0)] == [
            (0, "1"),
            (1, "2"),
        ]

        status, body = broker.json("GET", "/v1/groups/workers/offsets")
        assert status == 200
        assert body["offsets"] == [{"topic": "orders", "partition": 0, "offset": 2}]

        # The producer id 0 was handed out before: the next one is 1, never 0 again.
        status, body = broker.json("POST", "/v1/producers", {})
        assert status == 201, body
        assert body["producer_id"] == 1

        status, body = broker.json(
            "POST", "/v1/topics/orders/records?partition=0", {"records": [{"value": "after"}]}
        )
        assert status == 200, body
        assert body["offsets"] == [{"partition": 0, "offset": 2}]
    finally:
        broker.stop()
