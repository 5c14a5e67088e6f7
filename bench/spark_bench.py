"""`dmq bench spark`: Spark reading a dmq topic, against Spark reading the same records
from a local Parquet file (the ceiling), and the cost of a streaming micro-batch.

Setup, in one run: a real `dmq serve` on loopback with a fresh data directory; a topic of
2 partitions filled with --total-mb MiB of 1 KiB records (random values, 16-byte keys)
through dmq.client; a local Spark (`local[2]`, this interpreter for its workers, no UI).
The broker, Spark's JVM and its Python workers share the machine.

1. Batch: `spark.read.format("dmq")...load()` written to Spark's `noop` sink (every row
   and column materialised, nothing written), --runs times; then the same records, which
   Spark wrote once to Parquet files in the work directory (2 files, uncompressed), read
   the same way by Spark's own Parquet reader (the ceiling the issue sets); and the same
   Parquet files read by pyarrow inside a minimal Python data source that yields the
   Arrow batches as they come (`memory-arrow`): the most any Python data source gets
   through Spark here, so that dmq's share and Spark's share of the gap are both visible.
   Figures: rows/s and MB/s (1 KiB per record) of each, and the ratios.
2. Streaming: a query with maxOffsetsPerTrigger = --batch-records to a `noop` sink from
   the earliest offset; each full micro-batch's triggerExecution time, against the time
   the batch read above takes for as many records; the difference is the overhead of a
   micro-batch (planning, offsets log, commit), --runs queries with fresh checkpoints.

Every figure is a median over runs; each run's ratios are printed too, with the load
average at the start and the end. Targets (#22): dmq read >= 0.9 x the Python source's
read and >= 0.35 x Spark's Parquet read, micro-batch overhead < 1 s at 100k records.
"""

from __future__ import annotations

import argparse
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition

from bench.broker_bench import Server
from dmq.client import Admin, Producer
from spark_io.source import arrow_schema, spark_schema

RECORD_BYTES = 1024
KEY_BYTES = 16
PARTITIONS = 2
TOPIC = "spark-bench"
# #22's spark_io row: the read against the most a Python data source gets through Spark
# (the no-op source handing over ready Arrow batches), and against Spark's Parquet reader.
PYTHON_SOURCE_TARGET = 0.9  # dmq read / the no-op Python source's read
PARQUET_TARGET = 0.35  # dmq read / Parquet read
OVERHEAD_TARGET_S = 1.0


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--dir", type=Path, help="create the work directory inside DIR")
    parser.add_argument("--total-mb", type=int, default=256, help="MiB of records in the topic")
    parser.add_argument(
        "--batch-records", type=int, default=100_000, help="maxOffsetsPerTrigger (100000)"
    )
    parser.add_argument("--runs", type=int, default=3, help="runs; medians are shown")
    parser.add_argument("--quick", action="store_true", help="CI-sized run")


def _fill(url: str, records: int) -> None:
    value = os.urandom(RECORD_BYTES)
    with Admin(url) as admin:
        admin.create_topic(TOPIC, partitions=PARTITIONS)
    with Producer(url, batch_bytes=1024 * 1024) as producer:
        for i in range(records):
            producer.send(TOPIC, value, key=b"%016d" % i, partition=i % PARTITIONS)
        producer.flush()


