"""The `tags` and `filter` options of the dmq source are pushed down to the broker: a
task's read (spark_io/_read.py, the code a Spark task runs, here without the JVM) against
a real broker yields only the matching records, at their own offsets, and stops at the
range's end; the options reach ReadOptions as the fetch's query parameters."""

from __future__ import annotations

from spark_io._options import read_options
from spark_io._plan import OffsetRange
from spark_io._read import read_range
from spark_io.source import arrow_schema, spark_schema
from tests_support import BrokerProcess


def test_a_task_reads_only_what_the_broker_keeps(dmq_broker: BrokerProcess) -> None:
    records = [{"key": f"k{i}", "value": str(i), "partition": 0,
                "headers": {"tag": "red" if i % 4 == 0 else "blue", "n": str(i)}}
               for i in range(200)]  # fmt: skip
    status, _ = dmq_broker.json("POST", "/v1/topics/pushdown/records", {"records": records})
    assert status == 200
    options = read_options(
        {"url": dmq_broker.url, "topic": "pushdown", "tags": "red", "filter": "n >= 40"},
        streaming=False,
    )
    assert options.record_filter == (("tags", "red"), ("filter", "n >= 40"))
    task = OffsetRange("pushdown", 0, 10, 150)
    batches = list(
        read_range(
            options.urls, task, arrow_schema(spark_schema(False)), fetch_bytes=1 << 20,
            include_headers=False, fail_on_data_loss=True, record_filter=options.record_filter,
        )
    )  # fmt: skip
    rows = [(r["offset"], r["value"]) for b in batches for r in b.to_pylist()]
    assert rows == [(i, str(i).encode()) for i in range(40, 150, 4)]
