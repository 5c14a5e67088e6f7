"""Spark streaming reads and writes of dmq topics, and data loss, against a real broker.

Proves that a streaming query with maxOffsetsPerTrigger keeps every micro-batch within the
limit and, stopped and restarted from its checkpoint, sees every record exactly once,
including the records of partitions added while it was stopped; that a streaming query
writing to dmq copies a topic exactly; and that records removed by retention before they
were read fail a batch or streaming query with failOnDataLoss=true (the message says how
to go on) and are skipped with failOnDataLoss=false, the query reading what is left.
"""

from __future__ import annotations

import shutil
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from dmq.client import Admin
from spark_support import create_topic, produce, rows, rows_of, select, wait_for
from tests_support import BrokerProcess

# Run by test_streaming.py in a fresh interpreter (see there); alone: pytest this file.
pytestmark = pytest.mark.timeout(300, method="thread")

LIMIT = 100
# A query stalled in processAllAvailable is stopped and run again from its checkpoint
# (the restart this module proves exactly-once across); batches are kept by batch id, as
# Spark replays an uncommitted batch with the same id.
STALL_S = 90.0
ATTEMPTS = 2


def run_stream(
    spark: Any, url: str, topic: str, checkpoint: Path, **options: str
) -> list[list[Any]]:
    """Run a query until it has read everything, then stop it; returns the rows of each
    micro-batch. The sink is foreachBatch into this list: Spark's memory sink cannot
    restart from a checkpoint in append mode."""
    reader = spark.readStream.format("dmq").option("url", url).option("topic", topic)
    for key, value in {"includeHeaders": "true", **options}.items():
        reader = reader.option(key, value)
    batches: dict[int, list[Any]] = {}

    def collect(batch: Any, batch_id: int) -> None:
        batches[batch_id] = select(batch).collect()

    for attempt in range(1, ATTEMPTS + 1):
        query = (
            reader.load()
            .writeStream.foreachBatch(collect)
            .option("checkpointLocation", str(checkpoint))
            .start()
        )
        failure: list[BaseException] = []

        def drain(query: Any = query, failure: list[BaseException] = failure) -> None:
            try:
                query.processAllAvailable()
            except BaseException as e:  # re-raised on the test's thread
                failure.append(e)

        waiter = threading.Thread(target=drain, daemon=True)
        waiter.start()
        waiter.join(STALL_S)
        stalled = waiter.is_alive()
        if stalled:
            print(f"attempt {attempt}: stalled {STALL_S} s; last progress {query.lastProgress}")
        query.stop()
        waiter.join(30)
        if not stalled:
            if failure:
                raise failure[0]
            return [batches[k] for k in sorted(batches) if batches[k]]
    pytest.fail(f"the query stalled {ATTEMPTS} times for {STALL_S} s")


def test_every_record_once_across_a_restart_with_new_partitions(
    spark: Any, dmq_broker: BrokerProcess, tmp_path: Path
) -> None:
    url, checkpoint = dmq_broker.url, tmp_path / "checkpoint"
    create_topic(url, "stream", 2)
    produced = produce(url, "stream", 250, partitions=2)
    options = {"startingOffsets": "earliest", "maxOffsetsPerTrigger": str(LIMIT)}

    first = run_stream(spark, url, "stream", checkpoint, **options)

    assert len(first) >= 3 and max(len(b) for b in first) <= LIMIT
    produced |= produce(url, "stream", 100, partitions=2, first=250)
    with Admin(url) as admin:
        admin.add_partitions("stream", 3)
    produced |= produce(url, "stream", 60, partitions=3, first=350)
    assert any(p == 2 for (_, p, _) in produced)

    second = run_stream(spark, url, "stream", checkpoint, **options)

    assert max(len(b) for b in second) <= LIMIT
    seen = [row for batch in first + second for row in batch]
    assert rows_of(seen) == produced  # rows_of() fails on a record seen twice