def _spark(work: Path) -> Any:
    from pyspark.sql import SparkSession

    import spark_io

    os.environ["PYSPARK_PYTHON"] = sys.executable
    spark = (
        SparkSession.builder.master("local[2]")
        .appName("dmq-spark-bench")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.sql.warehouse.dir", str(work / "warehouse"))
        .config("spark.sql.parquet.compression.codec", "uncompressed")
        .config("spark.sql.parquet.outputTimestampType", "TIMESTAMP_MICROS")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    spark_io.register(spark)
    return spark


class _ParquetArrowReader(DataSourceReader):
    """Each task yields one Parquet file's record batches, read by pyarrow: the Spark
    side of a Python data source with no source cost of its own."""

    def __init__(self, paths: list[str], schema: Any) -> None:
        self.paths = paths
        self.arrow_schema = arrow_schema(schema)

    def partitions(self) -> list[InputPartition]:
        return [InputPartition(path) for path in self.paths]

    def read(self, partition: InputPartition) -> Iterator[Any]:
        import pyarrow.parquet as pq

        for batch in pq.ParquetFile(partition.value).iter_batches(batch_size=8192):
            yield batch.cast(self.arrow_schema)


class _ParquetArrowSource(DataSource):
    @classmethod
    def name(cls) -> str:
        return "memory-arrow"

    def schema(self) -> Any:
        return spark_schema(False)

    def reader(self, schema: Any) -> _ParquetArrowReader:
        return _ParquetArrowReader(self.options["paths"].split(","), schema)


def _timed_noop(df: Any) -> float:
    start = time.perf_counter()
    df.write.format("noop").mode("overwrite").save()
    return time.perf_counter() - start


def _streaming_batches(spark: Any, url: str, work: Path, batch_records: int) -> list[float]:
    """triggerExecution seconds of each micro-batch that read exactly batch_records."""
    query = (
        spark.readStream.format("dmq").option("url", url).option("topic", TOPIC)
        .option("startingOffsets", "earliest")
        .option("maxOffsetsPerTrigger", str(batch_records)).load()
        .writeStream.format("noop")
        .option("checkpointLocation", str(tempfile.mkdtemp(dir=work))).start()
    )  # fmt: skip
    try:
        query.processAllAvailable()
    finally:
        query.stop()
    return [
        p["durationMs"]["triggerExecution"] / 1000
        for p in query.recentProgress
        if p["numInputRows"] == batch_records
    ]


def _measure(
    spark: Any, url: str, work: Path, args: argparse.Namespace, records: int
) -> dict[str, Any]:
    dmq_df = spark.read.format("dmq").option("url", url).option("topic", TOPIC).load()
    parquet_path = str(work / "records.parquet")
    dmq_df.repartition(PARTITIONS).write.parquet(parquet_path)
    parquet_df = spark.read.parquet(parquet_path)
    files = sorted(str(p) for p in Path(parquet_path).glob("*.parquet"))
    spark.dataSource.register(_ParquetArrowSource)
    arrow_df = spark.read.format("memory-arrow").option("paths", ",".join(files)).load()
    for df in (dmq_df, parquet_df, arrow_df):
        _timed_noop(df)  # warm-up: Python workers, JIT, page cache
    dmq_s, parquet_s, arrow_s, batches_s = [], [], [], []
    for _ in range(args.runs):
        dmq_s.append(_timed_noop(dmq_df))
        parquet_s.append(_timed_noop(parquet_df))
        arrow_s.append(_timed_noop(arrow_df))
        batches_s += _streaming_batches(spark, url, work, args.batch_records)
    dmq_med, parquet_med = statistics.median(dmq_s), statistics.median(parquet_s)
    arrow_med = statistics.median(arrow_s)
    mb = records * RECORD_BYTES / 1e6
    batch_med = statistics.median(batches_s) if batches_s else float("nan")
    read_same_s = dmq_med * args.batch_records / records
    return {
        "records": records,
        "dmq_rows_s": records / dmq_med,
        "dmq_mb_s": mb / dmq_med,
        "parquet_rows_s": records / parquet_med,
        "parquet_mb_s": mb / parquet_med,
        "dmq_vs_parquet": parquet_med / dmq_med,
        "python_source_rows_s": records / arrow_med,
        "python_source_mb_s": mb / arrow_med,
        "dmq_vs_python_source": arrow_med / dmq_med,
        "per_run_vs_parquet": [p / d for p, d in zip(parquet_s, dmq_s, strict=True)],
        "per_run_vs_python_source": [a / d for a, d in zip(arrow_s, dmq_s, strict=True)],
        "microbatch_s": batch_med,
        "batch_read_same_records_s": read_same_s,
        "microbatch_overhead_s": batch_med - read_same_s,
        "samples": {
            "dmq_s": dmq_s,
            "parquet_s": parquet_s,
            "python_source_s": arrow_s,
            "microbatch_s": batches_s,
        },  # fmt: skip
    }


def run(args: argparse.Namespace, out: Any = None) -> dict[str, Any]:
    """Steps 1-2 of the module docstring; prints the setup and figures, returns them."""
    out = out or sys.stdout
    if args.quick:
        args.total_mb, args.batch_records, args.runs = 8, 3000, 1
    records = args.total_mb * 1024 * 1024 // RECORD_BYTES
    if args.batch_records > records:
        raise ValueError(f"--batch-records {args.batch_records} exceeds the {records} records")
    work = Path(tempfile.mkdtemp(prefix="dmq-spark-bench-", dir=args.dir))
    started = time.perf_counter()
    try:
        print(
            f"python {platform.python_version()}, {os.cpu_count()} cores, work dir {work}", file=out
        )
        print(f"{records} records of {RECORD_BYTES} B in {PARTITIONS} partitions, Spark local[2], "
              f"broker and Spark sharing the machine; medians of {args.runs} runs", file=out)  # fmt: skip
        print(f"load average at start: {os.getloadavg()}", file=out)
        with Server(work / "broker") as server:
            _fill(server.url, records)
            spark = _spark(work)
            try:
                result = _measure(spark, server.url, work, args, records)
            finally:
                spark.stop()
    finally:
        shutil.rmtree(work, ignore_errors=True)
    result["seconds"] = time.perf_counter() - started
    print(f"load average at end: {os.getloadavg()}", file=out)
    result["targets"] = _report(result, args.batch_records, out)
    return result


def _report(r: dict[str, Any], batch_records: int, out: Any) -> list[dict[str, Any]]:
    print(
        f"\nbatch read, dmq      {r['dmq_rows_s']:>12,.0f} rows/s {r['dmq_mb_s']:>8.1f} MB/s",
        file=out,
    )
    print(f"batch read, Parquet  {r['parquet_rows_s']:>12,.0f} rows/s {r['parquet_mb_s']:>8.1f} MB/s"
          f"   dmq / Parquet {r['dmq_vs_parquet']:.2f}", file=out)  # fmt: skip
    print(f"Parquet through a Python data source (pyarrow) {r['python_source_rows_s']:>10,.0f} rows/s "
          f"{r['python_source_mb_s']:>8.1f} MB/s   dmq / it {r['dmq_vs_python_source']:.2f}",
          file=out)  # fmt: skip
    print("each run, dmq / Parquet: " + ", ".join(f"{x:.2f}" for x in r["per_run_vs_parquet"])
          + "; dmq / Python source: " + ", ".join(f"{x:.2f}" for x in r["per_run_vs_python_source"]),
          file=out)  # fmt: skip
    print(f"micro-batch of {batch_records} records: {r['microbatch_s']:.2f} s, the batch read of as "
          f"many {r['batch_read_same_records_s']:.2f} s, overhead {r['microbatch_overhead_s']:.2f} s",
          file=out)  # fmt: skip
    targets = [
        {"name": "dmq read / Python source read", "value": r["dmq_vs_python_source"],
         "passed": r["dmq_vs_python_source"] >= PYTHON_SOURCE_TARGET,
         "target": f">= {PYTHON_SOURCE_TARGET}"},
        {"name": "dmq read / Parquet read", "value": r["dmq_vs_parquet"],
         "passed": r["dmq_vs_parquet"] >= PARQUET_TARGET, "target": f">= {PARQUET_TARGET}"},
        {"name": "micro-batch overhead, s", "value": r["microbatch_overhead_s"],
         "passed": r["microbatch_overhead_s"] < OVERHEAD_TARGET_S, "target": f"< {OVERHEAD_TARGET_S} s"},
    ]  # fmt: skip
    print(file=out)
    for t in targets:
        print(f"  {'PASS' if t['passed'] else 'FAIL'}  {t['name']}: {t['value']:.2f} "
              f"(target {t['target']}; 2-core shared VM)", file=out)  # fmt: skip
    return targets


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_arguments(parser)
    run(parser.parse_args(argv))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
