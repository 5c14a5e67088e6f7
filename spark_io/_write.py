"""The sink: one Spark task's Arrow record batches produced to dmq with acks=all.

Columns, as Spark's Kafka sink: `value` (binary or string, required), `key` (binary or
string), `topic` (string; required unless the option topic is set, which wins),
`partition` (int; else the broker's partitioner: murmur2 of the key, or sticky), and
`headers` (array<struct<key:string,value:binary>>). Other columns are refused.

1. Pick a live broker from the URLs (the first that answers GET /v1/cluster).
2. Send every row through one `dmq.client.Producer` (batched per partition, acks=all),
   then flush and check every acknowledgement; the first error fails the task.
3. Return the count of records per topic partition as the commit message.

With the option `exactlyOnce=true` each task writes inside a transaction it leaves open
(transactional id `spark-<job uuid>-<Spark partition>`, timeout `transactionTimeoutMs`);
its commit message names the transaction, the driver's `commit()` commits every one of
them and `abort()` aborts them (`finish_transactions`), and also every open transaction of
the job that no message names (a task cancelled when another failed returns none). A retried or speculative attempt
of a task starts a producer with the same transactional id: the new epoch fences the
older attempt and aborts its transaction, so at most one attempt's rows can ever be
committed. What remains is in spark_io/README.md ("Writing").
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import uuid
from collections import Counter
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
from pyspark import TaskContext
from pyspark.sql.datasource import WriterCommitMessage
from pyspark.sql.types import BinaryType, StringType, StructType

from dmq.client import Producer, RecordMetadata
from dmq.client._transactions import end_transaction, list_transactions
from dmq.errors import DmqError
from spark_io._brokers import Brokers, Credentials, use_credentials
from spark_io._options import OptionError, urls_option

COLUMNS = frozenset({"key", "value", "topic", "partition", "headers"})
PENDING_MAX = 10_000  # acknowledgements awaited at once by a task; older ones are checked first


def make_producer(url: str, transactional_id: str | None = None, timeout_ms: int = 0) -> Producer:
    """The one place the sink builds its producer: idempotent, so a produce request the
    client retries (a lost acknowledgement, a leader change) is never stored twice. A
    retried *task* starts a new producer and still can duplicate (see the README) unless
    the write is exactly-once: then the producer is transactional."""
    if transactional_id is None:
        return Producer(url, acks="all", compression="none", idempotent=True)
    return Producer(
        url, acks="all", compression="none", transactional_id=transactional_id,
        transaction_timeout_ms=timeout_ms,
    )  # fmt: skip


@dataclass(frozen=True)
class DmqWriteMessage(WriterCommitMessage):
    records: dict[str, int]  # "topic/partition" -> records acknowledged by this task
    # exactlyOnce: (url, transactional id, producer id, epoch) of the task's open transaction
    transaction: tuple[str, str, int, int] | None = None


TRANSACTION_TIMEOUT_MS_DEFAULT = 600_000  # the write job's tasks and its commit, at most


@dataclass(frozen=True, slots=True)
class WriteOptions:
    urls: tuple[str, ...]
    topic: str | None
    exactly_once: bool = False
    job_id: str = ""  # drawn on the driver: one transactional id per Spark partition
    transaction_timeout_ms: int = TRANSACTION_TIMEOUT_MS_DEFAULT
    credentials: Credentials = field(default_factory=Credentials)  # token, ca, cert, key

    @classmethod
    def parse(cls, options: Mapping[str, str], schema: StructType) -> WriteOptions:
        lowered = {str(k).lower(): str(v) for k, v in options.items()}
        topic = lowered.get("topic")
        exactly_once = lowered.get("exactlyonce", "false").lower()
        if exactly_once not in ("true", "false"):
            raise OptionError(f"option exactlyOnce must be true or false, got {exactly_once!r}")
        timeout = lowered.get("transactiontimeoutms", str(TRANSACTION_TIMEOUT_MS_DEFAULT))
        if not timeout.isdigit() or not 1 <= int(timeout) <= 900_000:
            raise OptionError(f"option transactionTimeoutMs must be in 1..900000, got {timeout!r}")
        names = {f.name for f in schema.fields}
        unknown = names - COLUMNS
        if unknown:
            raise OptionError(
                f"the dmq sink takes columns {sorted(COLUMNS)}; got {sorted(unknown)}"
            )
        if "value" not in names:
            raise OptionError("the dmq sink needs a value column (binary or string)")
        if topic is None and "topic" not in names:
            raise OptionError("give the option topic or a topic column")
        for name in ("key", "value"):
            if name in names and not isinstance(schema[name].dataType, BinaryType | StringType):
                raise OptionError(f"column {name} must be binary or string")
        try:
            credentials = Credentials.from_options(lowered)
        except ValueError as exc:
            raise OptionError(str(exc)) from exc
        use_credentials(credentials)  # the driver's clients: the commit or abort of transactions
        return cls(
            urls_option(options), topic, exactly_once == "true", uuid.uuid4().hex, int(timeout),
            credentials,
        )  # fmt: skip


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
    use_credentials(options.credentials)  # this executor's producer and metadata calls
    url = _live_url(options.urls)
    tid = None
    if options.exactly_once:
        tid = f"spark-{options.job_id}-{TaskContext.get().partitionId()}"  # type: ignore[union-attr]
    transaction = None
    with make_producer(url, tid, options.transaction_timeout_ms) as producer:
        if tid is not None:
            producer.begin_transaction()  # left open: the driver commits or aborts it
            transaction = (url, tid, *producer.producer_identity())
        try:
            _send_all(producer, options, batches, pending, counts)
        except BaseException:
            if tid is not None:  # this attempt failed: its rows must never show
                with contextlib.suppress(Exception):
                    producer.abort_transaction()
            raise
    return DmqWriteMessage(dict(counts), transaction)


def _send_all(
    producer: Producer,
    options: WriteOptions,
    batches: Iterator[pa.RecordBatch],
    pending: list[concurrent.futures.Future[RecordMetadata]],
    counts: Counter[str],
) -> None:
    """Step 2: every row sent, flushed, every acknowledgement checked."""
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


def finish_transactions(
    messages: list[Any], *, commit: bool, options: WriteOptions | None = None
) -> None:
    """The driver's commit or abort of every task's transaction (exactlyOnce). A commit
    that fails (a task's attempt was fenced by a later one) raises: the job fails, and
    nothing of that attempt is ever visible. An abort given the job's `options` also
    aborts the job's open transactions that no message names, so a cancelled task's rows
    do not hold back read_committed readers until its transaction times out."""
    named = set()
    for message in messages:
        transaction = getattr(message, "transaction", None)
        if transaction is None:
            continue
        url, tid, producer_id, epoch = transaction
        named.add(tid)
        try:
            asyncio.run(end_transaction(url, tid, (producer_id, epoch), commit=commit))
        except DmqError:
            if commit:
                raise
    if commit or options is None or not options.exactly_once:
        return
    with contextlib.suppress(DmqError):  # best effort: the transaction timeout is the backstop
        url = _live_url(options.urls)
        prefix = f"spark-{options.job_id}-"
        for txn in asyncio.run(list_transactions(url)):
            tid = txn["transactional_id"]
            if tid.startswith(prefix) and tid not in named and txn["state"] == "ongoing":
                identity = (txn["producer_id"], txn["producer_epoch"])
                with contextlib.suppress(DmqError):
                    asyncio.run(end_transaction(url, tid, identity, commit=False))


def _settle(pending: list[concurrent.futures.Future[RecordMetadata]], counts: Counter[str]) -> None:
    """Wait for every acknowledgement in `pending` (raising the first error) and count."""
    for future in pending:
        meta = future.result()
        counts[f"{meta.topic}/{meta.partition}"] += 1
    pending.clear()
