"""The `dmq` PySpark data source: batch and streaming readers, batch and streaming writers.

Spark pickles the DataSource and its readers and writers to its Python workers; they
hold only checked options (spark_io/_options.py) and open their HTTP connections in
the method that runs there.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import pyarrow as pa
from pyspark.sql.datasource import (
    DataSource,
    DataSourceArrowWriter,
    DataSourceReader,
    DataSourceStreamArrowWriter,
    DataSourceStreamReader,
    InputPartition,
)
from pyspark.sql.pandas.types import to_arrow_schema
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadLimit, ReadMaxRows
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    IntegerType,
    LongType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from spark_io._brokers import Brokers, use_credentials
from spark_io._options import EARLIEST, OffsetMap, ReadOptions, read_options
from spark_io._plan import OffsetRange, PartitionState, batch_ranges, offset_map
from spark_io._plan import partition_states as _partition_states
from spark_io._plan import resolve as _resolve
from spark_io._read import data_loss, read_range
from spark_io._write import DmqWriteMessage, WriteOptions, finish_transactions, write_batches

NAME = "dmq"
# Spark's Kafka source schema; headers only with includeHeaders=true.
SCHEMA = StructType(
    [
        StructField("key", BinaryType()),
        StructField("value", BinaryType()),
        StructField("topic", StringType()),
        StructField("partition", IntegerType()),
        StructField("offset", LongType()),
        StructField("timestamp", TimestampType()),
        StructField("timestampType", IntegerType()),
    ]
)
HEADERS = StructField(
    "headers",
    ArrayType(StructType([StructField("key", StringType()), StructField("value", BinaryType())])),
)


def spark_schema(include_headers: bool) -> StructType:
    """key binary, value binary, topic string, partition int, offset long, timestamp
    timestamp, timestampType int[, headers array<struct<key:string,value:binary>>]."""
    return StructType([*SCHEMA.fields, HEADERS]) if include_headers else SCHEMA


def arrow_schema(schema: StructType) -> pa.Schema:
    """The Arrow form Spark checks a read batch against (UTC microsecond timestamps)."""
    return to_arrow_schema(schema, timezone="UTC")


class DmqDataSource(DataSource):
    """`spark.read.format("dmq")` / `readStream` / `write` / `writeStream`."""

    @classmethod
    def name(cls) -> str:
        return NAME

    def schema(self) -> StructType:
        include = str(self.options.get("includeHeaders", "false")).lower() == "true"
        return spark_schema(include)

    def reader(self, schema: StructType) -> DmqBatchReader:
        return DmqBatchReader(read_options(self.options, streaming=False), schema)

    def streamReader(self, schema: StructType) -> DmqStreamReader:
        return DmqStreamReader(read_options(self.options, streaming=True), schema)

    def writer(self, schema: StructType, overwrite: bool) -> DmqBatchWriter:
        return DmqBatchWriter(WriteOptions.parse(self.options, schema))

    def streamWriter(self, schema: StructType, overwrite: bool) -> DmqStreamWriter:
        return DmqStreamWriter(WriteOptions.parse(self.options, schema))


class _RangeReader:
    def __init__(self, options: ReadOptions, schema: StructType) -> None:
        self.options = options
        self.arrow_schema = arrow_schema(schema)

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        if not isinstance(partition, OffsetRange):
            return iter(())  # Spark plans one empty partition when there are none
        use_credentials(self.options.credentials)  # this executor's clients and fetches
        return read_range(
            self.options.urls,
            partition,
            self.arrow_schema,
            fetch_bytes=self.options.fetch_bytes,
            include_headers=self.options.include_headers,
            fail_on_data_loss=self.options.fail_on_data_loss,
            record_filter=self.options.record_filter,
            isolation=self.options.isolation,
        )


class DmqBatchReader(_RangeReader, DataSourceReader):
    """Plans the offset ranges once (spark_io/_plan.py); every task reads one. No filter
    pushdown (spark_io/README.md says why)."""

    def partitions(self) -> Sequence[InputPartition]:
        with Brokers(self.options.urls) as brokers:
            return batch_ranges(brokers, self.options)


class DmqStreamReader(_RangeReader, DataSourceStreamReader):
    """Micro-batches over offsets `{"topic": {"partition": offset}}`.

    - initialOffset: startingOffsets resolved for every partition (latest by default);
    - latestOffset(start, limit): the high watermarks now, cut to the read limit
      (maxOffsetsPerTrigger) in proportion to each partition's backlog, never below start;
      a partition that appeared since start is read from its first record;
    - partitions(start, end): one task per partition with records in [start, end).
    """

    def initialOffset(self) -> OffsetMap:
        with Brokers(self.options.urls) as brokers:
            states = _partition_states(brokers, self.options)
            offsets = [
                _resolve(brokers, self.options.starting, s, "startingOffsets") for s in states
            ]
            return offset_map(states, offsets)

    def getDefaultReadLimit(self) -> ReadLimit:
        limit = self.options.max_offsets_per_trigger
        return ReadAllAvailable() if limit is None else ReadMaxRows(limit)

    def latestOffset(self, start: OffsetMap, limit: ReadLimit) -> OffsetMap:
        with Brokers(self.options.urls) as brokers:
            states = _partition_states(brokers, self.options)
        _check_partitions_kept(start, states, self.options.fail_on_data_loss)
        froms = [_from(start, s) for s in states]
        ends = [max(f, s.high_watermark) for f, s in zip(froms, states, strict=True)]
        if isinstance(limit, ReadMaxRows):
            ends = _rate_limit(froms, ends, limit.max_rows)
        result = offset_map(states, ends)
        # Never report less than start, also for partitions that are gone (failOnDataLoss=false).
        for topic, partitions in start.items():
            for partition, offset in partitions.items():
                result.setdefault(topic, {}).setdefault(partition, offset)
        return result

    def reportLatestOffset(self) -> OffsetMap:
        with Brokers(self.options.urls) as brokers:
            states = _partition_states(brokers, self.options)
        return offset_map(states, [s.high_watermark for s in states])

    def partitions(self, start: OffsetMap, end: OffsetMap) -> Sequence[InputPartition]:
        ranges: list[OffsetRange] = []
        for topic, partitions in end.items():
            for partition, end_offset in partitions.items():
                begin = start.get(topic, {}).get(partition)
                new = begin is None
                begin = 0 if begin is None else begin
                if end_offset > begin:
                    ranges.append(OffsetRange(topic, int(partition), begin, end_offset, new))
        return ranges

    def commit(self, end: OffsetMap) -> None:
        """Nothing to do: the checkpoint is the position; dmq keeps no state for us."""


def _from(start: OffsetMap, state: PartitionState) -> int:
    """Where a partition's next micro-batch starts: its offset in start, or, for a
    partition new since then, its first record."""
    offset = start.get(state.topic, {}).get(str(state.partition))
    if offset is None or offset == EARLIEST:
        return state.log_start_offset
    return max(offset, state.log_start_offset)


def _check_partitions_kept(start: OffsetMap, states: list[PartitionState], fail: bool) -> None:
    present = {(s.topic, str(s.partition)) for s in states}
    for topic, partitions in start.items():
        for partition in partitions:
            if (topic, partition) not in present:
                data_loss(f"{topic}/{partition} is gone (topic deleted?)", fail)


def _rate_limit(froms: list[int], ends: list[int], max_rows: int) -> list[int]:
    """At most max_rows offsets in all: one for each partition with a backlog when the
    limit allows (so that none starves behind large ones), the rest shared in proportion
    to what each has left (as Spark's Kafka source), rounded down, and what rounding
    leaves one offset at a time to the partitions with nothing yet, then to the largest
    backlogs. No end goes below its start or past its high watermark."""
    backlog = [e - f for f, e in zip(froms, ends, strict=True)]
    total = sum(backlog)
    if total <= max_rows:
        return ends
    shares = [min(b, 1) for b in backlog]
    if sum(shares) > max_rows:
        shares = [0] * len(backlog)
    rest = [b - s for b, s in zip(backlog, shares, strict=True)]
    rows, rest_total = max_rows - sum(shares), sum(rest)  # rest_total > rows >= 0
    shares = [s + r * rows // rest_total for s, r in zip(shares, rest, strict=True)]
    left = max_rows - sum(shares)
    order = sorted(range(len(shares)), key=lambda i: (shares[i] > 0, shares[i] - backlog[i]))
    for i in order:
        if left == 0:
            break
        if backlog[i] > shares[i]:
            shares[i] += 1
            left -= 1
    return [f + share for f, share in zip(froms, shares, strict=True)]


class DmqBatchWriter(DataSourceArrowWriter):
    """`df.write.format("dmq")`: each task produces its rows with acks=all
    (spark_io/_write.py). commit has nothing to do; abort cannot take records back."""

    def __init__(self, options: WriteOptions) -> None:
        self.options = options

    def write(self, iterator: Iterator[pa.RecordBatch]) -> DmqWriteMessage:
        return write_batches(self.options, iterator)

    def commit(self, messages: list[Any]) -> None:
        """Without exactlyOnce the records are visible as soon as each task's produce is
        acknowledged; with it, every task's transaction is committed now."""
        finish_transactions(messages, commit=True)

    def abort(self, messages: list[Any]) -> None:
        """Without exactlyOnce what the tasks wrote stays (spark_io/README.md); with it,
        every task's transaction is aborted, a cancelled task's too."""
        finish_transactions(
            [m for m in messages if m is not None], commit=False, options=self.options
        )


class DmqStreamWriter(DataSourceStreamArrowWriter):
    """`df.writeStream.format("dmq")`: as DmqBatchWriter, once per micro-batch."""

    def __init__(self, options: WriteOptions) -> None:
        self.options = options

    def write(self, iterator: Iterator[pa.RecordBatch]) -> DmqWriteMessage:
        return write_batches(self.options, iterator)

    def commit(self, messages: list[Any], batchId: int) -> None:  # noqa: N803 - Spark's name
        """As for the batch writer (exactlyOnce: the micro-batch's transactions)."""
        finish_transactions(messages, commit=True)

    def abort(self, messages: list[Any], batchId: int) -> None:  # noqa: N803 - Spark's name
        """As for the batch writer."""
        finish_transactions(
            [m for m in messages if m is not None], commit=False, options=self.options
        )
