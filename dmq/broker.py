"""The Broker facade: the one object the HTTP API talks to.

Every request is one call here: produce, fetch, list offsets, and topic admin. The
Broker chooses partitions, enforces the limits, translates storage errors into
dmq.errors, and owns the replicas. On one node the topic catalogue is a local file
and each partition has one replica; the Raft issue replaces those two pieces and
keeps this interface.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import logging
import os
import shutil
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from dmq import errors, limits
from dmq.config import BrokerConfig
from dmq.partitioner import StickyPartitioner, partition_for_key
from dmq.replica import FlushSettings, PartitionReplica, StorageThreads
from dmq.topics import (
    TopicCatalogue,
    TopicMeta,
    check_topic_name,
    default_topic_config,
    log_config_for,
    validate_topic_config,
)
from log import errors as log_errors
from log import limits as log_limits
from log.partition_log import ReadResult
from log.records import Header, Record, RecordLimits, encode_batch, validate_batch
from log.segment import write_durably

_log = logging.getLogger("dmq.broker")

Acks = Literal["0", "1", "all"]
STORAGE_THREADS = 4  # bounded: partitions are spread over these, see dmq/replica.py


def wall_ms() -> int:
    return time.time_ns() // 1_000_000


@dataclass(frozen=True, slots=True)
class ProduceRecord:
    key: bytes | None
    value: bytes | None
    headers: tuple[Header, ...] = ()
    partition: int | None = None
    timestamp_ms: int | None = None


@dataclass(frozen=True, slots=True)
class OffsetRun:
    """`count` consecutive records of a produce request, in request order, that went to
    `partition` at offsets base_offset, base_offset + 1, ... (None for acks=0).

    A produce answers one entry per record; runs keep that answer compact (a
    1000-record batch is one run) until the HTTP layer writes it out.
    """

    partition: int
    base_offset: int | None
    count: int


@dataclass(frozen=True, slots=True)
class PartitionInfo:
    partition: int
    leader: str
    replicas: tuple[str, ...]
    log_start_offset: int
    high_watermark: int
    log_end_offset: int


@dataclass(frozen=True, slots=True)
class TopicDescription:
    name: str
    replication_factor: int
    partitions: tuple[PartitionInfo, ...]
    config: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class TopicSummary:
    name: str
    partitions: int
    replication_factor: int


@dataclass(slots=True)
class FetchResult:
    """Records from `offset`: decoded (`records`) or raw batches (`raw`, to be closed)."""

    topic: str
    partition: int
    offset: int
    next_offset: int
    high_watermark: int
    log_start_offset: int
    records: list[Record] = field(default_factory=list)
    raw: ReadResult | None = None


@dataclass(frozen=True, slots=True)
class OffsetsResult:
    partition: int
    log_start_offset: int
    high_watermark: int
    offset: int | None


def translate(exc: log_errors.LogError) -> errors.DmqError:
    """Storage errors at the Broker's border: log/ types never reach the user."""
    if isinstance(exc, log_errors.RecordTooLargeError):
        return errors.RecordTooLarge(str(exc), field=exc.field, limit=exc.limit)
    if isinstance(exc, log_errors.InvalidRecordError):
        return errors.InvalidRequest(str(exc), field=exc.field, limit=exc.limit)
    if isinstance(exc, log_errors.OffsetOutOfRangeError):
        return errors.OffsetOutOfRange(
            str(exc),
            offset=exc.offset,
            log_start_offset=exc.log_start_offset,
            log_end_offset=exc.log_end_offset,
        )
    return errors.StorageError(str(exc))


