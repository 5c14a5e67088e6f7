"""Spark batch reads and writes of dmq topics, against a real broker and a local Spark.

Proves that `spark.read.format("dmq")` returns exactly what was produced (keys, values,
headers, offsets, timestamps) over several partitions, for every way of bounding the
range: earliest/latest, per-partition JSON offsets with -2/-1, timestamps, and split into
more tasks by minPartitions; that a DataFrame reused across queries counts right (no
filter pushdown to go stale); that a dead URL before a live one is skipped; that
topicPattern picks topics; that bad options fail with a message naming them; that a
DataFrame written with `df.write.format("dmq")` reads back exactly (written by
idempotent producers); and that the example
pipeline of spark_io/README.md runs as written and produces the per-key totals; and that
the exactly-once writer (`exactlyOnce=true`) commits each row once through the driver's
commit, while a job whose task fails shows read_committed readers nothing (its rows are
in the log, aborted), and leaves no transaction open; and that the reader reads
read_committed by default (aborted rows filtered), read_uncommitted when asked.
"""

from __future__ import annotations

import json
import re
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    IntegerType,
    StringType,
    StructField,
    StructType,
)

from log.records import iter_batches
from spark_support import Produced, create_topic, produce, rows
from tests_support import BrokerProcess, free_port

TOPIC = "events"
PARTITIONS = 3
COUNT = 240
README = Path(__file__).resolve().parents[2] / "spark_io" / "README.md"


@pytest.fixture(scope="module")
def events(dmq_broker: BrokerProcess) -> Produced:
    create_topic(dmq_broker.url, TOPIC, PARTITIONS)
    return produce(dmq_broker.url, TOPIC, COUNT, partitions=PARTITIONS)


def reader(spark: Any, url: str, **options: Any) -> Any:
    r = spark.read.format("dmq").option("url", url).option("includeHeaders", "true")
    for name, value in options.items():
        r = r.option(name, value)
    return r


def test_read_everything_equals_what_was_produced(
    spark: Any, dmq_broker: BrokerProcess, events: Produced
) -> None:
    df = reader(spark, dmq_broker.url, topic=TOPIC).load()

    assert rows(df) == events
    assert df.schema.simpleString() == (
        "struct<key:binary,value:binary,topic:string,partition:int,offset:bigint,"
        "timestamp:timestamp,timestampType:int,headers:array<struct<key:string,value:binary>>>"
    )
    # One task per topic partition.
    assert df.rdd.getNumPartitions() == PARTITIONS


def test_json_offsets_per_partition_bound_the_read(
    spark: Any, dmq_broker: BrokerProcess, events: Produced
) -> None:
    starting = {TOPIC: {"0": 5, "1": -2, "2": 17}}
    ending = {TOPIC: {"0": 40, "1": 3, "2": -1}}
    df = reader(
        spark, dmq_broker.url, topic=TOPIC,
        startingOffsets=json.dumps(starting), endingOffsets=json.dumps(ending),
    ).load()  # fmt: skip

    last = {p: max(o for (_, q, o) in events if q == p) + 1 for p in range(PARTITIONS)}
    bounds = {0: (5, 40), 1: (0, 3), 2: (17, last[2])}
    want = {k: v for k, v in events.items() if bounds[k[1]][0] <= k[2] < bounds[k[1]][1]}
    assert rows(df) == want
    assert len(want) == 35 + 3 + (last[2] - 17)


def test_latest_to_latest_is_empty_and_a_partition_left_out_takes_the_default(
    spark: Any, dmq_broker: BrokerProcess, events: Produced
) -> None:
    assert reader(spark, dmq_broker.url, topic=TOPIC, startingOffsets="latest").load().count() == 0
    df = reader(spark, dmq_broker.url, topic=TOPIC, endingOffsets=json.dumps({TOPIC: {"1": 2}}))
    assert rows(df.load()) == {k: v for k, v in events.items() if k[1] != 1 or k[2] < 2}


def test_timestamps_bound_the_read(spark: Any, dmq_broker: BrokerProcess, events: Produced) -> None:
    first = min(v[3] for v in events.values())
    start_ms, end_ms = first + 10 * 50 + 3, first + 10 * 150  # records 51..149
    df = reader(
        spark, dmq_broker.url, topic=TOPIC,
        startingTimestamp=str(start_ms), endingTimestamp=str(end_ms),
    ).load()  # fmt: skip

    want = {k: v for k, v in events.items() if start_ms <= v[3] < end_ms}
    assert len(want) == 99
    assert rows(df) == want


def test_min_partitions_splits_ranges_without_losing_or_repeating(
    spark: Any, dmq_broker: BrokerProcess, events: Produced
) -> None:
    df = reader(spark, dmq_broker.url, topic=TOPIC, minPartitions="8").load()

    assert df.rdd.getNumPartitions() >= 8
    assert rows(df) == events  # rows() fails on a record read twice


