"""Broker-side filtering end to end: one real broker process, raw HTTP (what curl sends).

Proves that:
- `tags=` and `filter=` answer exactly the records that match, in offset order, over a
  partition fetch; paging with a small max_records visits every match once, and each
  answer's next_offset is past the records the filter skipped;
- a long-poll with a filter is not ended by records that do not match: it answers the
  first matching record committed during its wait;
- the scan budget (filter_scan_bytes_max) bounds one fetch: a fetch over a long run of
  non-matching records answers with next_offset part-way, and the next fetches go on
  from there to the high watermark;
- a group fetch takes the same filter, and reports the position past skipped records
  (committed with auto_commit), so the group never scans them again;
- a malformed filter is a 400 naming the parameter and the column; a filtered fetch in
  the binary format answers the kept records as one batch with their own offsets.
"""

from __future__ import annotations

import os
import threading
import time
import urllib.parse
from typing import Any

from log.records import decode_batch
from tests_support import BrokerProcess

SCAN_BUDGET_BYTES = 64 * 1024


def call(broker: BrokerProcess, method: str, path: str, body: dict[str, Any] | None = None,
         expect: int = 200) -> Any:  # fmt: skip
    status, doc = broker.json(method, path, body)
    assert status == expect, (method, path, status, doc)
    return doc


def produce(broker: BrokerProcess, topic: str, first: int, count: int, tag_every: int = 10,
            value: str = "v") -> None:  # fmt: skip
    records = [
        {
            "key": f"k{i}",
            "value": value,
            "partition": 0,
            "headers": {"n": str(i), **({"tag": "red"} if i % tag_every == 0 else {})},
        }
        for i in range(first, first + count)
    ]
    call(broker, "POST", f"/v1/topics/{topic}/records", {"records": records})


def fetch(broker: BrokerProcess, topic: str, expect: int = 200, **query: Any) -> Any:
    qs = urllib.parse.urlencode(query)
    return call(broker, "GET", f"/v1/topics/{topic}/partitions/0/records?{qs}", expect=expect)


def keys(doc: dict[str, Any]) -> list[str]:
    return [r["key"] for r in doc["records"]]


def test_filtered_fetches_long_polls_budget_and_errors(broker_factory: Any) -> None:
    broker = broker_factory(extra_args=["--filter-scan-bytes-max", str(SCAN_BUDGET_BYTES)]).start()
    call(broker, "POST", "/v1/topics", {"name": "t", "partitions": 1}, expect=201)
    produce(broker, "t", 0, 300)

    doc = fetch(broker, "t", tags="red", max_records=1000)
    assert keys(doc) == [f"k{i}" for i in range(0, 300, 10)]
    assert doc["next_offset"] == 300
    doc = fetch(broker, "t", filter="n >= 100 AND n < 120 AND $key LIKE 'k11%'")
    assert keys(doc) == [f"k{i}" for i in range(110, 120)]

    # Paging: every match once, in order; next_offset always past what was skipped.
    seen: list[str] = []
    offset = 0
    while offset < 300:
        doc = fetch(broker, "t", filter="tag = 'red' AND n > 50", offset=offset, max_records=4)
        seen += keys(doc)
        assert doc["next_offset"] > offset
        offset = doc["next_offset"]
    assert seen == [f"k{i}" for i in range(60, 300, 10)]

    # A long-poll is not ended by records that do not match.
    answer: dict[str, Any] = {}

    def long_poll() -> None:
        start = time.monotonic()
        answer["doc"] = fetch(broker, "t", filter="n = 9999", offset=300, wait_ms=10_000)
        answer["elapsed_s"] = time.monotonic() - start

    poller = threading.Thread(target=long_poll)
    poller.start()
    time.sleep(0.3)
    produce(broker, "t", 300, 200, tag_every=10**9)  # none match
    time.sleep(0.7)
    assert poller.is_alive()
    produce(broker, "t", 9999, 1)
    poller.join(15)
    assert keys(answer["doc"]) == ["k9999"]
    assert answer["doc"]["next_offset"] == 501
    assert 1.0 <= answer["elapsed_s"] < 9.0

    # The scan budget bounds one fetch; the next ones go on from where it stopped.
    for first in range(10_000, 11_000, 100):  # ten batches of ~23 KB
        produce(broker, "t", first, 100, tag_every=10**9, value=os.urandom(100).hex())
    end = 1501
    offset, answers = 501, 0
    while offset < end:
        doc = fetch(broker, "t", filter="n = -1", offset=offset)
        assert doc["records"] == [] and offset < doc["next_offset"] <= end
        offset = doc["next_offset"]
        answers += 1
    assert answers >= 3  # 230 KB of batches cannot be read within one 64 KiB budget

    # Bad input: the parameter and the column.
    doc = fetch(broker, "t", filter="n >= 1 AND", expect=400)
    assert doc["error"]["details"]["field"] == "filter"
    assert doc["error"]["details"]["column"] == 11
    assert "column 11" in doc["error"]["message"]
    doc = fetch(broker, "t", tags="a,,b", expect=400)
    assert doc["error"]["details"]["field"] == "tags"

    # Binary: the kept records as one batch, with their own offsets and next_offset.
    query = urllib.parse.urlencode({"filter": "n >= 100 AND n < 300 AND tag = 'red'",
                                    "format": "binary", "offset": 5})  # fmt: skip
    status, headers, body = broker.request("GET", f"/v1/topics/t/partitions/0/records?{query}")
    assert status == 200 and int(headers["X-Dmq-Next-Offset"]) > 300
    batch = decode_batch(body)
    assert [(r.offset, r.key) for r in batch.records] == [
        (i, f"k{i}".encode()) for i in range(100, 300, 10)
    ]
    doc = fetch(broker, "t", filter="x" * 5000, expect=400)
    assert doc["error"]["details"] == {"field": "filter", "column": 4097, "limit": 4096}


def test_group_fetch_filters_and_commits_past_skipped_records(broker: BrokerProcess) -> None:
    call(broker, "POST", "/v1/topics", {"name": "g", "partitions": 1}, expect=201)
    produce(broker, "g", 0, 100)
    member = call(broker, "POST", "/v1/groups/grp/members", {"topics": ["g"]}, expect=201)
    path = f"/v1/groups/grp/members/{member['member_id']}/records"

    doc = call(broker, "GET", f"{path}?tags=red&wait_ms=2000&auto_commit=true")
    (part,) = doc["partitions"]
    assert [r["key"] for r in part["records"]] == [f"k{i}" for i in range(0, 100, 10)]
    assert part["next_offset"] == 100
    assert call(broker, "GET", "/v1/groups/grp/offsets")["offsets"][0]["offset"] == 100

    produce(broker, "g", 100, 50, tag_every=10**9)  # nothing matches
    doc = call(broker, "GET", f"{path}?tags=red&wait_ms=300&auto_commit=true")
    (part,) = doc["partitions"]
    assert part["records"] == [] and part["next_offset"] == 150  # skipped, and committed
    assert call(broker, "GET", "/v1/groups/grp/offsets")["offsets"][0]["offset"] == 150

    doc = call(broker, "GET", f"{path}?filter=n%20IN%20(", expect=400)
    assert doc["error"]["details"]["field"] == "filter"
