"""AsyncProducer: batches records per partition and posts each batch as one RecordBatch.

How a record travels (the sync `Producer` runs exactly this on its private loop):

1. `send` builds a `Record` (timestamp: now, unless given) and learns the topic's
   partition count from `GET /v1/topics/{topic}` (cached; refreshed in the background
   every METADATA_MAX_AGE_MS).
2. A topic that does not exist yet is not created by the client: the first record is
   posted alone as JSON (`POST /v1/topics/{topic}/records`), which the broker answers by
   creating the topic if its `auto_create_topics` is on, or with 404 `topic_not_found`
   (the record's future fails with `TopicNotFound`). Concurrent sends to that topic wait
   for this to finish, so records keep their order. Create topics up front with
   `Admin.create_topic` to choose their partitions and config.
3. The record reserves its size in the producer's buffer (bounded by buffer_bytes) and
   joins the open batch of its partition (`_accumulator.py` says which).
4. The sender task closes batches that are full, have lingered linger_ms, or are flushed,
   and posts each with `Content-Type: application/vnd.dmq.batch`,
   `?partition=N&acks=...`, encoded with `log.records.encode_batch` (zstd when asked: the
   broker stores it compressed as it is). One request per partition is in flight at a
   time, so a partition's records are appended in `send` order even across retries.
5. The answer (one offset per record) resolves each record's future with its
   `RecordMetadata`; an error fails every record of the batch with the same `DmqError`.
   Retriable errors were retried first (see `_http.py`), for as long as the batch's
   deadline allows: delivery_timeout_ms (120 s by default, as Kafka's
   delivery.timeout.ms) after the `send` of its first record. Steps 1-4 count against
   it too; a batch whose deadline passed while it waited behind another of its partition
   fails with `RequestTimeout` without being sent. `retries` optionally caps the count.

Idempotence (`idempotent=True`, or a `transactional_id`): before its first batch the
producer gets a producer id and epoch (`POST /v1/producers`); each batch carries them and
the sequence number of its first record, counted per partition. A retry sends the very
same bytes, so the partition answers a batch it already wrote with its original offsets
and writes nothing (dmq/partition/producers.py): retries of timeouts and lost answers, even
across a leader's crash, leave no duplicates. A batch that fails for good (its
delivery_timeout_ms passed, or its `retries` ran out) may or may not have been written;
the producer then takes a new epoch (a new id without a transactional id) so that its
next batches start a fresh sequence instead of being refused as out of order. Another
producer started with the same transactional id fences this one: its batches then fail
with `ProducerFenced`.

Transactions (a `transactional_id`, as Kafka's transactional producer): every send is
inside a transaction (`begin_transaction` ... `commit_transaction` or
`abort_transaction`; a send outside one raises RuntimeError), batches carry the
transactional attribute and each request names the transactional id, so that the broker
adds the partition to the transaction first. `_transactions.py` has the steps.
`transaction_commit_wait` says what a commit or abort waits for: "decision" (default)
or "complete" (every marker written: read-your-writes for read_committed readers).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import random
import ssl
import time
from collections.abc import Coroutine, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from dmq.client import _limits, _transactions
from dmq.client._accumulator import ProducerBatch, RecordAccumulator, record_size_bytes
from dmq.client._http import BATCH, Deadline, Transport, check_timeouts, topic_path
from dmq.client._parse import parse_description
from dmq.client._types import RecordMetadata, TopicPartition
from dmq.errors import (
    Backpressure,
    DmqError,
    InvalidRequest,
    PartitionDecommissioned,
    PartitionNotFound,
    ProducerFenced,
    RecordTooLarge,
    TopicNotFound,
)
from dmq.types import PARTITION_COUNT_HEADER
from log.errors import LogError
from log.records import Codec, Header, Record, encode_batch

Acks = Literal["all", "1", "0", 1, 0]
Compression = Literal["none", "zstd"]
Bytesish = bytes | bytearray | memoryview | str
HeadersArg = Sequence[tuple[str, Bytesish]] | Mapping[str, Bytesish] | None


def now_ms() -> int:
    return time.time_ns() // 1_000_000


def to_bytes(data: Bytesish | None, what: str) -> bytes | None:
    """bytes as they are; str as UTF-8; None stays None (no key / a tombstone)."""
    if data is None or isinstance(data, bytes):
        return data
    if isinstance(data, str):
        return data.encode("utf-8")
    if isinstance(data, bytearray | memoryview):
        return bytes(data)
    raise TypeError(f"{what} must be bytes, str or None, not {type(data).__name__}")


def to_headers(headers: HeadersArg) -> tuple[Header, ...]:
    if headers is None:
        return ()
    items = headers.items() if isinstance(headers, Mapping) else headers
    out = []
    for key, value in items:
        if not isinstance(key, str):
            raise TypeError(f"header keys must be str, not {type(key).__name__}")
        out.append(Header(key, to_bytes(value, f"header {key!r}") or b""))
    return tuple(out)


def normalise_acks(acks: Acks) -> str:
    text = str(acks)
    if text not in ("all", "1", "0"):
        raise ValueError(f'acks must be "all", "1" or "0", got {acks!r}')
    return text


@dataclass(frozen=True, slots=True)
class _TopicMetadata:
    partition_count: int
    fetched_s: float
    active: tuple[int, ...] = ()  # partitions taking records; () = all


class AsyncProducer:
    """Sends records to topics in batches (see the module docstring for the steps).

    Use it as `async with AsyncProducer(url) as producer:` or call `close()`. It belongs
    to the event loop it is first used in and is not thread-safe; the sync `Producer` is.

    `send` raises only for programming errors (TypeError, ValueError, RuntimeError once
    closed); everything the broker or the network says arrives through the future.
    """

    def __init__(
        self,
        url: str,
        *,
        acks: Acks = "all",
        linger_ms: int = _limits.LINGER_MS_DEFAULT,
        batch_bytes: int = _limits.BATCH_BYTES_DEFAULT,
        compression: Compression = "none",
        retries: int | None = _limits.RETRIES_DEFAULT,
        retry_backoff_ms: int = _limits.RETRY_BACKOFF_MS_DEFAULT,
        request_timeout_ms: int = _limits.REQUEST_TIMEOUT_MS_DEFAULT,
        delivery_timeout_ms: int = _limits.DELIVERY_TIMEOUT_MS_DEFAULT,
        default_api_timeout_ms: int = _limits.DEFAULT_API_TIMEOUT_MS_DEFAULT,
        buffer_bytes: int = _limits.BUFFER_BYTES_DEFAULT,
        idempotent: bool = False,
        transactional_id: str | None = None,
        transaction_timeout_ms: int = _transactions.TRANSACTION_TIMEOUT_MS_DEFAULT,
        transaction_commit_wait: _transactions.CommitWait = "decision",
        tls: ssl.SSLContext | None = None,
        token: str | None = None,
    ) -> None:
        if not 1 <= batch_bytes <= _limits.BATCH_BYTES_MAX:
            raise ValueError(f"batch_bytes must be in 1..{_limits.BATCH_BYTES_MAX}")
        if buffer_bytes < batch_bytes:
            raise ValueError("buffer_bytes must be >= batch_bytes")
        if compression not in ("none", "zstd"):
            raise ValueError(f'compression must be "none" or "zstd", got {compression!r}')
        check_timeouts(
            request_timeout_ms=request_timeout_ms,
            delivery_timeout_ms=delivery_timeout_ms,
        )
        if delivery_timeout_ms < linger_ms + request_timeout_ms:
            # As Kafka: a record must get at least one whole attempt after it lingered.
            raise ValueError(
                f"delivery_timeout_ms ({delivery_timeout_ms}) must be >= linger_ms "
                f"({linger_ms}) + request_timeout_ms ({request_timeout_ms})"
            )
        self._delivery_timeout_ms = delivery_timeout_ms
        self._transport = Transport(
            url,
            request_timeout_ms=request_timeout_ms,
            retries=retries,
            retry_backoff_ms=retry_backoff_ms,
            api_timeout_ms=default_api_timeout_ms,
            tls=tls,
            token=token,
        )
        self._acks = normalise_acks(acks)
        self._codec = Codec.ZSTD if compression == "zstd" else Codec.NONE
        self._request_timeout_ms = request_timeout_ms
        self._buffer_bytes_max = buffer_bytes
        self._buffered_bytes = 0  # reserved by records not yet acknowledged
        self._space_freed = asyncio.Event()
        self._reserve_lock = asyncio.Lock()  # held while a send waits for room
        # Sends now waiting for a topic's metadata or for room (_enqueue): while there are
        # any, later sends queue behind them through the same locks, in call order.
        self._slow_sends = 0
        # A random start spreads the unkeyed records of many producers over partitions.
        self._accumulator: RecordAccumulator[asyncio.Future[RecordMetadata]] = RecordAccumulator(
            batch_bytes=batch_bytes,
            linger_ms=linger_ms,
            sticky_start=random.randrange(1 << 16),  # noqa: S311 - spreads load, not a secret
        )
        self._metadata: dict[str, _TopicMetadata] = {}
        self._topic_locks: dict[str, asyncio.Lock] = {}
        self._refreshing: set[str] = set()
        self._in_flight: set[TopicPartition] = set()
        self._tasks: set[asyncio.Task[None]] = set()
        self._undelivered: set[asyncio.Future[RecordMetadata]] = set()
        self._wake = asyncio.Event()
        self._sender: asyncio.Task[None] | None = None
        self._flushing = 0
        self._closed = False
        self._idempotent = idempotent or transactional_id is not None
        self._transactional_id = transactional_id
        self._producer: tuple[int, int] | None = None  # (producer_id, epoch) once known
        self._producer_lock = asyncio.Lock()
        self._sequences: dict[TopicPartition, int] = {}  # the next sequence per partition
        # With a transactional_id, every send is inside a transaction (_transactions.py).
        self._txn = (
            None
            if transactional_id is None
            else _transactions.Transaction(
                self._transport, transactional_id, transaction_timeout_ms, transaction_commit_wait
            )
        )

    @property
    def url(self) -> str:
        return self._transport.url

    async def __aenter__(self) -> AsyncProducer:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    # ------------------------------------------------------------------ send

    async def send(
        self,
        topic: str,
        value: Bytesish | None,
        key: Bytesish | None = None,
        headers: HeadersArg = None,
        partition: int | None = None,
        timestamp_ms: int | None = None,
    ) -> asyncio.Future[RecordMetadata]:
        """Queue one record; the future resolves once the broker acknowledged it.

        `value=None` is a tombstone; str keys, values and header values are sent as UTF-8.
        Waits (without blocking the loop) for the topic's metadata on first use and for
        room in the buffer when it is full.
        """
        record = self._prepare(topic, value, key, headers, partition, timestamp_ms)
        return await self._enqueue(topic, record, partition)

    # ------------------------------------------------------------------ transactions

    async def begin_transaction(self) -> None:
        """Open a transaction (local: the broker learns of it with the first send)."""
        if self._txn is None:
            raise RuntimeError("transactions need Producer(url, transactional_id=...)")
        await self.producer_identity()  # fences older instances now, as init_transactions
        self._txn.begin()

    async def send_offsets_to_transaction(
        self,
        offsets: Mapping[TopicPartition | tuple[str, int], int],
        consumer: _transactions.GroupMember | str,
    ) -> None:
        """Commit a consumer group's offsets (the next offset to read per partition) only
        if this transaction commits; `consumer` is the group consumer (its member id and
        generation are checked), or a group name for a group without members."""
        if self._txn is None:
            raise RuntimeError("transactions need Producer(url, transactional_id=...)")
        await self._txn.send_offsets(await self.producer_identity(), offsets, consumer)

    async def commit_transaction(self) -> None:
        """Flush, then commit: every record sent since begin_transaction becomes visible
        to read_committed consumers in every partition at once. Returns once the decision
        is durable (`transaction_commit_wait="decision"`, the default, as Kafka's: the
        markers follow, so a read just after may not see it yet) or once every marker is
        written (`"complete"`). Raises the error of a failed send (then
        abort_transaction) or ProducerFenced."""
        if self._txn is None:
            raise RuntimeError("transactions need Producer(url, transactional_id=...)")
        self._txn.check_open()
        await self.flush()
        answer = await self._txn.end(await self.producer_identity(), commit=True)
        await self._adopt_next_identity(answer)

    async def abort_transaction(self) -> None:
        """Flush, then abort: no record sent since begin_transaction is ever visible to
        read_committed consumers."""
        if self._txn is None:
            raise RuntimeError("transactions need Producer(url, transactional_id=...)")
        self._txn.check_open()
        await self.flush()
        failed = self._txn.error is not None
        answer = await self._txn.end(await self.producer_identity(), commit=False)
        if not await self._adopt_next_identity(answer) and failed:
            # Sequences unknown after a failed send, and the abort gave no new epoch
            # (nothing reached the coordinator): a new epoch starts them over.
            async with self._producer_lock:
                self._producer = None

    async def _adopt_next_identity(self, answer: dict[str, Any]) -> bool:
        """After a commit or abort: the producer id and epoch the coordinator bumped to
        (KIP-890 part 2), with every sequence starting over; False if the answer names
        none (nothing was decided) or the same (a decision from before the bump)."""
        if "next_producer_id" not in answer:
            return False
        async with self._producer_lock:
            following = (int(answer["next_producer_id"]), int(answer["next_producer_epoch"]))
            changed = following != self._producer
            if changed:
                self._producer = following
                self._sequences.clear()
        return changed

    def _prepare(
        self,
        topic: str,
        value: Bytesish | None,
        key: Bytesish | None,
        headers: HeadersArg,
        partition: int | None,
        timestamp_ms: int | None,
    ) -> Record:
        """Check the arguments and build the record; the part of `send` that cannot wait,
        so the sync `Producer` runs it in the caller's thread and raises there."""
        if self._closed:
            raise RuntimeError("the producer is closed")
        if not isinstance(topic, str) or not topic:
            raise ValueError("topic must be a non-empty str")
        if partition is not None and (not isinstance(partition, int) or partition < 0):
            raise ValueError(f"partition must be an int >= 0, got {partition!r}")
        if self._txn is not None:
            self._txn.check_open()
        return Record(
            key=to_bytes(key, "key"),
            value=to_bytes(value, "value"),
            headers=to_headers(headers),
            timestamp_ms=now_ms() if timestamp_ms is None else int(timestamp_ms),
        )

    async def _enqueue(
        self, topic: str, record: Record, partition: int | None
    ) -> asyncio.Future[RecordMetadata]:
        """Steps 1-3 of the module docstring. Sends of one task (or one thread, through
        the sync `Producer`) join their batches in call order, whatever they wait for."""
        if self._closed:
            raise RuntimeError("the producer is closed")
        if self._txn is not None:
            self._txn.check_open()
        loop = asyncio.get_running_loop()
        now_s = loop.time()
        future: asyncio.Future[RecordMetadata] = loop.create_future()
        deadline = Deadline.after(self._delivery_timeout_ms, "delivery_timeout_ms", now_s)
        # Tracked from now, so that a flush also waits for records still waiting for
        # metadata or buffer room; dropped where the record ends (its batch's send, or
        # below), not by a done-callback: that was a loop callback per record.
        self._undelivered.add(future)
        size = record_size_bytes(record)
        meta = self._metadata.get(topic)
        if (
            meta is not None
            and not self._slow_sends
            and (partition is None or partition < meta.partition_count)
            and self._fits(size)
        ):
            # Nothing to wait for, and no earlier send still waiting (for metadata or room)
            # that this one could overtake: what the locks below would do, without them.
            self._maybe_refresh_in_background(topic, meta, now_s)
            self._buffered_bytes += size
            count = meta.partition_count
        else:
            self._slow_sends += 1
            try:
                known = await self._partition_count(topic, record, partition, future, deadline)
                if known is None:  # the record went alone, as JSON, to a new topic
                    self._undelivered.discard(future)
                    return future
                count = known
                if partition is not None and partition >= count:
                    count = await self._refresh_metadata(topic, deadline)
                    if partition >= count:
                        raise PartitionNotFound(
                            f"partition {partition} is not in 0..{count - 1} of topic {topic!r}",
                            field="partition",
                            limit=count - 1,
                        )
                await self._reserve(size, deadline)
            except DmqError as error:
                future.set_exception(error)
                self._undelivered.discard(future)
                return future
            except BaseException:
                # Cancelled (or a bug) while waiting: the record is not sent, and a flush
                # must not wait for it.
                future.cancel()
                self._undelivered.discard(future)
                raise
            finally:
                self._slow_sends -= 1
            now_s = loop.time()
            meta = self._metadata.get(topic)
        _, changed = self._accumulator.append(
            topic,
            record,
            future,
            partition_count=count,
            partition=partition,
            now_s=now_s,
            active=meta.active if meta is not None else None,
            deadline_s=deadline.at_s,
        )
        self._ensure_sender()
        if changed:
            self._wake.set()
        return future

    async def send_and_wait(
        self,
        topic: str,
        value: Bytesish | None,
        key: Bytesish | None = None,
        headers: HeadersArg = None,
        partition: int | None = None,
        timestamp_ms: int | None = None,
    ) -> RecordMetadata:
        """`send`, then wait for the acknowledgement (lingers, so prefer `send` in loops)."""
        future = await self.send(topic, value, key, headers, partition, timestamp_ms)
        return await future

    async def flush(self) -> None:
        """Send every queued record now and wait until each is acknowledged or failed."""
        self._flushing += 1
        self._wake.set()
        try:
            pending = list(self._undelivered)
            if pending:
                await asyncio.wait(pending)
        finally:
            self._flushing -= 1

    async def close(self) -> None:
        """Flush, then release the connection pool. Idempotent."""
        if self._closed:
            return
        self._closed = True
        try:
            await self.flush()
        finally:
            if self._sender is not None:
                self._sender.cancel()
                await asyncio.gather(self._sender, return_exceptions=True)
            tasks = list(self._tasks)
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            await self._transport.close()

    # ------------------------------------------------------------------ metadata

    async def _partition_count(
        self,
        topic: str,
        record: Record,
        partition: int | None,
        future: asyncio.Future[RecordMetadata],
        deadline: Deadline,
    ) -> int | None:
        """The topic's partition count; None if the topic was missing and `record` was
        therefore sent alone as JSON (step 2), which settled `future`."""
        lock = self._topic_locks.get(topic)
        if lock is None:
            lock = self._topic_locks[topic] = asyncio.Lock()
        # Through the lock, which is FIFO: a send must not overtake earlier ones still
        # waiting here for the topic's metadata (_enqueue comes here only if some send
        # waits, or the metadata is missing).
        async with lock:
            meta = self._metadata.get(topic)
            if meta is not None:
                self._maybe_refresh_in_background(topic, meta, asyncio.get_running_loop().time())
                return meta.partition_count
            try:
                return await self._refresh_metadata(topic, deadline)
            except TopicNotFound:
                pass
            future.set_result(await self._send_json(topic, record, partition, deadline))
            with contextlib.suppress(TopicNotFound):  # deleted again: the next send sees it
                await self._refresh_metadata(topic)
            return None

    async def _refresh_metadata(self, topic: str, deadline: Deadline | None = None) -> int:
        response = await self._transport.request("GET", topic_path(topic), deadline=deadline)
        description = parse_description(response.json())
        count = description.partition_count
        if count < 1:
            raise DmqError(f"topic {topic!r} is described with no partitions")
        active = tuple(p.partition for p in description.partitions if p.status == "active")
        self._metadata[topic] = _TopicMetadata(
            count, asyncio.get_running_loop().time(), active if len(active) < count else ()
        )
        return count

    def _maybe_refresh_in_background(self, topic: str, meta: _TopicMetadata, now_s: float) -> None:
        age_s = now_s - meta.fetched_s
        if age_s * 1000 < _limits.METADATA_MAX_AGE_MS or topic in self._refreshing:
            return
        self._refreshing.add(topic)

        async def refresh() -> None:
            try:
                await self._refresh_metadata(topic)
            except TopicNotFound:
                self._metadata.pop(topic, None)
            except DmqError:
                pass  # keep the old count; the next send past the age tries again
            finally:
                self._refreshing.discard(topic)

        self._spawn(refresh())

    async def _send_json(
        self, topic: str, record: Record, partition: int | None, deadline: Deadline
    ) -> RecordMetadata:
        """Post one record as JSON (base64): the broker auto-creates a missing topic."""

        def b64(data: bytes | None) -> str | None:
            return None if data is None else base64.b64encode(data).decode("ascii")

        item: dict[str, Any] = {
            "key": b64(record.key),
            "value": b64(record.value),
            "headers": [{"key": h.key, "value": b64(h.value)} for h in record.headers],
            "timestamp": record.timestamp_ms,
        }
        body: dict[str, Any] = {"records": [item], "value_encoding": "base64"}
        if self._idempotent:
            # Without a partition the broker picks it (the key's, as the batch path would)
            # in a topic this producer has never written to: its first sequence there is 0,
            # and the answer says which partition now expects 1.
            producer_id, epoch = await self.producer_identity(deadline)
            sequence = 0
            if partition is not None:
                sequence = self._sequences.get(TopicPartition(topic, partition), 0)
            body |= {"producer_id": producer_id, "producer_epoch": epoch, "base_sequence": sequence}
        if partition is not None:
            item["partition"] = partition
        params = {"acks": self._acks}
        if self._txn is not None:
            params |= self._txn.params()
            self._txn.added = True
        try:
            response = await self._transport.request(
                "POST",
                topic_path(topic) + "/records",
                params=params,
                json_body=body,
                deadline=deadline,
            )
        except DmqError as error:
            if self._txn is not None:
                self._txn.failed(error)
                raise
            if self._idempotent and partition is None:
                # It may have been written to a partition we cannot name: a new identity
                # (new id, or the next epoch) starts every sequence over, so a later
                # record cannot pass for a retry of this one.
                async with self._producer_lock:
                    self._producer = None
            raise
        sent = _metadata_from_answer(topic, response.json(), 1, None)[0]
        if self._idempotent:
            self._sequences[TopicPartition(topic, sent.partition)] = sequence + 1
        return sent

    # ------------------------------------------------------------------ buffer

    async def _reserve(self, size: int, record_deadline: Deadline) -> None:
        """Take `size` bytes of the buffer, waiting up to request_timeout_ms for room (less
        if the record's delivery deadline comes first)."""
        if size > self._buffer_bytes_max:
            raise RecordTooLarge(
                f"a record of about {size} bytes does not fit in buffer_bytes "
                f"{self._buffer_bytes_max}",
                field="value",
                limit=self._buffer_bytes_max,
            )
        loop = asyncio.get_running_loop()
        deadline = min(loop.time() + self._request_timeout_ms / 1000, record_deadline.at_s)
        # FIFO, and free of yields when nobody waits: sends take room in call order.
        async with self._reserve_lock:
            while not self._fits(size):
                self._space_freed.clear()
                self._wake.set()  # make sure the sender is draining
                try:
                    await asyncio.wait_for(
                        self._space_freed.wait(), max(0.0, deadline - loop.time())
                    )
                except TimeoutError:
                    raise Backpressure(
                        f"the producer's buffer ({self._buffer_bytes_max} bytes) stayed full "
                        f"for {self._request_timeout_ms} ms (or the record's delivery_timeout_ms "
                        f"{self._delivery_timeout_ms} ended)",
                        limit=self._buffer_bytes_max,
                    ) from None
            self._buffered_bytes += size

    def _fits(self, size: int) -> bool:
        return self._buffered_bytes + size <= self._buffer_bytes_max

    def _release(self, size: int) -> None:
        self._buffered_bytes -= size
        self._space_freed.set()

    # ------------------------------------------------------------------ sender

    def _spawn(self, coroutine: Coroutine[Any, Any, None]) -> None:
        task: asyncio.Task[None] = asyncio.get_running_loop().create_task(coroutine)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _ensure_sender(self) -> None:
        if self._sender is None:
            self._sender = asyncio.get_running_loop().create_task(self._run_sender())
            self._sender.add_done_callback(self._sender_stopped)

    def _sender_stopped(self, task: asyncio.Task[None]) -> None:
        # Stopped by a bug, or cancelled (close() cancels it once nothing is left; a
        # caller's cancellation, e.g. asyncio.run cancelling every task left when its main
        # coroutine fails, may do it earlier): what still waits will never be sent, so it
        # fails now rather than hang a flush or close for ever.
        if task.cancelled():
            error = DmqError("the producer's sender was cancelled before these records were sent")
        elif task.exception() is not None:
            error = DmqError(f"the producer's sender stopped: {task.exception()!r}")
        else:
            return
        _fail(list(self._undelivered), error)
        self._undelivered.clear()

    async def _run_sender(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            self._wake.clear()
            self._accumulator.close_expired(loop.time(), force=self._flushing > 0)
            for batch in self._accumulator.take_sendable(self._in_flight):
                self._in_flight.add(batch.topic_partition)
                self._spawn(self._send_batch(batch))
            deadline_s = self._accumulator.next_deadline_s()
            timeout_s = None if deadline_s is None else max(0.0, deadline_s - loop.time())
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), timeout_s)

    async def producer_identity(self, deadline: Deadline | None = None) -> tuple[int, int]:
        """(producer_id, producer_epoch), asked of the broker on first use (retried until
        `deadline`, else default_api_timeout_ms)."""
        async with self._producer_lock:
            if self._producer is None:
                body = {} if self._transactional_id is None else {
                    "transactional_id": self._transactional_id
                }  # fmt: skip
                answer = (
                    await self._transport.request(
                        "POST", "/v1/producers", json_body=body, deadline=deadline
                    )
                ).json()
                self._producer = (int(answer["producer_id"]), int(answer["producer_epoch"]))
                self._sequences.clear()
            return self._producer

    async def _encode(
        self, batch: ProducerBatch[asyncio.Future[RecordMetadata]], deadline: Deadline
    ) -> bytes:
        try:
            if not self._idempotent:
                return encode_batch(batch.records, codec=self._codec)
            producer_id, epoch = await self.producer_identity(deadline)
            tp = batch.topic_partition
            sequence = self._sequences.get(tp, 0)
            self._sequences[tp] = sequence + len(batch.records)
            return encode_batch(
                batch.records, codec=self._codec, producer_id=producer_id,
                producer_epoch=epoch, base_sequence=sequence,
                is_transactional=self._txn is not None,
            )  # fmt: skip
        except LogError as exc:
            raise InvalidRequest(f"cannot encode the batch: {exc}", field="records") from exc

    def _maybe_forget_count(self, topic: str, raw_count: str | None) -> None:
        """The broker said the topic has another partition count (partitions were added):
        forget the cached one, so that the next send re-reads it and keys map with the
        new count (records sent before keep their partitions, as in Kafka)."""
        count = _parse_count(raw_count)
        meta = self._metadata.get(topic)
        if count is not None and meta is not None and meta.partition_count != count:
            self._metadata.pop(topic, None)

    async def _send_batch(self, batch: ProducerBatch[asyncio.Future[RecordMetadata]]) -> None:
        tp = batch.topic_partition
        deadline = Deadline(batch.deadline_s, "delivery_timeout_ms", self._delivery_timeout_ms)
        try:
            if deadline.remaining_ms() <= 0:  # it waited behind a batch retried that long
                where = f"{len(batch.records)} record(s) for {tp.topic}-{tp.partition}"
                raise deadline.expired(where)
            body = await self._encode(batch, deadline)
            params = {"partition": str(tp.partition), "acks": self._acks}
            if self._txn is not None:
                params |= self._txn.params()
                self._txn.added = True
            response = await self._transport.request(
                "POST",
                topic_path(tp.topic) + "/records",
                params=params,
                body=body,
                content_type=BATCH,
                deadline=deadline,
            )
            results = _metadata_from_answer(
                tp.topic, response.json(), len(batch.records), tp.partition
            )
            self._maybe_forget_count(tp.topic, response.headers.get(PARTITION_COUNT_HEADER))
            for future, metadata in zip(batch.waiters, results, strict=True):
                if not future.done():
                    future.set_result(metadata)
        except asyncio.CancelledError:
            # Cancelled with the caller's tasks (see _sender_stopped): unknown, not pending.
            _fail(
                batch.waiters,
                DmqError("cancelled while the batch was sent: its delivery is unknown"),
            )
            raise
        except DmqError as error:
            if isinstance(error, TopicNotFound | PartitionNotFound | PartitionDecommissioned):
                self._metadata.pop(tp.topic, None)  # deleted, shrunk or retired: look again
            if self._txn is not None:
                self._txn.failed(error)  # the transaction must abort; then a new epoch
            elif self._idempotent and not isinstance(error, ProducerFenced):
                self._producer = None  # its sequence is now unknown: start a new epoch
            _fail(batch.waiters, error)
        finally:
            self._undelivered.difference_update(batch.waiters)
            self._release(batch.size_bytes)
            self._in_flight.discard(tp)
            self._wake.set()


