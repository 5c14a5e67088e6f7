"""The sink: one Spark task's Arrow record batches produced to dmq with acks=all.

Columns, as Spark's Kafka sink: `value` (binary or string, required), `key` (binary or
string), `topic` (string; required unless the option topic is set, which wins),
`partition` (int; else the broker's partitioner: murmur2 of the key, or sticky), and
`headers` (array<struct<key:string,value:binary>>). Other columns are refused.

1. Pick a live broker from the URLs (the first that answers GET /v1/cluster).
2. Send every row through one `dmq.client.Producer` (batched per partition, acks=all),
   then flush and check every acknowledgement; the first error fails the task.
3. Return the count of records per topic partition as the commit message.

What a retried task can duplicate is in spark_io/README.md ("Writing").
"""

from __future__ import annotations

import concurrent.futures
from collections import Counter
from collections.abc import Iterator, Mapping
from dataclasses import dataclass

import pyarrow as pa
from pyspark.sql.datasource import WriterCommitMessage
from pyspark.sql.types import BinaryType, StringType, StructType

from dmq.client import Producer, RecordMetadata
from spark_io._brokers import Brokers
from spark_io._options import OptionError, urls_option

COLUMNS = frozenset({"key", "value", "topic", "partition", "headers"})
PENDING_MAX = 10_000  # acknowledgements awaited at once by a task; older ones are checked first


def make_producer(url: str) -> Producer:
    """The one place the sink builds its producer: idempotent, so a produce request the
    client retries (a lost acknowledgement, a leader change) is never stored twice. A
    retried *task* starts a new producer and still can duplicate: see the README."""
    return Producer(url, acks="all", compression="none", idempotent=True)


@dataclass(frozen=True)
class DmqWriteMessage(WriterCommitMessage):
    records: dict[str, int]  # "topic/partition" -> records acknowledged by this task


@dataclass(frozen=True, slots=True)
class WriteOptions:
    urls: tuple[str, ...]
    topic: str | None

    @classmethod
    def parse(cls, options: Mapping[str, str], schema: StructType) -> WriteOptions:
        topic = {str(k).lower(): v for k, v in options.items()}.get("topic")
        names = {f.name for f in schema.fields}
        unknown = names - COLUMNS
        if unknown:
            raise OptionError(f"the dmq sink takes columns {sorted(COLUMNS)}; got {sorted(unknown)}")
        if "value" not in names:
            raise OptionError("the dmq sink needs a value column (binary or string)")
        if topic is None and "topic" not in names:
            raise OptionError("give the option topic or a topic column")
        for name in ("key", "value"):
            if name in names and not isinstance(schema[name].dataType, BinaryType | StringType):
                raise OptionError(f"column {name} must be binary or string")
        return cls(urls_option(options), topic)


def _live_url(urls: tuple[str, ...]) -> str:
    with Brokers(urls) as brokers:
        brokers.admin(lambda admin: admin.cluster())
        return brokers.url


def _as_bytes(value: bytes | str | None) -> bytes | None:
    return value.encode() if isinstance(value, str) else value


def write_batches(options: WriteOptions, batches: Iterator[pa.RecordBatch]) -> DmqWriteMessage:
    """Steps 1-3 of the module docstring."""
    counts: Counter[str] = Counter()
    pending: list[concurrent.futures.Future[RecordMetadata]] = []
    with make_producer(_live_url(options.urls)) as producer:
        for batch in batches:
            columns = {name: batch.column(name).to_pylist() for name in batch.schema.names}
            n = batch.num_rows
            values = columns["value"]
            keys = columns.get("key", [None] * n)
            topics = [options.topic] * n if options.topic else columns["topic"]
            partitions = columns.get("partition", [None] * n)
            headers = columns.get("headers", [None] * n)
            for i in range(n):
                topic = topics[i]
                if topic is None:
                    raise OptionError(f"row {i} of a batch has a null topic")
                pending.append(
                    producer.send(
                        topic,
                        _as_bytes(values[i]),
                        key=_as_bytes(keys[i]),
                        headers=[(h["key"], h["value"]) for h in headers[i] or ()],
                        partition=partitions[i],
                    )
                )
                if len(pending) >= PENDING_MAX:
                    _settle(pending, counts)
        producer.flush()
        _settle(pending, counts)
    return DmqWriteMessage(dict(counts))


def _settle(
    pending: list[concurrent.futures.Future[RecordMetadata]], counts: Counter[str]
) -> None:
    """Wait for every acknowledgement in `pending` (raising the first error) and count."""
    for future in pending:
        meta = future.result()
        counts[f"{meta.topic}/{meta.partition}"] += 1
    pending.clear()
