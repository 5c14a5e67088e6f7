"""A partition replica on this broker: its log, group commit, and long-poll waiters.

Threading: a PartitionLog is single-writer and not thread-safe. Every call into a
replica's log runs on the one storage thread the replica is pinned to
(`StorageThreads`: a fixed pool, partitions spread over it by hash), so calls to one
log are serialised while the asyncio event loop never blocks on disk, and the
number of threads does not grow with partitions.

Group commit: produce requests queue per partition (bounded: a full queue refuses
with Backpressure). One appender task drains the queue, appends every waiting batch
and flushes once (by the flush policy) in a single trip to the storage thread, then
advances the high watermark and answers them all. On one node, committed means
appended and flushed by the policy; in a cluster this is where Raft comes in.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
import time
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from dmq.errors import Backpressure, BrokerUnavailable
from log import compaction
from log.config import LogConfig
from log.errors import LogError, StorageError
from log.partition_log import AppendResult, PartitionLog, ReadResult
from log.records import Record

T = TypeVar("T")
_log = logging.getLogger("dmq.replica")


def _close_read_result(future: asyncio.Future[ReadResult]) -> None:
    if not future.cancelled() and future.exception() is None:
        future.result().close()


class StorageThreads:
    """A fixed pool of single-thread executors; a partition always uses the same one."""

    def __init__(self, count: int) -> None:
        self._executors = [
            concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix=f"dmq-storage-{i}")
            for i in range(count)
        ]

    def executor_for(self, key: str) -> concurrent.futures.ThreadPoolExecutor:
        return self._executors[zlib.crc32(key.encode()) % len(self._executors)]

    def shutdown(self) -> None:
        for executor in self._executors:
            executor.shutdown(wait=True)


@dataclass(frozen=True, slots=True)
class FlushSettings:
    interval_records: int | None  # None: no count trigger
    interval_ms: int | None  # None: no time trigger


@dataclass(slots=True)
class _PendingAppend:
    batch: bytes
    log_append_time_ms: int | None
    future: asyncio.Future[AppendResult]


class PartitionReplica:
    def __init__(
        self,
        topic: str,
        partition: int,
        directory: Path,
        log_config: LogConfig,
        flush: FlushSettings,
        executor: concurrent.futures.ThreadPoolExecutor,
        *,
        queue_depth_max: int,
        queue_bytes_max: int,
        group_requests_max: int,
        group_bytes_max: int,
    ) -> None:
        self.topic = topic
        self.partition = partition
        self.directory = directory
        self.log_config = log_config
        self.flush_settings = flush
        self._executor = executor
        self._queue_depth_max = queue_depth_max
        self._queue_bytes_max = queue_bytes_max
        self._pending_bytes = 0
        self._group_requests_max = group_requests_max
        self._group_bytes_max = group_bytes_max
        self._pending: list[_PendingAppend] = []
        self._wakeup = asyncio.Event()
        self._committed_advanced = asyncio.Event()
        self._appender: asyncio.Task[None] | None = None
        self._log: PartitionLog | None = None
        self._unflushed_records = 0
        self._last_flush = time.monotonic()
        self.closed = False
        # Held by upkeep (retention, compaction, timed flush) and by close(): a close
        # waits for upkeep in progress, and upkeep never touches a closed log.
        self._upkeep_lock = asyncio.Lock()
        # Offsets mirrored on the event loop for cheap reads (updated after each commit).
        self.log_start_offset = 0
        self.high_watermark = 0
        self.log_end_offset = 0

    # ------------------------------------------------------------------ lifecycle

    async def run(self, fn: Callable[..., T], *args: Any) -> T:
        """Run fn(*args) on this partition's storage thread."""
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._executor, fn, *args)

    async def open(self) -> None:
        def _open() -> PartitionLog:
            log = PartitionLog.open(self.directory, self.log_config)
            # One node: everything that survived recovery was acknowledged or may be
            # served (it was appended and not cut as a torn tail).
            log.set_high_watermark(log.log_end_offset)
            if log.recovered_bytes_truncated:
                _log.warning(
                    "partition %s-%d: truncated %d bytes of torn tail on recovery",
                    self.topic,
                    self.partition,
                    log.recovered_bytes_truncated,
                )
            return log

        self._log = await self.run(_open)
        self._mirror_offsets()
        self._appender = asyncio.get_running_loop().create_task(self._append_loop())

    def _mirror_offsets(self) -> None:
        assert self._log is not None
        self.log_start_offset = self._log.log_start_offset
        self.high_watermark = self._log.high_watermark
        self.log_end_offset = self._log.log_end_offset

    async def close(self) -> None:
        """Stop taking appends, finish the queued ones, flush, close files."""
        if self.closed:
            return
        self.closed = True
        self._wakeup.set()
        if self._appender is not None:
            await self._appender
        async with self._upkeep_lock:
            await self._close_log()
        self._committed_advanced.set()

    async def _close_log(self) -> None:
        if self._log is not None:
            await self.run(self._log.close)
        self._committed_advanced.set()

    async def delete(self) -> None:
        await self.close()

        def _remove() -> None:
            for path in sorted(self.directory.glob("*")):
                path.unlink()
            self.directory.rmdir()

        await self.run(_remove)

    # ------------------------------------------------------------------ produce

    def check_capacity(self, size_bytes: int) -> None:
        """Raise what append would raise for a batch of this size, queueing nothing."""
        if self.closed:
            raise BrokerUnavailable("the partition is closing", retry_after_ms=1000)
        if len(self._pending) >= self._queue_depth_max or (
            self._pending and self._pending_bytes + size_bytes > self._queue_bytes_max
        ):
            raise Backpressure(
                f"partition {self.topic}-{self.partition} has {len(self._pending)} produce "
                f"requests ({self._pending_bytes} bytes) queued "
                f"(produce_queue_depth_max, produce_queue_bytes_max)",
                limit=self._queue_depth_max,
            )

    def append(self, batch: bytes, log_append_time_ms: int | None) -> asyncio.Future[AppendResult]:
        """Queue a validated batch for the next group commit."""
        if self.closed:
            raise BrokerUnavailable("the partition is closing", retry_after_ms=1000)
        if len(self._pending) >= self._queue_depth_max:
            raise Backpressure(
                f"partition {self.topic}-{self.partition} has {len(self._pending)} produce "
                f"requests queued (produce_queue_depth_max)",
                limit=self._queue_depth_max,
            )
        if self._pending and self._pending_bytes + len(batch) > self._queue_bytes_max:
            raise Backpressure(
                f"partition {self.topic}-{self.partition} has {self._pending_bytes} bytes of "
                f"produce requests queued (produce_queue_bytes_max)",
                limit=self._queue_bytes_max,
            )
        future: asyncio.Future[AppendResult] = asyncio.get_running_loop().create_future()
        self._pending.append(_PendingAppend(batch, log_append_time_ms, future))
        self._pending_bytes += len(batch)
        self._wakeup.set()
        return future

    @property
    def queue_depth(self) -> int:
        return len(self._pending)

    async def _append_loop(self) -> None:
        while True:
            await self._wakeup.wait()
            self._wakeup.clear()
            while self._pending:
                group = self._take_group()
                try:
                    results = await self.run(
                        self._append_group, [(p.batch, p.log_append_time_ms) for p in group]
                    )
                except Exception as exc:  # a storage failure fails every request in the group
                    _log.exception("append failed on %s-%d", self.topic, self.partition)
                    # The log refuses further writes after an I/O failure (PartitionLog
                    # marks itself failed); later produces get the same storage error.
                    for p in group:
                        if not p.future.done():
                            p.future.set_exception(exc)
                    continue
                self._mirror_offsets()
                for p, result in zip(group, results, strict=True):
                    if p.future.done():
                        continue
                    if isinstance(result, BaseException):
                        p.future.set_exception(result)
                    else:
                        p.future.set_result(result)
                self._notify_committed()
            if self.closed:
                return

    def _take_group(self) -> list[_PendingAppend]:
        group: list[_PendingAppend] = []
        total = 0
        while self._pending and len(group) < self._group_requests_max:
            size = len(self._pending[0].batch)
            if group and total + size > self._group_bytes_max:
                break
            group.append(self._pending.pop(0))
            self._pending_bytes -= size
            total += size
        return group

    def _append_group(
        self, batches: list[tuple[bytes, int | None]]
    ) -> list[AppendResult | LogError]:
        """Storage thread: append each batch, flush once if the policy says so, then
        make everything appended visible (high watermark = log end)."""
        log = self._log
        assert log is not None
        results: list[AppendResult | LogError] = []
        for batch, log_append_time_ms in batches:
            try:
                result = log.append(batch, log_append_time_ms=log_append_time_ms)
                results.append(result)
                self._unflushed_records += result.last_offset - result.base_offset + 1
            except StorageError:
                raise  # the disk failed: fail the whole group and the replica
            except LogError as exc:  # a bad batch fails alone; the others still commit
                results.append(exc)
        settings = self.flush_settings
        now = time.monotonic()
        if self._unflushed_records and (
            (
                settings.interval_records is not None
                and self._unflushed_records >= settings.interval_records
            )
            or (
                settings.interval_ms is not None
                and (now - self._last_flush) * 1000 >= settings.interval_ms
            )
        ):
            log.flush()
            self._unflushed_records = 0
            self._last_flush = now
        log.set_high_watermark(log.log_end_offset)
        return results

    async def maybe_flush(self) -> bool:
        """Time-triggered flush (called periodically by the broker)."""
        async with self._upkeep_lock:
            if self.closed:
                return False
            return await self._flush_if_due()

    async def _flush_if_due(self) -> bool:
        settings = self.flush_settings
        if settings.interval_ms is None or not self._unflushed_records or self._log is None:
            return False

        def _flush() -> bool:
            assert self._log is not None
            if (time.monotonic() - self._last_flush) * 1000 < (settings.interval_ms or 0):
                return False
            self._log.flush()
            self._unflushed_records = 0
            self._last_flush = time.monotonic()
            return True

        return await self.run(_flush)

    # ------------------------------------------------------------------ read

    def _notify_committed(self) -> None:
        self._committed_advanced.set()
        self._committed_advanced = asyncio.Event()

    async def wait_for_commit_past(self, offset: int, timeout_s: float) -> None:
        """Return when high_watermark > offset, the replica closes, or the time is up."""
        deadline = asyncio.get_running_loop().time() + timeout_s
        while self.high_watermark <= offset and not self.closed:
            remaining = deadline - asyncio.get_running_loop().time()
            if remaining <= 0:
                return
            event = self._committed_advanced
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(event.wait(), remaining)

    async def read(self, offset: int, max_bytes: int) -> ReadResult:
        """Raw ranges; the caller closes the result. If the caller is cancelled while the
        read runs, the result is closed when it arrives (its descriptors never leak)."""
        assert self._log is not None
        loop = asyncio.get_running_loop()
        future = loop.run_in_executor(self._executor, self._log.read, offset, max_bytes)
        try:
            return await asyncio.shield(future)
        except asyncio.CancelledError:
            future.add_done_callback(_close_read_result)
            raise

    async def read_records(
        self, offset: int, max_bytes: int, max_records: int
    ) -> tuple[list[Record], int, int, int]:
        """Decoded records, plus (next_offset, high_watermark, log_start_offset)."""
        log = self._log
        assert log is not None

        def _read() -> tuple[list[Record], int, int, int]:
            records = log.read_records(offset, max_bytes, max_records=max_records)
            next_offset = records[-1].offset + 1 if records else offset
            if not records and offset < log.high_watermark:
                # Only a gap (compaction) or a control batch lay ahead: skip past it.
                with log.read(offset, max_bytes) as raw:
                    next_offset = raw.next_offset
            return records, next_offset, log.high_watermark, log.log_start_offset

        return await self.run(_read)

    async def offset_for_timestamp(self, timestamp_ms: int) -> int | None:
        assert self._log is not None
        return await self.run(self._log.offset_for_timestamp, timestamp_ms)

    async def maybe_clean(self, now_ms: int) -> tuple[int, bool]:
        """Retention and compaction. Compaction's build runs off the storage thread so
        appends continue; only plan and install run on it."""
        async with self._upkeep_lock:
            if self.closed:
                return 0, False
            return await self._clean(now_ms)

    async def _clean(self, now_ms: int) -> tuple[int, bool]:
        log = self._log
        assert log is not None
        deleted = await self.run(log.maybe_delete_segments, now_ms)
        compacted = False
        if log.config.compacts:
            plan = await self.run(compaction.plan_compaction, log)
            if plan is not None:
                loop = asyncio.get_running_loop()
                result = await loop.run_in_executor(None, compaction.build_compaction, plan, now_ms)
                compacted = await self.run(compaction.install_compaction, log, result)
        self._mirror_offsets()
        return deleted, compacted