def _fail(waiters: Iterable[asyncio.Future[RecordMetadata]], error: DmqError) -> None:
    """Every record still waiting in `waiters` fails with `error`."""
    for future in waiters:
        if not future.done():
            future.set_exception(error)


def _parse_count(raw: str | None) -> int | None:
    return int(raw) if raw is not None and raw.isascii() and raw.isdigit() else None


def _metadata_from_answer(
    topic: str, answer: Any, record_count: int, partition: int | None
) -> list[RecordMetadata]:
    """`{"offsets": [{"partition", "offset"}, ...]}`, one entry per record in order.

    Also accepts a single entry for a whole batch (its base offset): the README's
    "one entry per record" is what the broker does, this only tolerates the other.
    """
    offsets = answer.get("offsets") if isinstance(answer, dict) else None
    if not isinstance(offsets, list) or len(offsets) not in (record_count, 1):
        raise DmqError(f"unexpected produce answer for {record_count} records: {answer!r:.200}")
    out = []
    for i in range(record_count):
        entry = offsets[i] if len(offsets) == record_count else offsets[0]
        p = entry.get("partition", partition) if isinstance(entry, dict) else None
        offset = entry.get("offset") if isinstance(entry, dict) else None
        if not isinstance(p, int) or not (offset is None or isinstance(offset, int)):
            raise DmqError(f"unexpected produce answer entry: {entry!r:.200}")
        if offset is not None and len(offsets) != record_count:
            offset += i
        out.append(RecordMetadata(topic, p, offset))
    return out
