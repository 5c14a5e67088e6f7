"""Helpers of the Spark tests: produce known records, read a DataFrame back as plain tuples."""

from __future__ import annotations

import time
from typing import Any

from dmq.client import Admin, Producer

# (topic, partition, offset) -> (key, value, headers, timestamp_ms)
Produced = dict[tuple[str, int, int], tuple[bytes | None, bytes | None, tuple[Any, ...], int]]

COLUMNS = (
    "topic, partition, offset, key, value, headers, unix_millis(timestamp) AS ts, timestampType"
)


def produce(
    url: str,
    topic: str,
    count: int,
    *,
    partitions: int,
    first: int = 0,
    timestamp_ms: int | None = None,
    value_bytes: int = 0,
    one_batch_each: bool = False,
) -> Produced:
    """`count` records spread round the partitions: varied keys (some null), values (some
    empty, some tombstones), headers (some none) and increasing timestamps, 10 ms apart,
    from an hour ago by default (older ones would fall to the broker's 7-day retention).
    `one_batch_each` waits for each record before sending the next (one stored batch each)."""
    if timestamp_ms is None:
        timestamp_ms = int(time.time() * 1000) - 3_600_000
    sent = []
    with Producer(url, linger_ms=0) as producer:
        for i in range(first, first + count):
            key = None if i % 5 == 0 else f"key-{i % 7}".encode()
            value = None if i % 11 == 0 else (b"" if i % 13 == 0 else f"value-{i}".encode())
            if value and value_bytes:
                value = value.ljust(value_bytes, b".")
            headers = () if i % 3 else (("h", f"{i}".encode()), ("h", b""))
            ts = timestamp_ms + 10 * i
            future = producer.send(
                topic, value, key=key, headers=list(headers), partition=i % partitions,
                timestamp_ms=ts,
            )  # fmt: skip
            sent.append((future, key, value, headers, ts))
            if one_batch_each:
                future.result()
        producer.flush()
    produced: Produced = {}
    for future, key, value, headers, ts in sent:
        meta = future.result()
        assert meta.offset is not None
        produced[(meta.topic, meta.partition, meta.offset)] = (key, value, tuple(headers), ts)
    return produced


def select(df: Any) -> Any:
    """The columns `rows_of` needs, from a DataFrame in the dmq schema with headers."""
    return df.selectExpr(*COLUMNS.split(", "))


def rows(df: Any) -> Produced:
    """A DataFrame in the dmq schema (with headers) as the same mapping `produce` returns;
    fails on a record read twice."""
    return rows_of(select(df).collect())


def rows_of(collected: list[Any]) -> Produced:
    """Rows collected from `select(df)` as `produce`'s mapping; fails on a duplicate."""
    result: Produced = {}
    for r in collected:
        where = (r["topic"], r["partition"], r["offset"])
        assert where not in result, f"{where} read twice"
        assert r["timestampType"] == 0
        headers = tuple((h["key"], bytes(h["value"])) for h in r["headers"] or ())
        key = None if r["key"] is None else bytes(r["key"])
        value = None if r["value"] is None else bytes(r["value"])
        result[where] = (key, value, headers, r["ts"])
    return result


def create_topic(url: str, name: str, partitions: int, **config: Any) -> None:
    with Admin(url) as admin:
        admin.create_topic(name, partitions=partitions, config=config or None)


def wait_for(condition: Any, what: str, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)