def test_a_dataframe_reused_across_queries_counts_right(
    spark: Any, dmq_broker: BrokerProcess, events: Produced
) -> None:
    # PySpark 4.3 keeps a reader's pushFilters state between queries of one DataFrame;
    # the dmq source pushes no filter, so Spark applies every filter itself each time.
    df = reader(spark, dmq_broker.url, topic=TOPIC).load()
    in_partition_1 = sum(1 for k in events if k[1] == 1)
    early = sum(1 for k in events if k[2] < 10)

    assert df.filter("partition = 1").count() == in_partition_1
    assert df.count() == COUNT
    assert df.filter("offset < 10").count() == early
    assert df.filter("partition = 1").count() == in_partition_1


def test_a_dead_url_is_skipped_and_topic_pattern_picks_topics(
    spark: Any, dmq_broker: BrokerProcess, events: Produced
) -> None:
    create_topic(dmq_broker.url, "events-small", 1)
    small = produce(dmq_broker.url, "events-small", 10, partitions=1)
    urls = f"http://127.0.0.1:{free_port()},{dmq_broker.url}"

    def read() -> Any:
        return spark.read.format("dmq").option("urls", urls).option("includeHeaders", "true")

    both = read().option("topicPattern", "events.*").load()
    assert rows(both) == {**events, **small}
    assert rows(read().option("topic", "events-small").load()) == small


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({}, "topic and topicPattern"),
        ({"topic": TOPIC, "startingOffsets": "{not json"}, "startingOffsets"),
        ({"topic": TOPIC, "endingOffsets": json.dumps({TOPIC: {"0": -2}})}, "endingOffsets"),
        ({"topic": TOPIC, "minPartitions": "0"}, "minPartitions must be at least 1"),
        (
            {"topic": TOPIC, "startingOffsets": json.dumps({TOPIC: {"0": 10**9}})},
            "beyond the high watermark",
        ),
        ({"topic": "no-such-topic"}, "no-such-topic"),
    ],
)
def test_bad_options_fail_with_a_message_naming_them(
    spark: Any, dmq_broker: BrokerProcess, events: Produced, options: dict[str, str],
    message: str,
) -> None:  # fmt: skip
    with pytest.raises(Exception, match=re.escape(message)):
        reader(spark, dmq_broker.url, **options).load().collect()


WRITE_SCHEMA = StructType(
    [
        StructField("key", BinaryType()),
        StructField("value", BinaryType()),
        StructField("partition", IntegerType()),
        StructField(
            "headers",
            ArrayType(
                StructType([StructField("key", StringType()), StructField("value", BinaryType())])
            ),
        ),
    ]
)


def test_write_then_read_round_trip_is_exact(spark: Any, dmq_broker: BrokerProcess) -> None:
    create_topic(dmq_broker.url, "written", 2)
    data = [
        (
            None if i % 4 == 0 else f"k{i}".encode(),
            None if i % 9 == 0 else bytes(range(i % 256)) * 3,
            i % 2,
            [("a", f"{i}".encode()), ("b", b"")] if i % 3 == 0 else None,
        )
        for i in range(500)
    ]
    df = spark.createDataFrame(data, WRITE_SCHEMA).repartition(3)

    df.write.format("dmq").option("url", dmq_broker.url).option("topic", "written").mode(
        "append"
    ).save()

    back = rows(reader(spark, dmq_broker.url, topic="written").load())
    got = sorted(
        (p, k or b"", v or b"", k is None, v is None, h) for (_, p, _), (k, v, h, _) in back.items()
    )
    want = sorted(
        (p, k or b"", v or b"", k is None, v is None, tuple(h or ())) for k, v, p, h in data
    )
    assert got == want
    for p in (0, 1):  # offsets are dense from 0 in each partition
        offsets = sorted(o for (_, q, o) in back if q == p)
        assert offsets == list(range(len(offsets)))
        # Written by idempotent producers: every stored batch carries a producer id and
        # sequence, so a produce request retried inside a task is not stored twice.
        url = f"{dmq_broker.url}/v1/topics/written/partitions/{p}/records?offset=0&format=binary"
        with urllib.request.urlopen(url) as answer:
            headers = [header for _, header in iter_batches(answer.read())]
        assert headers and all(h.producer_id >= 0 and h.base_sequence >= 0 for h in headers)