class Broker:
    def __init__(self, config: BrokerConfig) -> None:
        self.config = config
        self.data_dir = config.data_path
        self._lock_fd = -1
        self._catalogue: TopicCatalogue | None = None
        self._replicas: dict[tuple[str, int], PartitionReplica] = {}
        self._threads = StorageThreads(STORAGE_THREADS)
        self._sticky = StickyPartitioner()
        self._waiting_fetches = 0
        self._admin_lock = asyncio.Lock()
        self._background: list[asyncio.Task[None]] = []
        self.cluster_id = ""
        self.ready = False

    # ------------------------------------------------------------------ lifecycle

    async def start(self) -> None:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self._lock_data_dir()
        self.cluster_id = self._load_cluster_id()
        self._catalogue = TopicCatalogue(self.data_dir / "meta")
        self._remove_orphan_partitions()
        for topic in self._catalogue.topics.values():
            for p in range(topic.partitions):
                await self._open_replica(topic, p)
        loop = asyncio.get_running_loop()
        self._background.append(loop.create_task(self._housekeeping()))
        self.ready = True
        _log.info(
            "broker %s ready: %d topics, %d partitions in %s",
            self.config.node_id,
            len(self._catalogue.topics),
            len(self._replicas),
            self.data_dir,
        )

    async def stop(self) -> None:
        """Close every replica (queued appends finish, logs flush), release the lock."""
        self.ready = False
        for task in self._background:
            task.cancel()
        results = await asyncio.gather(*self._background, return_exceptions=True)
        for result in results:
            if isinstance(result, Exception):
                _log.error("background task had failed: %r", result)
        try:
            for replica in list(self._replicas.values()):
                try:
                    await replica.close()
                except Exception:  # keep closing the others: each close flushes its log
                    _log.exception("closing %s-%d failed", replica.topic, replica.partition)
        finally:
            self._threads.shutdown()
        if self._lock_fd >= 0:
            os.close(self._lock_fd)
            self._lock_fd = -1

    def _lock_data_dir(self) -> None:
        path = self.data_dir / ".lock"
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise errors.BrokerUnavailable(
                f"data directory {self.data_dir} is locked by another dmq process"
            ) from None
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
        self._lock_fd = fd

    def _load_cluster_id(self) -> str:
        path = self.data_dir / "meta" / "cluster_id"
        path.parent.mkdir(parents=True, exist_ok=True)
        if not path.exists() or not path.read_text().strip():
            write_durably(path, (uuid.uuid4().hex + "\n").encode())
        return path.read_text().strip()

    def _partition_dir(self, topic: str, partition: int) -> Path:
        return self.data_dir / "partitions" / f"{topic}-{partition}"

    def _remove_orphan_partitions(self) -> None:
        """Directories of deleted topics whose removal a crash interrupted."""
        assert self._catalogue is not None
        root = self.data_dir / "partitions"
        if not root.exists():
            return
        wanted = {
            f"{t.name}-{p}" for t in self._catalogue.topics.values() for p in range(t.partitions)
        }
        for path in root.iterdir():
            if path.name not in wanted:
                _log.info("removing orphan partition directory %s", path)
                shutil.rmtree(path)

    async def _open_replica(self, topic: TopicMeta, partition: int) -> PartitionReplica:
        key = f"{topic.name}-{partition}"
        c = self.config
        replica = PartitionReplica(
            topic.name,
            partition,
            self._partition_dir(topic.name, partition),
            log_config_for(topic.config, c),
            FlushSettings(
                interval_records=c.flush_interval_records if c.flush_interval_records > 0 else None,
                interval_ms=c.flush_interval_ms if c.flush_interval_ms >= 0 else None,
            ),
            self._threads.executor_for(key),
            queue_depth_max=c.produce_queue_depth_max,
            queue_bytes_max=c.produce_queue_bytes_max,
            group_requests_max=c.group_commit_requests_max,
            group_bytes_max=c.batch_bytes_max,
        )
        await replica.open()
        self._replicas[(topic.name, partition)] = replica
        return replica

    async def _open_replicas(self, topic: TopicMeta, partitions: range) -> None:
        """Open several replicas, all or none: a failure closes the ones just opened."""
        opened: list[PartitionReplica] = []
        try:
            for p in partitions:
                opened.append(await self._open_replica(topic, p))
        except BaseException:
            for replica in opened:
                self._replicas.pop((replica.topic, replica.partition), None)
                await replica.close()
            raise

    async def _housekeeping(self) -> None:
        """Retention/compaction every retention_check_interval_ms; time-based flushes."""
        interval_s = self.config.retention_check_interval_ms / 1000
        flush_ms = self.config.flush_interval_ms
        tick_s = min(interval_s, flush_ms / 1000) if flush_ms > 0 else interval_s
        next_clean = asyncio.get_running_loop().time() + interval_s
        while True:
            await asyncio.sleep(tick_s)
            for replica in list(self._replicas.values()):
                try:
                    await replica.maybe_flush()
                    if asyncio.get_running_loop().time() >= next_clean:
                        await replica.maybe_clean(wall_ms())
                except Exception:  # one partition's failure must not stop the others' upkeep
                    _log.exception("housekeeping failed on %s-%d", replica.topic, replica.partition)
            if asyncio.get_running_loop().time() >= next_clean:
                next_clean += interval_s

    # ------------------------------------------------------------------ topics

    @property
    def catalogue(self) -> TopicCatalogue:
        if self._catalogue is None or not self.ready:
            raise errors.BrokerUnavailable("the broker is starting or stopping", retry_after_ms=500)
        return self._catalogue

    def _topic(self, name: str) -> TopicMeta:
        topic = self.catalogue.topics.get(name)
        if topic is None:
            raise errors.TopicNotFound(f"topic {name!r} does not exist", field="topic")
        return topic

    def _replica(self, topic: str, partition: int) -> PartitionReplica:
        meta = self._topic(topic)
        if not 0 <= partition < meta.partitions:
            raise errors.PartitionNotFound(
                f"topic {topic!r} has partitions 0..{meta.partitions - 1}, not {partition}",
                field="partition",
                limit=meta.partitions - 1,
            )
        replica = self._replicas.get((topic, partition))
        if replica is None:  # being reopened by a config change right now
            raise errors.BrokerUnavailable(
                f"partition {topic}-{partition} is reopening", retry_after_ms=200
            )
        return replica

    async def create_topic(
        self,
        name: str,
        partitions: int | None = None,
        replication_factor: int | None = None,
        config: dict[str, Any] | None = None,
    ) -> TopicDescription:
        check_topic_name(name)
        count = self.config.default_partitions if partitions is None else partitions
        if not 1 <= count <= limits.PARTITIONS_PER_TOPIC_MAX:
            raise errors.InvalidRequest(
                f"partitions must be in [1, {limits.PARTITIONS_PER_TOPIC_MAX}], got {count}",
                field="partitions",
                limit=limits.PARTITIONS_PER_TOPIC_MAX,
            )
        rf = (
            self.config.default_replication_factor
            if replication_factor is None
            else replication_factor
        )
        if rf != 1:
            raise errors.InvalidRequest(
                f"replication_factor {rf} needs {rf} brokers; this cluster has 1",
                field="replication_factor",
                limit=1,
            )
        topic_config = default_topic_config(self.config)
        # Only an absent config means "defaults": `false` or `[]` is refused, not ignored.
        topic_config.update(validate_topic_config({} if config is None else config, self.config))
        async with self._admin_lock:
            catalogue = self.catalogue
            if name in catalogue.topics:
                raise errors.TopicAlreadyExists(f"topic {name!r} already exists", field="name")
            if len(catalogue.topics) >= limits.TOPICS_MAX:
                raise errors.InvalidRequest(
                    "too many topics", field="name", limit=limits.TOPICS_MAX
                )
            meta = TopicMeta(name, count, rf, topic_config, catalogue.next_topic_id)
            catalogue.next_topic_id += 1
            # Replicas open before the topic is published, so a concurrent produce
            # never sees a topic whose partitions are not there yet.
            await self._open_replicas(meta, range(count))
            catalogue.topics[name] = meta
            catalogue.save()
        _log.info("created topic %s with %d partitions", name, count)
        return self.describe_topic(name)

    def list_topics(self) -> list[TopicSummary]:
        return [
            TopicSummary(t.name, t.partitions, t.replication_factor)
            for t in sorted(self.catalogue.topics.values(), key=lambda t: t.name)
        ]

    def describe_topic(self, name: str) -> TopicDescription:
        meta = self._topic(name)
        parts = []
        for p in range(meta.partitions):
            r = self._replicas[(name, p)]
            parts.append(
                PartitionInfo(
                    p,
                    self.config.node_id,
                    (self.config.node_id,),
                    r.log_start_offset,
                    r.high_watermark,
                    r.log_end_offset,
                )
            )
        return TopicDescription(meta.name, meta.replication_factor, tuple(parts), dict(meta.config))

    async def alter_topic_config(self, name: str, updates: dict[str, Any]) -> TopicDescription:
        checked = validate_topic_config(updates, self.config)
        async with self._admin_lock:
            meta = self._topic(name)
            previous = dict(meta.config)
            meta.config.update(checked)
            # Storage settings take effect on open: the partitions reopen now.
            # The closed replica stays in place until its successor replaces it: a
            # produce to it meanwhile gets 503 with Retry-After, a describe its offsets.
            try:
                for p in range(meta.partitions):
                    await self._replicas[(name, p)].close()
                    await self._open_replica(meta, p)
            except Exception:
                meta.config = previous  # reopen what is closed with the old settings
                for p in range(meta.partitions):
                    if self._replicas[(name, p)].closed:
                        await self._open_replica(meta, p)
                raise
            self.catalogue.save()
        return self.describe_topic(name)

    async def add_partitions(self, name: str, count: int) -> TopicDescription:
        async with self._admin_lock:
            meta = self._topic(name)
            if not meta.partitions < count <= limits.PARTITIONS_PER_TOPIC_MAX:
                raise errors.InvalidRequest(
                    f"count must be more than the current {meta.partitions} and at most "
                    f"{limits.PARTITIONS_PER_TOPIC_MAX}",
                    field="count",
                    limit=limits.PARTITIONS_PER_TOPIC_MAX,
                )
            await self._open_replicas(meta, range(meta.partitions, count))
            meta.partitions = count
            self.catalogue.save()
        return self.describe_topic(name)

    async def delete_topic(self, name: str) -> None:
        async with self._admin_lock:
            meta = self._topic(name)
            del self.catalogue.topics[name]
            self.catalogue.save()  # first: a crash now leaves orphans, removed at start
            for p in range(meta.partitions):
                replica = self._replicas.pop((name, p))
                await replica.delete()
        _log.info("deleted topic %s", name)

    async def _topic_for_produce(self, name: str) -> TopicMeta:
        topic = self.catalogue.topics.get(name)
        if topic is not None:
            return topic
        if not self.config.auto_create_topics:
            raise errors.TopicNotFound(
                f"topic {name!r} does not exist and auto_create_topics is off", field="topic"
            )
        with contextlib.suppress(errors.TopicAlreadyExists):  # a concurrent produce made it
            await self.create_topic(name)
        return self._topic(name)

    # ------------------------------------------------------------------ produce

    def _record_limits(self, topic: TopicMeta) -> RecordLimits:
        return RecordLimits(
            record_bytes_max=topic.config["max_record_bytes"],
            batch_bytes_max=self.config.batch_bytes_max,
        )

    def _choose_partition(
        self, topic: TopicMeta, record: ProduceRecord, sticky: int, i: int
    ) -> int:
        if record.partition is not None:
            if not 0 <= record.partition < topic.partitions:
                raise errors.PartitionNotFound(
                    f"records[{i}].partition {record.partition} is not in "
                    f"0..{topic.partitions - 1}",
                    field=f"records[{i}].partition",
                    limit=topic.partitions - 1,
                )
            return record.partition
        if record.key is not None:
            return partition_for_key(record.key, topic.partitions)
        return sticky

    @staticmethod
    def _check_record(record: ProduceRecord, i: int, record_bytes_max: int) -> None:
        key_len = len(record.key) if record.key is not None else 0
        if key_len > log_limits.KEY_BYTES_MAX:
            raise errors.RecordTooLarge(
                f"records[{i}].key is {key_len} bytes; key_bytes_max is {log_limits.KEY_BYTES_MAX}",
                field=f"records[{i}].key",
                limit=log_limits.KEY_BYTES_MAX,
            )
        if len(record.headers) > log_limits.HEADER_COUNT_MAX:
            raise errors.RecordTooLarge(
                f"records[{i}] has {len(record.headers)} headers; header_count_max is "
                f"{log_limits.HEADER_COUNT_MAX}",
                field=f"records[{i}].headers",
                limit=log_limits.HEADER_COUNT_MAX,
            )
        size = key_len + (len(record.value) if record.value is not None else 0)
        for h in record.headers:
            hk = len(h.key.encode())
            if hk > log_limits.HEADER_KEY_BYTES_MAX:
                raise errors.RecordTooLarge(
                    f"records[{i}] header key is {hk} bytes; header_key_bytes_max is "
                    f"{log_limits.HEADER_KEY_BYTES_MAX}",
                    field=f"records[{i}].headers",
                    limit=log_limits.HEADER_KEY_BYTES_MAX,
                )
            size += hk + len(h.value)
        if size > record_bytes_max:
            raise errors.RecordTooLarge(
                f"records[{i}] is {size} bytes; max_record_bytes is {record_bytes_max}",
                field=f"records[{i}].value",
                limit=record_bytes_max,
            )

    async def produce(
        self,
        topic_name: str,
        records: Sequence[ProduceRecord],
        *,
        acks: Acks = "all",
    ) -> list[OffsetRun]:
        """Append records (JSON/text paths): choose partitions, build one batch per
        partition, commit them, answer one offset per record in request order."""
        if not records:
            raise errors.InvalidRequest("records must hold at least one record", field="records")
        topic = await self._topic_for_produce(topic_name)
        limit = topic.config["max_record_bytes"]
        sticky = self._sticky.partition(topic.partitions)
        self._sticky.next_batch()
        now = wall_ms()
        by_partition: dict[int, list[tuple[int, Record]]] = {}
        for i, r in enumerate(records):
            self._check_record(r, i, limit)
            p = self._choose_partition(topic, r, sticky, i)
            ts = now if r.timestamp_ms is None else r.timestamp_ms
            by_partition.setdefault(p, []).append((i, Record(r.key, r.value, r.headers, ts)))
        batches: dict[int, bytes] = {}
        for p, items in by_partition.items():
            batch = encode_batch([rec for _, rec in items])
            if len(batch) > self.config.batch_bytes_max:
                raise errors.RecordTooLarge(
                    f"the records for partition {p} make a {len(batch)}-byte batch; "
                    f"batch_bytes_max is {self.config.batch_bytes_max}",
                    field="records",
                    limit=self.config.batch_bytes_max,
                )
            batches[p] = batch
        base_offsets = await self._append_batches(topic, batches, acks)
        placed: list[tuple[int, int | None]] = [(0, None)] * len(records)
        for p, items in by_partition.items():
            base = base_offsets[p]
            for j, (i, _) in enumerate(items):
                placed[i] = (p, None if base is None else base + j)
        runs: list[OffsetRun] = []
        for p, offset in placed:
            last = runs[-1] if runs else None
            if (
                last is not None
                and last.partition == p
                and (offset is None) == (last.base_offset is None)
                and (offset is None or offset == last.base_offset + last.count)  # type: ignore[operator]
            ):
                runs[-1] = OffsetRun(p, last.base_offset, last.count + 1)
            else:
                runs.append(OffsetRun(p, offset, 1))
        return runs

    async def produce_batch(
        self, topic_name: str, batch: bytes, *, partition: int | None, acks: Acks = "all"
    ) -> list[OffsetRun]:
        """Append a ready RecordBatch from a client (the binary fast path), as is."""
        topic = await self._topic_for_produce(topic_name)
        try:
            header = validate_batch(batch, self._record_limits(topic))
        except log_errors.LogError as exc:
            raise translate(exc) from exc
        if partition is None:
            partition = self._sticky.partition(topic.partitions)
            self._sticky.next_batch()
        elif not 0 <= partition < topic.partitions:
            raise errors.PartitionNotFound(
                f"partition {partition} is not in 0..{topic.partitions - 1}",
                field="partition",
                limit=topic.partitions - 1,
            )
        base = (await self._append_batches(topic, {partition: batch}, acks))[partition]
        return [OffsetRun(partition, base, header.record_count)]

    async def _append_batches(
        self, topic: TopicMeta, batches: dict[int, bytes], acks: Acks
    ) -> dict[int, int | None]:
        append_time = wall_ms() if topic.config["timestamp_type"] == "log_append" else None
        replicas = {p: self._replica(topic.name, p) for p in batches}
        # Check every partition can take its batch before queueing any: a refusal
        # after some were queued would commit part of a request the client retries.
        for p, b in batches.items():
            replicas[p].check_capacity(len(b))
        futures = {p: replicas[p].append(b, append_time) for p, b in batches.items()}
        if acks == "0":
            for f in futures.values():
                f.add_done_callback(_log_fire_and_forget_failure)
            return {p: None for p in futures}
        # Wait for all of them: each outcome is known before the request is answered.
        outcomes = await asyncio.gather(*futures.values(), return_exceptions=True)
        out: dict[int, int | None] = {}
        for p, outcome in zip(futures, outcomes, strict=True):
            if isinstance(outcome, log_errors.LogError):
                raise translate(outcome) from outcome
            if isinstance(outcome, BaseException):
                raise outcome
            out[p] = outcome.base_offset
        return out

    # ------------------------------------------------------------------ fetch

    async def resolve_offset(
        self,
        topic: str,
        partition: int,
        *,
        offset: int | Literal["earliest", "latest"],
        timestamp_ms: int | None = None,
    ) -> int:
        replica = self._replica(topic, partition)
        if timestamp_ms is not None:
            found = await replica.offset_for_timestamp(timestamp_ms)
            return replica.high_watermark if found is None else found
        if offset == "earliest":
            return replica.log_start_offset
        if offset == "latest":
            return replica.high_watermark
        return offset

    async def fetch(
        self,
        topic: str,
        partition: int,
        *,
        offset: int,
        max_bytes: int,
        max_records: int,
        wait_ms: int,
        raw: bool,
    ) -> FetchResult:
        """Committed records from `offset` (long-polls up to wait_ms when there are none)."""
        replica = self._replica(topic, partition)
        if not replica.log_start_offset <= offset <= replica.log_end_offset:
            raise errors.OffsetOutOfRange(
                f"offset {offset} is outside [{replica.log_start_offset}, {replica.log_end_offset}]",
                offset=offset,
                log_start_offset=replica.log_start_offset,
                log_end_offset=replica.log_end_offset,
            )
        if offset >= replica.high_watermark and wait_ms > 0:
            if self._waiting_fetches >= self.config.waiting_fetches_max:
                raise errors.Backpressure(
                    f"{self._waiting_fetches} fetches are waiting (waiting_fetches_max)",
                    limit=self.config.waiting_fetches_max,
                )
            self._waiting_fetches += 1
            try:
                await replica.wait_for_commit_past(offset, wait_ms / 1000)
            finally:
                self._waiting_fetches -= 1
        if replica.closed:
            # Shutting down (or the topic was altered or deleted): answer the waiting
            # fetch as if its wait had run out, rather than failing it.
            return FetchResult(
                topic, partition, offset, offset, replica.high_watermark, replica.log_start_offset
            )
        try:
            if raw:
                result = await replica.read(offset, max_bytes)
                return FetchResult(
                    topic,
                    partition,
                    offset,
                    result.next_offset,
                    result.high_watermark,
                    result.log_start_offset,
                    raw=result,
                )
            recs, next_offset, hw, lso = await replica.read_records(offset, max_bytes, max_records)
        except log_errors.LogError as exc:
            raise translate(exc) from exc
        return FetchResult(topic, partition, offset, next_offset, hw, lso, records=recs)

    async def list_offsets(
        self, topic: str, partition: int, timestamp_ms: int | None
    ) -> OffsetsResult:
        replica = self._replica(topic, partition)
        found = None
        if timestamp_ms is not None:
            found = await replica.offset_for_timestamp(timestamp_ms)
        return OffsetsResult(partition, replica.log_start_offset, replica.high_watermark, found)

    def cluster(self) -> dict[str, Any]:
        return {
            "cluster_id": self.cluster_id,
            "node_id": self.config.node_id,
            "brokers": [{"node_id": self.config.node_id, "http_addr": self.config.http_addr}],
        }

    @property
    def waiting_fetches(self) -> int:
        return self._waiting_fetches


def _log_fire_and_forget_failure(future: asyncio.Future[Any]) -> None:
    if not future.cancelled() and future.exception() is not None:
        _log.warning("acks=0 append failed: %s", future.exception())
