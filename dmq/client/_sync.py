"""The blocking API: `Producer`, `Consumer` and `Admin` run their async twins on a loop.

Each sync object owns one daemon thread running a private asyncio event loop; every
method hands a coroutine of the async object to that loop and waits for its result
(`asyncio.run_coroutine_threadsafe`). The protocol logic therefore exists once, in
`AsyncProducer`, `AsyncConsumer` and `AsyncAdmin`; this module only carries calls and
results across the thread boundary. The sync objects are thread-safe (calls from several
threads are serialised on the loop) and may be used from inside another event loop
(they block it while they wait). Close them, or use them as context managers, to stop
the thread.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import ssl
import threading
from collections import deque
from collections.abc import Callable, Coroutine, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

from dmq.client import _limits
from dmq.client._admin import AsyncAdmin
from dmq.client._consumer import AsyncConsumer, Isolation, OffsetReset, SeekTo
from dmq.client._group import AsyncGroupConsumer, Callback
from dmq.client._producer import Acks, AsyncProducer, Bytesish, Compression, HeadersArg
from dmq.client._transactions import TRANSACTION_TIMEOUT_MS_DEFAULT, CommitWait
from dmq.client._types import (
    ClusterInfo,
    ConsumerRecord,
    PartitionOffsets,
    RecordMetadata,
    TopicDescription,
    TopicPartition,
    TopicSummary,
)
from log.records import Record

T = TypeVar("T")


class _LoopThread:
    """An event loop running forever in a daemon thread, until `stop`."""

    def __init__(self, name: str) -> None:
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name=name, daemon=True)
        self._thread.start()
        self._stopped = False

    @property
    def stopped(self) -> bool:
        return self._stopped

    def run(self, coroutine: Coroutine[Any, Any, T]) -> T:
        """Run `coroutine` on the loop and wait for its result (or exception)."""
        if self._stopped:
            coroutine.close()
            raise RuntimeError("this client is closed")
        if threading.current_thread() is self._thread:
            coroutine.close()
            raise RuntimeError("a sync client cannot be called from its own callbacks")
        future = asyncio.run_coroutine_threadsafe(coroutine, self._loop)
        try:
            return future.result()
        except BaseException:
            future.cancel()  # e.g. KeyboardInterrupt while waiting: stop the work too
            raise

    def call_soon(self, function: Callable[[], object]) -> None:
        """Schedule `function` on the loop's thread without waiting for it."""
        if self._stopped:
            raise RuntimeError("this client is closed")
        self._loop.call_soon_threadsafe(function)

    def call(self, function: Callable[[], T]) -> T:
        """Run a plain function on the loop's thread (the async objects are not
        thread-safe, so even their non-async methods run there)."""

        async def wrapper() -> T:
            return function()

        return self.run(wrapper())

    def stop(self) -> None:
        if self._stopped:
            return
        self._stopped = True
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join()
        try:
            self._loop.run_until_complete(self._loop.shutdown_asyncgens())
        finally:
            self._loop.close()


def _chain(source: asyncio.Future[T], target: concurrent.futures.Future[T]) -> None:
    """Settle `target` (a concurrent future) as `source` (an asyncio future) settles."""

    def settle(done: asyncio.Future[T]) -> None:
        if done.cancelled():
            target.cancel()
        elif (error := done.exception()) is not None:
            target.set_exception(error)
        else:
            target.set_result(done.result())

    source.add_done_callback(settle)


@dataclass(slots=True)
class _Handoff:
    """A send on its way from the caller's thread to the producer's loop."""

    topic: str
    record: Record
    partition: int | None
    target: concurrent.futures.Future[RecordMetadata]