def test_string_columns_and_a_topic_column_route_rows(
    spark: Any, dmq_broker: BrokerProcess
) -> None:
    create_topic(dmq_broker.url, "left", 1)
    create_topic(dmq_broker.url, "right", 1)
    df = spark.createDataFrame(
        [("left" if i % 2 else "right", f"k{i}", f"v{i}") for i in range(40)],
        "topic string, key string, value string",
    )
    df.write.format("dmq").option("url", dmq_broker.url).mode("append").save()

    for topic, parity in (("left", 1), ("right", 0)):
        got = (
            reader(spark, dmq_broker.url, topic=topic)
            .load()
            .selectExpr("cast(key as string) k", "cast(value as string) v")
        )
        assert sorted((r.k, r.v) for r in got.collect()) == sorted(
            (f"k{i}", f"v{i}") for i in range(40) if i % 2 == parity
        )


def test_readme_pipeline_runs_and_writes_per_key_totals(
    spark: Any, dmq_broker: BrokerProcess
) -> None:
    text = README.read_text()
    code = text.split("<!-- pipeline -->")[1].split("```python")[1].split("```")[0]
    url = dmq_broker.url
    create_topic(url, "orders", 2)
    create_topic(url, "order-totals", 1)
    orders = produce(url, "orders", 120, partitions=2)

    exec(compile(code, str(README), "exec"), {"spark": spark, "url": url})

    totals = (
        reader(spark, url, topic="order-totals")
        .load()
        .selectExpr("cast(key as string) k", "cast(value as string) v")
    )
    got = {r.k: json.loads(r.v) for r in totals.collect()}
    want: dict[str | None, dict[str, int]] = {}
    for key, value, _, _ in orders.values():
        total = want.setdefault(None if key is None else key.decode(), {"orders": 0, "bytes": 0})
        total["orders"] += 1
        total["bytes"] += len(value or b"")
    assert got == want


# --- exactlyOnce: the writer's transactions (spark_io/_write.py) ----------------------


def eo_values(url: str, topic: str, isolation: str, partitions: int = 2) -> list[str]:
    out: list[str] = []
    for p in range(partitions):
        path = f"{url}/v1/topics/{topic}/partitions/{p}/records?offset=0&max_records=10000"
        with urllib.request.urlopen(f"{path}&isolation={isolation}") as answer:
            out += [r["value"] for r in json.loads(answer.read())["records"]]
    return sorted(out)


def open_transactions(url: str, settle_s: float = 10.0) -> list[str]:
    """The transactions still open after up to settle_s (markers are written after the
    decision, and the driver's abort of a cancelled task's transaction races its end);
    well below the 60 s transaction timeout, which would close them by itself."""
    deadline = time.monotonic() + settle_s
    while True:
        with urllib.request.urlopen(f"{url}/v1/transactions") as answer:
            doc = json.loads(answer.read())
        still = [t["transactional_id"] for t in doc["transactions"] if t["state"] in
                 ("ongoing", "prepare_commit", "prepare_abort")]  # fmt: skip
        if not still or time.monotonic() > deadline:
            return still
        time.sleep(0.2)


def test_each_row_is_committed_once_and_a_failed_job_shows_nothing(
    spark: Any, dmq_broker: BrokerProcess
) -> None:
    url = dmq_broker.url
    create_topic(url, "eo", 2)
    rows = [(f"k{i}", f"v{i}", i % 2) for i in range(200)]
    df = spark.createDataFrame(rows, "key string, value string, partition int").repartition(3)
    df.write.format("dmq").option("url", url).option("topic", "eo").option(
        "exactlyOnce", "true"
    ).mode("append").save()
    assert eo_values(url, "eo", "read_committed") == sorted(f"v{i}" for i in range(200))
    assert not open_transactions(url)

    # One task meets a row without a topic and fails; the job aborts the other's.
    bad = [("eo" if i != 57 else None, f"x{i}", i % 2) for i in range(100)]
    df = spark.createDataFrame(bad, "topic string, value string, partition int").repartition(2)
    with pytest.raises(Exception, match="null topic"):
        df.write.format("dmq").option("url", url).option("exactlyOnce", "true").mode(
            "append"
        ).save()
    assert eo_values(url, "eo", "read_committed") == sorted(f"v{i}" for i in range(200))
    assert any(v.startswith("x") for v in eo_values(url, "eo", "read_uncommitted"))
    assert not open_transactions(url)
    # spark_io's reader reads read_committed by default: the aborted rows are filtered.
    committed = reader(spark, url, topic="eo").load().selectExpr("cast(value as string) v")
    assert sorted(r.v for r in committed.collect()) == sorted(f"v{i}" for i in range(200))
    everything = reader(spark, url, topic="eo", isolation="read_uncommitted").load()
    seen = [r.v for r in everything.selectExpr("cast(value as string) v").collect()]
    assert len(seen) > 200 and any(v.startswith("x") for v in seen)

    with pytest.raises(Exception, match="exactlyOnce"):
        df.write.format("dmq").option("url", url).option("exactlyOnce", "maybe").mode(
            "append"
        ).save()
