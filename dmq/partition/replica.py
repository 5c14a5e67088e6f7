"""A partition replica on this broker: its log, its Raft group, and long-poll waiters.

Each partition replica is one Raft group (raft/node.py) whose state machine is the
partition's PartitionLog (dmq/partition/machine.py: offsets are assigned at apply, so every
replica holds the same bytes at the same offsets). A produce becomes one
`ProduceCommand`; concurrent produces to the partition coalesce into one Raft entry in
the RaftNode (group commit, bounded by bytes and count in RaftConfig).

Threading: a PartitionLog is single-writer and not thread-safe. Two kinds of thread
touch it, each holding the replica's `lock` (a threading.Lock) for the whole call:

- the RaftNode's tick thread applies committed commands (appends) and takes snapshots;
- one of the broker's storage threads (`StorageThreads`: a fixed pool, partitions spread
  over it by hash) serves reads, retention and compaction for the event loop, so the loop
  never blocks on disk and the number of threads does not grow with partitions.

Reads only see committed records: the state machine moves the high watermark to the log
end after each apply, and only committed entries are applied. After each apply the tick
thread asks the event loop to mirror the offsets (once per burst) and wake long-polls.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import functools
import logging
import shutil
import threading
import time
import zlib
from collections.abc import AsyncGenerator, Callable, Generator, Iterator
from pathlib import Path
from typing import Any, Literal, TypeVar

from dmq import planted
from dmq.errors import Backpressure, BrokerUnavailable, InsufficientStorage, NotLeader
from dmq.metadata.service import translate_raft_error
from dmq.partition.delay import DelayCopyError
from dmq.partition.machine import (
    PRODUCE_COMMAND_VERSION,
    CopiedChunk,
    PartitionStateMachine,
    ProduceCommand,
    TrimCommand,
)
from dmq.partition.remote_manifest import RemoteManifest, local_deletable
from dmq.partition.transactions import AbortedRange, visible_records
from log import compaction
from log.config import LogConfig
from log.errors import LogError
from log.partition_log import PartitionLog, ReadResult, Retained
from log.records import Record, iter_batches
from log.space import SpaceGuard, StorageFull
from log.writeback import Writeback
from raft import errors as raft_errors
from raft.node import RaftNode, Replica

T = TypeVar("T")
_log = logging.getLogger("dmq.partition.replica")

Acks = Literal["0", "1", "all"]
# fetch_missing(start_offset, end_offset) -> (response body of concatenated batches, the
# offset the source vouches for up to: dmq.partition.machine.CopiedChunk), one per response
FetchMissing = Callable[[int, int], Iterator[tuple[bytes, int]]]
# fetch_delayed((index, k)) -> one stream of delay-store chunks per other replica, the
# leader first (dmq.partition.machine.FetchDelayed)
FetchDelayed = Callable[[tuple[int, int]], Iterator[Iterator[bytes]]]
TOPIC_ID_FILE = "topic_id"
# Beside it: the cluster id of the broker that created the directory (dmq/README.md,
# "Cluster identity"): a directory of another cluster is never opened as a replica.
CLUSTER_ID_FILE = "cluster_id"


def _close_read_result(future: asyncio.Future[ReadResult]) -> None:
    if not future.cancelled() and future.exception() is None:
        future.result().close()


class StorageThreads:
    """A fixed pool of single-thread executors; a partition always uses the same one.
    Beside them, one thread that starts the write-back of what the logs append
    (log/writeback.py)."""

    def __init__(self, count: int) -> None:
        self._executors = [
            concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix=f"dmq-storage-{i}")
            for i in range(count)
        ]
        self.writeback = Writeback()

    def executor_for(self, key: str) -> concurrent.futures.ThreadPoolExecutor:
        return self._executors[zlib.crc32(key.encode()) % len(self._executors)]

    def shutdown(self) -> None:
        for executor in self._executors:
            executor.shutdown(wait=True)
        self.writeback.close()


# A follower serves no reads (dmq/broker/routing.py): without a fetch waiting on it, the tick
# thread has its offsets mirrored on the event loop at most this often, and its readers
# (metrics, topic descriptions) call refresh_offsets() first. A mirror per apply woke the
# loop for each record a client sent one at a time: a quarter of a follower's CPU (#22).
FOLLOWER_MIRROR_INTERVAL_S = 0.5

# Raft group ids per topic id: above PARTITIONS_PER_TOPIC_MAX (1,000). Group 0 is the
# metadata group; topic ids start at 1.
GROUPS_PER_TOPIC = 1024


def group_id_for(topic_id: int, partition: int) -> int:
    """A partition's Raft group id: unique per topic id, never reused (ids only grow)."""
    return topic_id * GROUPS_PER_TOPIC + partition