def test_a_streaming_query_copies_a_topic_to_another(
    spark: Any, dmq_broker: BrokerProcess, tmp_path: Path
) -> None:
    url = dmq_broker.url
    create_topic(url, "copy-from", 2)
    create_topic(url, "copy-to", 1)
    produced = produce(url, "copy-from", 150, partitions=2)
    query = (
        spark.readStream.format("dmq").option("url", url).option("topic", "copy-from")
        .option("startingOffsets", "earliest").option("maxOffsetsPerTrigger", "60")
        .option("includeHeaders", "true").load()
        .select("key", "value", "headers")
        .writeStream.format("dmq").option("url", url).option("topic", "copy-to")
        .option("checkpointLocation", str(tmp_path / "copy")).start()
    )  # fmt: skip
    try:
        query.processAllAvailable()
    finally:
        query.stop()

    copied = rows(spark.read.format("dmq").option("url", url).option("topic", "copy-to")
                  .option("includeHeaders", "true").load())  # fmt: skip
    assert Counter(v[:3] for v in copied.values()) == Counter(v[:3] for v in produced.values())


def lose_records(url: str, topic: str, count: int) -> int:
    """Produce `count` records of ~300 bytes in small segments, then cap the partition at
    ~2 KiB: retention removes the oldest segments. Returns the new log_start_offset, once
    it has stayed put for a second (five retention rounds): the first round that moves it
    need not be the last (a full run saw 21, then 36)."""
    with Admin(url) as admin:
        before = admin.offsets(topic, 0).high_watermark
        produce(url, topic, count, partitions=1, first=before, value_bytes=300, one_batch_each=True)
        admin.alter_config(topic, {"retention_bytes": 2048})
        seen = {"start": -1, "since": time.monotonic()}

        def settled() -> bool:
            start = admin.offsets(topic, 0).log_start_offset
            if start != seen["start"]:
                seen["start"], seen["since"] = start, time.monotonic()
            return start > before and time.monotonic() - seen["since"] >= 1.0

        wait_for(settled, "retention")
        return admin.offsets(topic, 0).log_start_offset


def test_batch_read_of_removed_records_fails_or_skips(
    spark: Any, dmq_broker: BrokerProcess
) -> None:
    url = dmq_broker.url
    create_topic(url, "lossy", 1, segment_bytes=1024)
    start = lose_records(url, "lossy", 40)
    from_zero = (
        spark.read.format("dmq").option("url", url).option("topic", "lossy")
        .option("startingOffsets", '{"lossy": {"0": 0}}')
    )  # fmt: skip

    with pytest.raises(Exception, match='set the option failOnDataLoss to "false"'):
        from_zero.load().collect()
    got = [r.offset for r in from_zero.option("failOnDataLoss", "false").load().collect()]
    assert sorted(got) == list(range(start, 40))


def test_streaming_read_of_removed_records_fails_or_skips(
    spark: Any, dmq_broker: BrokerProcess, tmp_path: Path
) -> None:
    url, checkpoint = dmq_broker.url, tmp_path / "lossy-stream"
    create_topic(url, "lossy-stream", 1, segment_bytes=1024)
    produce(url, "lossy-stream", 5, partitions=1, value_bytes=300, one_batch_each=True)
    first = run_stream(spark, url, "lossy-stream", checkpoint, startingOffsets="earliest")
    assert sum(len(b) for b in first) == 5
    start = lose_records(url, "lossy-stream", 40)
    assert start > 5
    shutil.copytree(checkpoint, tmp_path / "copy")

    with pytest.raises(Exception, match="failOnDataLoss"):
        run_stream(spark, url, "lossy-stream", checkpoint)
    rest = run_stream(spark, url, "lossy-stream", tmp_path / "copy", failOnDataLoss="false")

    got = sorted(r.offset for batch in rest for r in batch)
    assert got == list(range(start, 45))