class Producer:
    """The blocking twin of `AsyncProducer` (same arguments, same behaviour).

    `send` checks the record and returns a `concurrent.futures.Future[RecordMetadata]`
    at once, without waiting for the loop thread (a round trip per record would cap a
    thread at a few thousand records/s)::

        with Producer("http://127.0.0.1:8080", compression="zstd") as producer:
            future = producer.send("orders", b"v", key=b"k")
            print(future.result().offset)

    Sends go through a hand-off queue that one task on the loop drains into
    `AsyncProducer._enqueue`, in order, so the sends of one thread keep their order.
    The queue is bounded (SYNC_SENDS_PENDING_MAX): a caller that outruns the loop blocks
    in `send`, as it does when the producer's buffer is full.
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
        transaction_timeout_ms: int = TRANSACTION_TIMEOUT_MS_DEFAULT,
        transaction_commit_wait: CommitWait = "decision",
        tls: ssl.SSLContext | None = None,
        token: str | None = None,
    ) -> None:
        self._inner = AsyncProducer(
            url,
            acks=acks,
            linger_ms=linger_ms,
            batch_bytes=batch_bytes,
            compression=compression,
            retries=retries,
            retry_backoff_ms=retry_backoff_ms,
            request_timeout_ms=request_timeout_ms,
            delivery_timeout_ms=delivery_timeout_ms,
            default_api_timeout_ms=default_api_timeout_ms,
            buffer_bytes=buffer_bytes,
            idempotent=idempotent,
            transactional_id=transactional_id,
            transaction_timeout_ms=transaction_timeout_ms,
            transaction_commit_wait=transaction_commit_wait,
            tls=tls,
            token=token,
        )
        self._runner = _LoopThread("dmq-producer")
        self._room = threading.BoundedSemaphore(_limits.SYNC_SENDS_PENDING_MAX)
        self._handoff: deque[_Handoff] = deque()
        self._handoff_lock = threading.Lock()
        self._drain_scheduled = False  # guarded by _handoff_lock
        self._drain_task: asyncio.Task[None] | None = None  # the loop's thread only

    def __enter__(self) -> Producer:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def send(
        self,
        topic: str,
        value: Bytesish | None,
        key: Bytesish | None = None,
        headers: HeadersArg = None,
        partition: int | None = None,
        timestamp_ms: int | None = None,
    ) -> concurrent.futures.Future[RecordMetadata]:
        """Queue one record; see `AsyncProducer.send`. TypeError and ValueError are
        raised here; everything else arrives through the future."""
        if self._runner.stopped:
            raise RuntimeError("the producer is closed")
        record = self._inner._prepare(topic, value, key, headers, partition, timestamp_ms)
        target: concurrent.futures.Future[RecordMetadata] = concurrent.futures.Future()
        self._room.acquire()
        with self._handoff_lock:
            self._handoff.append(_Handoff(topic, record, partition, target))
            schedule, self._drain_scheduled = not self._drain_scheduled, True
        if schedule:
            self._runner.call_soon(self._start_drain)
        return target

    def _start_drain(self) -> None:
        self._drain_task = asyncio.ensure_future(self._drain())

    async def _drain(self) -> None:
        """Move handed-off sends into the AsyncProducer, in order, until none is left."""
        handled = 0
        while True:
            with self._handoff_lock:
                if not self._handoff:
                    self._drain_scheduled = False
                    return
                item = self._handoff.popleft()
            try:
                future = await self._inner._enqueue(item.topic, item.record, item.partition)
            except Exception as error:  # RuntimeError once closed
                item.target.set_exception(error)
            else:
                _chain(future, item.target)
            finally:
                self._room.release()
            handled += 1
            if handled % _limits.SYNC_HANDOFF_YIELD_EVERY == 0:
                await asyncio.sleep(0)  # let the sender and the connections run

    async def _handed_off(self) -> None:
        """Wait until every send made before this call reached the AsyncProducer."""
        task = self._drain_task
        if task is not None and not task.done():
            await asyncio.wait([task])

    def producer_identity(self) -> tuple[int, int]:
        """(producer_id, producer_epoch), asked of the broker on first use."""
        return self._runner.run(self._inner.producer_identity())

    def begin_transaction(self) -> None:
        """See `AsyncProducer.begin_transaction` (dmq/client/_transactions.py)."""
        self._runner.run(self._inner.begin_transaction())

    def send_offsets_to_transaction(
        self, offsets: Mapping[TopicPartition | tuple[str, int], int], consumer: Any
    ) -> None:
        """See `AsyncProducer.send_offsets_to_transaction`; `consumer` is a group
        `Consumer` (or a group name)."""

        async def send() -> None:
            await self._handed_off()
            await self._inner.send_offsets_to_transaction(offsets, consumer)

        self._runner.run(send())

    def commit_transaction(self) -> None:
        """See `AsyncProducer.commit_transaction`."""

        async def commit() -> None:
            await self._handed_off()
            await self._inner.commit_transaction()

        self._runner.run(commit())

    def abort_transaction(self) -> None:
        """See `AsyncProducer.abort_transaction`."""

        async def abort() -> None:
            await self._handed_off()
            await self._inner.abort_transaction()

        self._runner.run(abort())

    def flush(self) -> None:
        """Send everything queued and wait until each record is acknowledged or failed."""

        async def flush() -> None:
            await self._handed_off()
            await self._inner.flush()

        self._runner.run(flush())

    def close(self) -> None:
        """Flush, release the connections and stop the thread. Idempotent."""
        if self._runner.stopped:
            return

        async def close() -> None:
            await self._handed_off()
            await self._inner.close()

        try:
            self._runner.run(close())
        finally:
            self._runner.stop()
            with self._handoff_lock:  # sends that raced with close: fail, do not hang
                left, self._handoff = list(self._handoff), deque()
            for item in left:
                item.target.set_exception(RuntimeError("the producer is closed"))
                self._room.release()


class Consumer:
    """The blocking twin of `AsyncConsumer` (same arguments, same behaviour)::

    with Consumer("http://127.0.0.1:8080", topic="orders") as consumer:
        for record in consumer.poll(timeout_ms=1000):
            print(record.offset, record.value)

    With `group=` it is a member of that consumer group (`AsyncGroupConsumer`): the broker
    assigns its partitions among `topics` (or `topic_pattern`), `poll` follows the group's
    positions, commits (auto-commit: at-least-once) and heartbeats in the background::

        with Consumer(url, group="billing", topics=["orders"]) as consumer:
            while True:
                for record in consumer.poll(timeout_ms=1000):
                    handle(record)
    """

    def __init__(
        self,
        url: str,
        *,
        topic: str | None = None,
        auto_offset_reset: OffsetReset = "earliest",
        fetch_bytes_max: int = _limits.FETCH_BYTES_DEFAULT,
        retries: int | None = _limits.RETRIES_DEFAULT,
        retry_backoff_ms: int = _limits.RETRY_BACKOFF_MS_DEFAULT,
        request_timeout_ms: int = _limits.REQUEST_TIMEOUT_MS_DEFAULT,
        default_api_timeout_ms: int = _limits.DEFAULT_API_TIMEOUT_MS_DEFAULT,
        group: str | None = None,
        topics: list[str] | None = None,
        topic_pattern: str | None = None,
        session_timeout_ms: int = 10_000,
        auto_commit: bool = True,
        instance_id: str | None = None,
        on_assign: Callback | None = None,
        on_revoke: Callback | None = None,
        max_poll_interval_ms: int = _limits.MAX_POLL_INTERVAL_MS_DEFAULT,
        isolation: Isolation = "read_uncommitted",
        tls: ssl.SSLContext | None = None,
        token: str | None = None,
    ) -> None:
        self._group: AsyncGroupConsumer | None = None
        if group is not None:
            self._group = AsyncGroupConsumer(
                url, group, topics=topics, topic_pattern=topic_pattern,
                session_timeout_ms=session_timeout_ms, auto_commit=auto_commit,
                instance_id=instance_id, on_assign=on_assign, on_revoke=on_revoke,
                request_timeout_ms=request_timeout_ms, max_poll_interval_ms=max_poll_interval_ms,
                isolation=isolation, default_api_timeout_ms=default_api_timeout_ms,
            )  # fmt: skip
        self._inner = AsyncConsumer(
            url,
            topic=topic,
            auto_offset_reset=auto_offset_reset,
            fetch_bytes_max=fetch_bytes_max,
            retries=retries,
            retry_backoff_ms=retry_backoff_ms,
            request_timeout_ms=request_timeout_ms,
            default_api_timeout_ms=default_api_timeout_ms,
            isolation=isolation,
            tls=tls,
            token=token,
        )
        self._runner = _LoopThread("dmq-consumer")

    def __enter__(self) -> Consumer:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def assign(self, partitions: Iterable[tuple[str, int]]) -> None:
        wanted = list(partitions)
        self._runner.call(lambda: self._inner.assign(wanted))

    def assignment(self) -> list[TopicPartition]:
        return self._runner.call(self._inner.assignment)

    def seek(self, topic: str, partition: int, offset: SeekTo) -> None:
        self._runner.call(lambda: self._inner.seek(topic, partition, offset))

    def seek_to_timestamp(self, topic: str, partition: int, timestamp_ms: int) -> None:
        self._runner.call(lambda: self._inner.seek_to_timestamp(topic, partition, timestamp_ms))

    def position(self, tp: tuple[str, int]) -> int:
        return self._runner.run(self._inner.position(tp))

    def poll(
        self,
        timeout_ms: int = _limits.POLL_TIMEOUT_MS_DEFAULT,
        max_records: int = _limits.POLL_RECORDS_DEFAULT,
    ) -> list[ConsumerRecord]:
        if self._group is not None:
            return self._runner.run(self._group.poll(timeout_ms, max_records))
        return self._runner.run(self._inner.poll(timeout_ms, max_records))

    def commit(self) -> None:
        """Group consumers: commit the positions of the records poll returned."""
        if self._group is None:
            raise RuntimeError("commit needs a group consumer (group=...)")
        self._runner.run(self._group.commit())

    def group_metadata(self) -> tuple[str, str, int]:
        """(group, member id, generation), for `Producer.send_offsets_to_transaction`."""
        if self._group is None:
            raise RuntimeError("group_metadata needs a group consumer (group=...)")
        group = self._group
        return self._runner.call(group.group_metadata)

    def group_assignment(self) -> list[TopicPartition]:
        """Group consumers: the partitions the group gave this member."""
        if self._group is None:
            raise RuntimeError("group_assignment needs a group consumer (group=...)")
        group = self._group
        return self._runner.call(group.assignment)

    def close(self) -> None:
        if self._runner.stopped:
            return
        try:
            if self._group is not None:
                self._runner.run(self._group.close())
            self._runner.run(self._inner.close())
        finally:
            self._runner.stop()


class Admin:
    """The blocking twin of `AsyncAdmin` (same methods, same errors)."""

    def __init__(
        self,
        url: str,
        *,
        retries: int | None = _limits.RETRIES_DEFAULT,
        retry_backoff_ms: int = _limits.RETRY_BACKOFF_MS_DEFAULT,
        request_timeout_ms: int = _limits.REQUEST_TIMEOUT_MS_DEFAULT,
        default_api_timeout_ms: int = _limits.DEFAULT_API_TIMEOUT_MS_DEFAULT,
        tls: ssl.SSLContext | None = None,
        token: str | None = None,
    ) -> None:
        self._inner = AsyncAdmin(
            url,
            retries=retries,
            retry_backoff_ms=retry_backoff_ms,
            request_timeout_ms=request_timeout_ms,
            default_api_timeout_ms=default_api_timeout_ms,
            tls=tls,
            token=token,
        )
        self._runner = _LoopThread("dmq-admin")

    def __enter__(self) -> Admin:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def create_topic(
        self,
        name: str,
        partitions: int | None = None,
        replication_factor: int | None = None,
        config: Mapping[str, Any] | None = None,
    ) -> TopicDescription:
        return self._runner.run(
            self._inner.create_topic(name, partitions, replication_factor, config)
        )

    def list_topics(self) -> list[TopicSummary]:
        return self._runner.run(self._inner.list_topics())

    def describe_topic(self, name: str) -> TopicDescription:
        return self._runner.run(self._inner.describe_topic(name))

    def alter_config(self, name: str, config: Mapping[str, Any]) -> TopicDescription:
        return self._runner.run(self._inner.alter_config(name, config))

    def add_partitions(self, name: str, count: int) -> TopicDescription:
        return self._runner.run(self._inner.add_partitions(name, count))

    def delete_topic(self, name: str) -> None:
        self._runner.run(self._inner.delete_topic(name))

    def offsets(
        self, topic: str, partition: int, timestamp_ms: int | None = None
    ) -> PartitionOffsets:
        return self._runner.run(self._inner.offsets(topic, partition, timestamp_ms))

    def cluster(self) -> ClusterInfo:
        return self._runner.run(self._inner.cluster())

    def cluster_status(self) -> dict[str, Any]:
        return self._runner.run(self._inner.cluster_status())

    def set_aside(self) -> dict[str, Any]:
        return self._runner.run(self._inner.set_aside())

    # users, ACLs, quotas: AsyncAdmin's, run on this client's loop thread
    def whoami(self) -> dict[str, Any]:
        return self._runner.run(self._inner.whoami())

    def add_user(self, name: str, password: str | None = None) -> dict[str, Any]:
        return self._runner.run(self._inner.add_user(name, password))

    def remove_user(self, name: str) -> None:
        self._runner.run(self._inner.remove_user(name))

    def list_users(self) -> list[dict[str, Any]]:
        return self._runner.run(self._inner.list_users())

    def add_acl(self, binding: Mapping[str, str]) -> dict[str, Any]:
        return self._runner.run(self._inner.add_acl(binding))

    def remove_acl(self, binding: Mapping[str, str]) -> None:
        self._runner.run(self._inner.remove_acl(binding))

    def list_acls(
        self, principal: str | None = None, resource_type: str | None = None
    ) -> list[dict[str, Any]]:
        return self._runner.run(self._inner.list_acls(principal, resource_type))

    def set_quota(self, principal: str, rates: Mapping[str, int]) -> dict[str, Any]:
        return self._runner.run(self._inner.set_quota(principal, rates))

    def list_quotas(self) -> list[dict[str, Any]]:
        return self._runner.run(self._inner.list_quotas())

    def operations(self) -> dict[str, Any]:
        return self._runner.run(self._inner.operations())

    def reassign(self, topic: str, partition: int, replicas: list[str]) -> dict[str, Any]:
        return self._runner.run(self._inner.reassign(topic, partition, replicas))

    def decommission_partition(self, topic: str, partition: int) -> dict[str, Any]:
        return self._runner.run(self._inner.decommission_partition(topic, partition))

    def decommission_broker(self, broker_id: str) -> dict[str, Any]:
        return self._runner.run(self._inner.decommission_broker(broker_id))

    def change_metadata_voters(self, voters: list[str]) -> dict[str, Any]:
        return self._runner.run(self._inner.change_metadata_voters(voters))

    def close(self) -> None:
        if self._runner.stopped:
            return
        try:
            self._runner.run(self._inner.close())
        finally:
            self._runner.stop()