class _LockedMachine:
    """The PartitionStateMachine as the tick thread sees it: under the replica's lock."""

    def __init__(self, replica: PartitionReplica, machine: PartitionStateMachine) -> None:
        self._replica = replica
        self._machine = machine

    def apply(self, command: bytes) -> Any:
        raise TypeError("a partition machine is applied with apply_at")

    def apply_at(self, index: int, k: int, command: bytes) -> Any:
        with self._replica.lock:
            result = self._machine.apply_at(index, k, command)
        self._replica.applied_from_thread()
        return result

    def snapshot(self) -> bytes:
        with self._replica.lock:
            return self._machine.snapshot()

    def restore(self, snapshot: bytes) -> None:
        with self._replica.lock:
            self._machine.restore(snapshot)
        self._replica.applied_from_thread()


class PartitionReplica:
    def __init__(
        self,
        topic: str,
        topic_id: int,
        partition: int,
        directory: Path,
        log_config: LogConfig,
        executor: concurrent.futures.ThreadPoolExecutor,
        raft_node: RaftNode,
        members: list[str],
        fetch_missing: FetchMissing,
        *,
        queue_depth_max: int,
        queue_bytes_max: int,
        timeout_s: float,
        space: SpaceGuard | None = None,
        cluster_id: str = "",
        fetch_delayed: FetchDelayed | None = None,
        writeback: Writeback | None = None,
        preferred_leader: str | None = None,
    ) -> None:
        self.topic = topic
        self._writeback = writeback
        self._fetch_delayed = fetch_delayed
        self.cluster_id = cluster_id  # written into the directory (CLUSTER_ID_FILE)
        self.topic_id = topic_id
        self.partition = partition
        self.directory = directory
        self.log_config = log_config
        self.group_id = group_id_for(topic_id, partition)
        self.members = members
        # The placement's first replica: a new group's first election goes to it
        # (raft/replica.py, Replica.stand_first), so a fresh topic's leaders start balanced,
        # and the leader balancer moves the group back to it (raft/leadership.py).
        self.preferred_leader = preferred_leader
        self.lock = threading.Lock()
        self._executor = executor
        self._raft_node = raft_node
        self._fetch_missing = fetch_missing
        self._queue_depth_max = queue_depth_max
        self._queue_bytes_max = queue_bytes_max
        self._timeout_s = timeout_s
        # The data directory's floor (log/space.py): appends are refused below it, and
        # this replica's Raft group takes no new entries as a follower (write gate).
        self._space = space
        self._inflight = 0
        self._inflight_bytes = 0
        self._committed_advanced = asyncio.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._mirror_pending = False
        self._mirror_asked_at = 0.0  # tick thread: when a follower's mirror was last asked for
        self._waiters = 0  # wait_for_commit_past calls waiting (event loop)
        self._log: PartitionLog | None = None
        self._machine: PartitionStateMachine | None = None
        self.raft: Replica | None = None
        self.closed = False
        # Held by upkeep (retention, compaction) and by close(): a close waits for
        # upkeep in progress, and upkeep never touches a closed log.
        self._upkeep_lock = asyncio.Lock()
        # Offsets mirrored on the event loop for cheap reads (after each burst of applies).
        self.log_start_offset = 0
        self.high_watermark = 0
        self.log_end_offset = 0
        self.last_stable_offset = 0  # dmq/partition/transactions.py: read_committed's end

    @property
    def name(self) -> str:
        return f"{self.topic}-{self.partition}"

    # ------------------------------------------------------------------ lifecycle

    async def run(self, fn: Callable[..., T], *args: Any) -> T:
        """Run fn(*args) on this partition's storage thread."""
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._executor, fn, *args)

    async def open(self) -> None:
        """Open the log (recovery), then join the partition's Raft group."""
        self._loop = asyncio.get_running_loop()

        def _open() -> tuple[PartitionLog, PartitionStateMachine]:
            self.directory.mkdir(parents=True, exist_ok=True)
            (self.directory / TOPIC_ID_FILE).write_text(f"{self.topic_id}\n")
            if self.cluster_id:
                (self.directory / CLUSTER_ID_FILE).write_text(f"{self.cluster_id}\n")
            log = PartitionLog.open(self.directory, self.log_config)
            if self._writeback is not None:
                log.writeback = self._writeback.kick
            if log.recovered_bytes_truncated:
                _log.warning(
                    "partition %s: truncated %d bytes of torn tail on recovery",
                    self.name,
                    log.recovered_bytes_truncated,
                )
            machine = PartitionStateMachine(
                self.name, log, self._copy_from_leader, self._fetch_delayed
            )
            return log, machine

        self._log, machine = await self.run(_open)
        self._machine = machine
        self.refresh_offsets()
        try:
            self.raft = await self._raft_node.add_group(
                self.group_id,
                _LockedMachine(self, machine),
                members=self.members,
                preferred_leader=self.preferred_leader,
            )
        except BaseException:
            await self.run(self._close_files)
            raise
        if self._space is not None and len(self.members) > 1:
            self.raft.write_gate = self._space_above_floor

    def set_preferred_leader(self, node_id: str) -> None:
        """The placement's first replica changed (a reassignment): the leader balancer
        moves the group there from now on (raft/leadership.py)."""
        self.preferred_leader = node_id
        if self.raft is not None:
            self.raft.preferred_leader = node_id  # read by the tick thread: one attribute

    def _space_above_floor(self) -> bool:
        """The write gate (tick thread): False while the disk is below its floor, so this
        replica, as a follower, stops taking (and acknowledging) new entries."""
        assert self._space is not None
        return self._space.report().level != "full"

    def _copy_from_leader(self, start_offset: int, end_offset: int) -> Iterator[CopiedChunk]:
        """Tick thread, inside a snapshot's restore: the leader's batches, chunk by chunk."""
        for body, covered_end_offset in self._fetch_missing(start_offset, end_offset):
            view = memoryview(body)
            batches = tuple(
                bytes(view[position : position + header.size_bytes])
                for position, header in iter_batches(view)
            )
            yield CopiedChunk(batches, covered_end_offset)

    def _close_files(self) -> None:
        with self.lock:
            try:
                if self._machine is not None:
                    self._machine.close()
            except (OSError, LogError) as error:
                # A full disk: the checkpoint at close is a shortcut for the next open
                # (which replays from the Raft journal without it); the files still close,
                # so that a topic deleted on a full disk frees its space.
                _log.warning("partition %s: closing without a checkpoint: %s", self.name, error)
            finally:
                self._machine = None
            if self._log is not None:
                try:
                    self._log.close()
                except (OSError, LogError) as error:
                    _log.warning("partition %s: closing its log: %s", self.name, error)
                    for segment in self._log.segments:
                        segment.close_files()

    async def close(self, *, leave_group: bool = True, delete_group: bool = False) -> None:
        """Leave the Raft group (unless the whole node already stopped; `delete_group`:
        and remove its directory), flush, close."""
        if self.closed:
            return
        self.closed = True
        if leave_group and self.raft is not None:
            await self._raft_node.remove_group(self.group_id, delete=delete_group)
        async with self._upkeep_lock:
            await self.run(self._close_files)
        self._notify_committed()

    async def delete(self) -> None:
        """Close and remove the replica's files: its log and its Raft directory."""
        await self.close(delete_group=True)
        await self.run(shutil.rmtree, self.directory, True)

    def reconfigure(self, log_config: LogConfig) -> None:
        """New storage settings (retention, segments) take effect from the next append."""
        self.log_config = log_config
        if self._log is not None:
            with self.lock:
                self._log.config = log_config

    # ------------------------------------------------------------------ produce

    def check_capacity(self, size_bytes: int) -> None:
        """Raise what append would raise for a batch of this size, queueing nothing.

        Below the data directory's free-space floor: InsufficientStorage, before anything
        is written (log/space.py; the floor is the reserve of metadata and deletions)."""
        if self.closed:
            raise BrokerUnavailable("the partition is closing", retry_after_ms=1000)
        if self._space is not None:
            try:
                self._space.check_append(size_bytes)
            except StorageFull as full:
                raise InsufficientStorage(
                    f"partition {self.name}: {full}",
                    free_bytes=full.free_bytes,
                    floor_bytes=full.floor_bytes,
                    retry_after_ms=1000,
                ) from None
        if self._inflight >= self._queue_depth_max or (
            self._inflight and self._inflight_bytes + size_bytes > self._queue_bytes_max
        ):
            raise Backpressure(
                f"partition {self.name} has {self._inflight} produce requests "
                f"({self._inflight_bytes} bytes) in flight "
                f"(produce_queue_depth_max, produce_queue_bytes_max)",
                limit=self._queue_depth_max,
            )

    async def append(self, batch: bytes, log_append_time_ms: int | None, acks: Acks) -> int | None:
        """Replicate a validated batch; its base offset (None for acks=0 and acks=1).

        acks=all (and 0, which nobody waits for) returns once a majority has the entry
        durable and this replica applied it; acks=1 once the leader's own journal has it.
        """
        self.check_capacity(len(batch))
        if self.raft is None:
            raise BrokerUnavailable(f"partition {self.name} is opening", retry_after_ms=200)
        command = ProduceCommand(PRODUCE_COMMAND_VERSION, (batch,), log_append_time_ms).encode()
        self._inflight += 1
        self._inflight_bytes += len(batch)
        try:
            result = await self.raft.propose(
                command,
                timeout_s=self._timeout_s,
                wait="append" if acks == "1" or planted.active("ack-before-commit") else "apply",
            )
        except raft_errors.RaftError as exc:
            raise translate_raft_error(exc, f"partition {self.name}") from exc
        finally:
            self._inflight -= 1
            self._inflight_bytes -= len(batch)
        if result is None:  # acks=1: in the leader's journal; offsets come at commit
            return None
        outcome = result[0]
        if isinstance(outcome, LogError):
            raise outcome
        return int(outcome)

    async def read_barrier(self) -> None:
        """ReadIndex (raft/read_index.py): return once this replica, as its group's leader,
        has confirmed with a majority, after this call, that it still leads, and has applied
        everything committed before the call; the offsets are mirrored then, so reads from
        here on are linearizable. NotLeader (retriable) otherwise."""
        if self.raft is None:
            raise BrokerUnavailable(f"partition {self.name} is opening", retry_after_ms=200)
        try:
            await self.raft.read_index(timeout_s=self._timeout_s)
        except raft_errors.Timeout as exc:
            raise NotLeader(
                f"partition {self.name}: leadership not confirmed in {self._timeout_s} s",
                retry_after_ms=200,
            ) from exc
        except raft_errors.RaftError as exc:
            raise translate_raft_error(exc, f"partition {self.name}") from exc
        self.refresh_offsets()

    async def propose_delay(self, command: bytes) -> list[int]:
        """A delay command (dmq/partition/delay.py), answered after apply."""
        self.check_capacity(len(command))
        if self.raft is None:
            raise BrokerUnavailable(f"partition {self.name} is opening", retry_after_ms=200)
        try:
            result = await self.raft.propose(command, timeout_s=self._timeout_s, wait="apply")
        except raft_errors.RaftError as exc:
            raise translate_raft_error(exc, f"partition {self.name}") from exc
        for r in result or ():
            if isinstance(r, LogError):  # an idempotent schedule refused (fenced)
                raise r
        return [int(r) for r in result or ()]

    async def export_delay(self, position: tuple[int, int]) -> AsyncGenerator[bytes, None]:
        """The delay store as it was at `position`, chunk by chunk, each read on the
        storage thread (DelayStore.export); for a replica installing a snapshot."""

        def start() -> Generator[bytes, None, None]:
            assert self._machine is not None
            try:
                return self._machine.export_delay(position)
            except DelayCopyError as exc:
                raise BrokerUnavailable(f"partition {self.name}: {exc}") from exc

        stream: Generator[bytes, None, None] = await self.run(self._locked, start)
        try:
            while (chunk := await self.run(next, stream, None)) is not None:
                yield chunk
        finally:
            await self.run(stream.close)

    async def with_machine(self, fn: Callable[..., T], *args: Any) -> T:
        """fn(machine, *args) on the storage thread under the lock."""
        return await self.run(self._locked, lambda: fn(self._machine, *args))

    @property
    def delay_pending_bytes(self) -> int:
        """Bytes of delayed records pending here (an int read without the lock)."""
        machine = self._machine
        return 0 if machine is None else machine.delay.pending_bytes

    @property
    def delay_due_hint_ms(self) -> int | None:
        """No delayed record is due before this (an int read without the lock)."""
        machine = self._machine
        return None if machine is None else machine.delay.due_hint_ms

    def watch_delay(self, on_pending: Callable[[], None]) -> None:
        """Event loop, once open: on_pending() is called (tick thread) each time this
        replica's delay store starts holding records (`DelayStore.on_pending`)."""
        if self._machine is not None:
            self._machine.delay.on_pending = on_pending

    @property
    def queue_depth(self) -> int:
        return self._inflight

    @property
    def log_size_bytes(self) -> int:
        """Bytes of this replica's segments, read without the lock (a metric: a segment
        rolled or deleted meanwhile may be counted or not)."""
        log = self._log
        if log is None or self.closed:
            return 0
        return sum(segment.size_bytes for segment in tuple(log.segments))

    # ------------------------------------------------------------------ applied offsets

    def applied_from_thread(self) -> None:
        """Tick thread, after an apply: mirror offsets on the loop (once per burst; as a
        follower nobody waits on, at most every FOLLOWER_MIRROR_INTERVAL_S)."""
        if self._mirror_pending or self._loop is None:
            return
        raft = self.raft
        if raft is not None and self._waiters == 0 and not raft.status().is_leader:
            now = time.monotonic()
            if now - self._mirror_asked_at < FOLLOWER_MIRROR_INTERVAL_S:
                return
            self._mirror_asked_at = now
        self._mirror_pending = True
        # With the round's other calls for the loop, in one wake-up of it.
        self._raft_node.call_soon_after_round(self._loop, self._mirror_and_notify)

    def _mirror_and_notify(self) -> None:
        self._mirror_pending = False
        self.refresh_offsets()
        self._notify_committed()

    def refresh_offsets(self) -> None:
        """Event loop: mirror the log's offsets now. For a reader of a replica that may be
        a follower, whose mirror may lag by FOLLOWER_MIRROR_INTERVAL_S or, idle, longer."""
        log = self._log
        if log is None:
            return
        # Three int reads without the lock: each is atomic; a reader may see them a
        # moment apart, which the checks of fetch tolerate (it re-reads under the lock).
        self.log_start_offset = log.log_start_offset
        self.high_watermark = log.high_watermark
        self.log_end_offset = log.log_end_offset
        machine = self._machine
        self.last_stable_offset = (
            self.high_watermark
            if machine is None
            else min(machine.last_stable_offset, self.high_watermark)
        )

    def _notify_committed(self) -> None:
        self._committed_advanced.set()
        self._committed_advanced = asyncio.Event()

    async def wait_for_commit_past(
        self, offset: int, timeout_s: float, *, stable: bool = False
    ) -> None:
        """Return when high_watermark (`stable`: last_stable_offset) > offset, the replica
        closes, or the time is up."""
        deadline = asyncio.get_running_loop().time() + timeout_s
        self._waiters += 1  # before the check: an apply after it then wakes the loop
        try:
            self.refresh_offsets()  # a follower's mirror may lag (FOLLOWER_MIRROR_INTERVAL_S)
            while (
                self.last_stable_offset if stable else self.high_watermark
            ) <= offset and not self.closed:
                remaining = deadline - asyncio.get_running_loop().time()
                if remaining <= 0:
                    return
                event = self._committed_advanced
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(event.wait(), remaining)
        finally:
            self._waiters -= 1

    # ------------------------------------------------------------------ read

    def _locked(self, fn: Callable[..., T], *args: Any) -> T:
        with self.lock:
            if self._log is None or self.closed:
                raise BrokerUnavailable(f"partition {self.name} is closing", retry_after_ms=200)
            return fn(*args)

    async def read(self, offset: int, max_bytes: int, end_offset: int | None = None) -> ReadResult:
        """Raw ranges below end_offset (None: the high watermark); the caller closes the
        result. If the caller is cancelled while the read runs, the result is closed when
        it arrives (its descriptors never leak)."""
        assert self._log is not None
        log = self._log
        loop = asyncio.get_running_loop()
        future = loop.run_in_executor(
            self._executor,
            self._locked,
            lambda: log.read(offset, max_bytes, end_offset=end_offset),
        )
        try:
            return await asyncio.shield(future)
        except asyncio.CancelledError:
            future.add_done_callback(_close_read_result)
            raise

    async def read_batches(
        self, start_offset: int, end_offset: int, max_bytes: int
    ) -> tuple[bytes, int]:
        """Whole raw batches from start_offset, none starting at or past end_offset, and
        the offset this replica vouches for (PartitionLog.read_for_copy)."""
        log = self._log
        assert log is not None

        return await self.run(self._locked, log.read_for_copy, start_offset, end_offset, max_bytes)

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

        return await self.run(self._locked, _read)

    async def read_with(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """fn(log, *args, **kwargs) on the storage thread under the lock (a read that
        lives in its own module, e.g. dmq/partition/filtered_read.py)."""
        log = self._log
        assert log is not None
        return await self.run(self._locked, functools.partial(fn, log, *args, **kwargs))

    async def read_committed_records(
        self, offset: int, end_offset: int, max_bytes: int, max_records: int
    ) -> tuple[list[Record], int, int, int]:
        """read_records for a read_committed reader: below end_offset (the LSO), without
        the records of aborted transactions (dmq/partition/transactions.py)."""
        log = self._log
        assert log is not None

        def _read() -> tuple[list[Record], int, int, int]:
            assert self._machine is not None
            end = min(end_offset, log.high_watermark)
            aborted = self._machine.transactions.aborted_between(offset, end)
            batches = log.read_batches(offset, max_bytes, end_offset=end)
            records, next_offset = visible_records(batches, offset, end, aborted, max_records)
            return records, next_offset, log.high_watermark, log.log_start_offset

        return await self.run(self._locked, _read)

    async def aborted_between(self, start_offset: int, end_offset: int) -> list[AbortedRange]:
        """The aborted transactions overlapping [start_offset, end_offset)."""

        def _aborted() -> list[AbortedRange]:
            assert self._machine is not None
            return self._machine.transactions.aborted_between(start_offset, end_offset)

        return await self.run(self._locked, _aborted)

    async def offset_for_timestamp(self, timestamp_ms: int) -> int | None:
        assert self._log is not None
        return await self.run(self._locked, self._log.offset_for_timestamp, timestamp_ms)

    # ------------------------------------------------------------------ upkeep

    async def maybe_clean(self, now_ms: int) -> tuple[int, bool]:
        """Retention and compaction, each replica on its own (as Kafka's do).
        Compaction's build runs without the lock, so applies continue meanwhile."""
        async with self._upkeep_lock:
            if self.closed:
                return 0, False
            log = self._log
            assert log is not None
            retained = await self.run(self._locked, log.apply_retention, now_ms)
            self._log_retention(retained, log.config.retention_ms, log.config.retention_bytes)
            deleted = retained.segments
            if log.config.remote_storage_enable:
                start = log.log_start_offset
                uploaded = await self.run(self._locked, self._delete_uploaded, log, now_ms)
                if uploaded:
                    _log.info(
                        "local retention deleted %s of %s: offsets [%d, %d), uploaded to "
                        "the object store and past local_retention_ms or local_retention_bytes",
                        _segments(uploaded), self.name, start, log.log_start_offset,
                    )  # fmt: skip
                deleted += uploaded
            compacted = False
            compacted_below: int | None = None
            if log.config.compacts:
                planned = await self.run(self._locked, self._plan_compaction, log)
                if planned is not None:
                    plan, planned_end = planned
                    loop = asyncio.get_running_loop()
                    result = await loop.run_in_executor(
                        None, compaction.build_compaction, plan, now_ms
                    )
                    compacted = await self.run(
                        self._locked, compaction.install_compaction, log, result
                    )
                    compacted_below = planned_end if compacted else None
            trim = await self.run(self._locked, self._after_cleaning, compacted_below)
            self.refresh_offsets()
        if trim is not None:
            await self._propose_trim(trim)
        return deleted, compacted

    def _log_retention(
        self, retained: Retained, retention_ms: int | None, retention_bytes: int | None
    ) -> None:
        """One INFO line per pass that deleted anything: how much, of which partition, why
        (a reader whose offset went gets 416 with the new start; this line says why)."""
        if not retained.segments:
            return
        why = []
        if retained.by_age:
            why.append(f"{_segments(retained.by_age)} older than retention_ms ({retention_ms})")
        if retained.segments > retained.by_age:
            by_size = retained.segments - retained.by_age
            why.append(f"{_segments(by_size)} over retention_bytes ({retention_bytes})")
        records = retained.end_offset - retained.start_offset
        _log.info(
            "retention deleted %s of %s: offsets [%d, %d) (%d record%s, fewer if compacted); %s",
            _segments(retained.segments), self.name, retained.start_offset, retained.end_offset,
            records, "" if records == 1 else "s", ", ".join(why),
        )  # fmt: skip

    def _delete_uploaded(self, log: PartitionLog, now_ms: int) -> int:
        """Tiered storage, under the lock: local segments past local retention go, but
        only those a committed remote `add` recorded (dmq/partition/remote_manifest.py)."""
        machine = self._machine
        if machine is None:
            return 0
        closed = [
            (s.base_offset, s.next_offset, s.size_bytes, s.max_timestamp_ms)
            for s in log.segments  # the active one too: it counts, never goes
        ]
        remote = machine.remote
        if planted.active("tiered-delete-before-upload"):  # as if all were uploaded
            remote = RemoteManifest(end_offset=log.high_watermark, started=True)
        count = local_deletable(
            closed,
            remote,
            now_ms=now_ms,
            local_retention_ms=log.config.local_retention_ms,
            local_retention_bytes=log.config.local_retention_bytes,
        )
        return log.delete_oldest_segments(count)

    @property
    def remote_manifest(self) -> RemoteManifest:
        """Tiered storage's manifest (replaced whole at each apply: read without the lock)."""
        machine = self._machine
        return RemoteManifest() if machine is None else machine.remote

    def _after_cleaning(self, compacted_below: int | None) -> int | None:
        """Under the lock: forget the locally kept aborted ranges cleaning removed; on
        the leader, the horizon to propose if the replicated list can be shortened."""
        machine = self._machine
        if machine is None:
            return None
        machine.after_cleaning(compacted_below)
        status = self.raft.status() if self.raft is not None else None
        if status is None or not status.is_leader:
            return None
        clean_below = machine.clean_below
        return clean_below if machine.transactions.can_trim(clean_below) else None

    async def _propose_trim(self, horizon: int) -> None:
        """TrimCommand(horizon) through Raft (dmq/partition/transactions.py,
        "Forgetting aborted ranges"); a failure waits for the next upkeep round."""
        if self.raft is None:
            return
        try:
            await self.raft.propose(
                TrimCommand(horizon).encode(), timeout_s=self._timeout_s, wait="apply"
            )
        except raft_errors.RaftError as exc:
            _log.info("partition %s: trim to %d not applied: %s", self.name, horizon, exc)

    def _plan_compaction(self, log: PartitionLog) -> tuple[compaction.CompactionPlan, int] | None:
        """Under the lock: compaction stops at the LSO (an open transaction's records
        stay whole) and removes the aborted transactions' records (log/compaction.py).
        With the plan, the offset its segments end at: once installed, no aborted record
        is left below it."""
        machine = self._machine
        if machine is None:
            return None
        plan = compaction.plan_compaction(
            log,
            stable_offset=machine.last_stable_offset,
            aborted=machine.transactions.aborted,
        )
        if plan is None:
            return None
        last = plan.segments[-1].base_offset
        end = next(s.next_offset for s in log.segments if s.base_offset == last)
        return plan, end

    def status(self) -> dict[str, Any]:
        """This replica's Raft and log position, for `dmq cluster status`."""
        self.refresh_offsets()  # a follower's mirror may lag (FOLLOWER_MIRROR_INTERVAL_S)
        return {
            **raft_status_fields(self.raft),
            "group_id": self.group_id,
            "topic": self.topic,
            "partition": self.partition,
            "log_start_offset": self.log_start_offset,
            "high_watermark": self.high_watermark,
            "log_end_offset": self.log_end_offset,
        }


def raft_status_fields(raft: Replica | None) -> dict[str, Any]:
    """A group replica's Raft position as `dmq cluster status` reports it."""
    status = raft.status() if raft is not None else None
    return {
        "is_leader": bool(status and status.is_leader),
        "leader": status.leader_id if status else None,
        "term": status.term if status else 0,
        "commit_index": status.commit_index if status else 0,
        "last_applied": status.last_applied if status else 0,
    }


def _segments(count: int) -> str:
    return f"{count} segment{'' if count == 1 else 's'}"
