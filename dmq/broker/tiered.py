"""Tiered storage's broker duties: upload closed segments, trim by total retention, and
serve fetches below the local log start from the object store (dmq/tiered/README.md).

Steps, every `remote_upload_interval_ms`, for each partition led here whose topic has
`remote_storage_enable` (partitions side by side, uploads at most
`remote_upload_concurrency` at once and `remote_upload_bytes_per_s` in all):

1. Under the replica's lock, take the closed segments after the manifest's end whose
   records are all committed and decided (next_offset <= min(high watermark, LSO): the
   aborted transactions they overlap are then known), with descriptors of their files.
2. Upload each: `.log`, `.index`, `.timeindex` under a key made of the partition and the
   segment's offsets (the same segment always gets the same key: a retry, or a restart
   after a kill -9 mid-upload, writes the same objects again).
3. Propose `RemoteCommand add` through the partition's Raft group and wait for its apply.
   Only then may a replica delete the segment locally (dmq/partition/replica.py's
   retention: `remote_manifest.local_deletable`), each on its own clock.
4. Total retention over the remote part: propose `trim`; once applied, delete the
   trimmed segments' objects (manifest first, then objects). Objects left by a leader
   that died between the two, or uploads never recorded, go in the orphan sweep; those
   of deleted topics in the metadata leader's sweep (`_sweep_deleted_topics`).

A failure of one partition's round (store down, leadership lost) backs that partition
off exponentially (UPLOAD_BACKOFF_*), the others go on.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from dmq import errors
from dmq.broker.context import BrokerContext
from dmq.broker.types import FetchResult
from dmq.metadata.service import translate_raft_error, wall_ms
from dmq.partition.machine import PartitionStateMachine
from dmq.partition.remote_manifest import RemoteCommand, RemoteManifest, RemoteSegment
from dmq.partition.replica import PartitionReplica
from dmq.partition.transactions import visible_records
from dmq.tiered.cache import ChunkCache
from dmq.tiered.remote_read import object_keys, read_segment
from dmq.tiered.store import ObjectNotFound, ObjectStore, ObjectStoreError, open_store
from log import records as fmt
from log.errors import LogError
from log.partition_log import FileRange, ReadResult
from raft import errors as raft_errors

_log = logging.getLogger("dmq.broker.tiered")

UPLOAD_SEGMENTS_PER_ROUND = 16  # per partition: a round ends, the next one continues
UPLOAD_BACKOFF_MIN_S = 0.5  # after a partition's failed round; doubles up to the max
UPLOAD_BACKOFF_MAX_S = 30.0
ORPHAN_SWEEP_ROUNDS = 60  # a leader lists its partition's objects once per this many rounds
CACHE_DIRECTORY = "remote-cache"  # under the data directory, emptied at start


class RateLimiter:
    """A token bucket of `rate` bytes/s holding at most one second of tokens."""

    def __init__(self, rate: int) -> None:
        self.rate = rate
        self._tokens = float(rate)
        self._at = time.monotonic()

    async def acquire(self, n: int) -> None:
        now = time.monotonic()
        self._tokens = min(float(self.rate), self._tokens + (now - self._at) * self.rate)
        self._at = now
        self._tokens -= n  # may go negative: the next callers wait it back
        if self._tokens < 0:
            await asyncio.sleep(-self._tokens / self.rate)


@dataclass(slots=True)
class _Candidate:
    """A closed segment to upload, with descriptors of its files (closed after)."""

    base_offset: int
    end_offset: int
    first_timestamp_ms: int
    max_timestamp_ms: int
    fds: list[tuple[int, int]]  # (fd, size) of .log, .index, .timeindex; fd -1: none
    aborted: tuple[tuple[int, int, int], ...]

    def close(self) -> None:
        for fd, _ in self.fds:
            if fd >= 0:
                os.close(fd)


def _open_sized(path: Path) -> tuple[int, int]:
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        return -1, 0
    return fd, os.fstat(fd).st_size


def _collect(machine: PartitionStateMachine) -> tuple[list[_Candidate], RemoteManifest, int]:
    """Step 1, under the replica's lock: candidates, the manifest, and the local bytes
    not uploaded yet (for the total-retention arithmetic)."""
    log, manifest = machine.log, machine.remote
    decided = min(log.high_watermark, machine.last_stable_offset)
    candidates: list[_Candidate] = []
    not_uploaded = 0
    try:
        for segment in log.segments:
            if manifest.started and segment.next_offset <= manifest.end_offset:
                continue
            not_uploaded += segment.size_bytes
            if (
                segment is log.active
                or segment.is_empty
                or segment.next_offset > decided
                or len(candidates) >= UPLOAD_SEGMENTS_PER_ROUND
            ):
                continue
            fds = [
                _open_sized(p)
                for p in (segment.log_path, segment.index_path, segment.timeindex_path)
            ]
            candidates.append(
                _Candidate(
                    segment.base_offset,
                    segment.next_offset,
                    segment.first_batch_timestamp_ms or segment.max_timestamp_ms,
                    segment.max_timestamp_ms,
                    fds,
                    tuple(
                        machine.transactions.aborted_between(
                            segment.base_offset, segment.next_offset
                        )
                    ),
                )
            )
    except BaseException:
        for c in candidates:
            c.close()
        raise
    return candidates, manifest, not_uploaded


class TieredService:
    """The upload, trim and remote-read duties of one broker (module docstring)."""

    def __init__(self, ctx: BrokerContext, store: ObjectStore, cache: ChunkCache) -> None:
        self._ctx = ctx
        self.store = store
        self.cache = cache
        config = ctx.config
        self._uploads = asyncio.Semaphore(config.remote_upload_concurrency)
        self._bandwidth = RateLimiter(config.remote_upload_bytes_per_s)
        self._backoff: dict[str, tuple[int, float]] = {}  # partition -> (failures, until)
        self._rounds = 0
        # Counters (metrics, bench): monotonic since start.
        self.uploaded_segments = 0
        self.uploaded_bytes = 0
        self.upload_seconds = 0.0  # spent in puts, bandwidth waits included
        self.upload_failures = 0
        self.remote_reads = 0
        self.remote_read_bytes = 0

    @classmethod
    def open(cls, ctx: BrokerContext) -> TieredService:
        c = ctx.config
        cache = ChunkCache(
            ctx.data_dir / CACHE_DIRECTORY,
            capacity_bytes=c.remote_cache_bytes,
            chunk_bytes=c.remote_cache_chunk_bytes,
        )
        return cls(ctx, open_store(c.remote_storage, c.remote_storage_endpoint), cache)

    async def close(self) -> None:
        await self.store.close()

    # ------------------------------------------------------------------ the duty

    async def upload_loop(self) -> None:
        interval_s = self._ctx.config.remote_upload_interval_ms / 1000
        await asyncio.to_thread(self.cache.reset)  # the data directory is locked by now
        while True:
            await asyncio.sleep(interval_s)
            self._rounds += 1
            replicas = [r for r in self._ctx.replicas.values() if not r.closed]
            await asyncio.gather(*(self._tend(r) for r in replicas))
            if self._rounds % ORPHAN_SWEEP_ROUNDS == 0:
                try:
                    await self._sweep_deleted_topics()
                except Exception:  # the next sweep tries again
                    _log.exception("tiered storage: sweeping deleted topics failed")

    async def _sweep_deleted_topics(self) -> None:
        """On the metadata leader: objects of topics the catalogue no longer has (a topic
        deleted, or deleted and created again: another topic id) are deleted."""
        metadata = self._ctx.metadata_service
        raft = None if metadata is None else metadata.replica
        if metadata is None or raft is None or not raft.status().is_leader:
            return
        live = {f"{t.name}-{t.topic_id}" for t in metadata.state.topics.values()}
        for key in await self.store.list_keys(f"{self._ctx.cluster_id}/"):
            parts = key.split("/")
            if len(parts) > 2 and parts[1] not in live:
                await self.store.delete(key)
                self.cache.drop_object(key)

    async def _tend(self, replica: PartitionReplica) -> None:
        """One partition's round; a failure backs this partition off, never the loop."""
        failures, until = self._backoff.get(replica.name, (0, 0.0))
        if time.monotonic() < until:
            return
        try:
            if not replica.log_config.remote_storage_enable:
                return
            leader = replica.raft is not None and replica.raft.status().is_leader
            await self._delete_trimmed(replica, leader)
            if not leader:
                return
            await self._upload_round(replica)
            await self._maybe_trim(replica)
            if self._rounds % ORPHAN_SWEEP_ROUNDS == 0:
                await self._sweep_orphans(replica)
            self._backoff.pop(replica.name, None)
        except Exception as exc:  # one partition's failure never ends the duty
            self.upload_failures += 1
            delay = min(UPLOAD_BACKOFF_MAX_S, UPLOAD_BACKOFF_MIN_S * 2**failures)
            self._backoff[replica.name] = (failures + 1, time.monotonic() + delay)
            _log.warning("tiered storage of %s: %s (next try in %.1f s)", replica.name, exc, delay)

    async def _upload_round(self, replica: PartitionReplica) -> None:
        candidates, manifest, _ = await replica.with_machine(_collect)
        try:
            for candidate in candidates:
                if manifest.segments and candidate.base_offset > manifest.end_offset:
                    # Local total retention removed segments never uploaded: the remote
                    # part ends before the local one starts; total retention trims it.
                    _log.info(
                        "%s: local log starts at %d after the remote end %d",
                        replica.name, candidate.base_offset, manifest.end_offset,
                    )  # fmt: skip
                    return
                segment = await self._upload(replica, candidate)
                manifest = await self._propose(replica, RemoteCommand("add", (segment,)))
        finally:
            for candidate in candidates:
                candidate.close()

    def _key_prefix(self, replica: PartitionReplica) -> str:
        return f"{self._ctx.cluster_id}/{replica.topic}-{replica.topic_id}/{replica.partition}/"

    async def _upload(self, replica: PartitionReplica, c: _Candidate) -> RemoteSegment:
        """Step 2: the three objects; the manifest names them only once all are stored."""
        key = f"{self._key_prefix(replica)}{c.base_offset:020d}-{c.end_offset:020d}"
        async with self._uploads:
            began = time.monotonic()
            for (fd, size), object_key in zip(c.fds, object_keys(key), strict=True):
                if fd >= 0:
                    await self.store.put_file(object_key, fd, size, self._bandwidth.acquire)
                    self.uploaded_bytes += size
            self.upload_seconds += time.monotonic() - began
        self.uploaded_segments += 1
        return RemoteSegment(
            c.base_offset, c.end_offset, c.fds[0][1], c.fds[1][1],
            c.first_timestamp_ms, c.max_timestamp_ms, key, c.aborted,
        )  # fmt: skip

    async def _propose(self, replica: PartitionReplica, command: RemoteCommand) -> RemoteManifest:
        """Step 3: through the partition's Raft group, answered after apply."""
        if replica.raft is None:
            raise errors.BrokerUnavailable(f"partition {replica.name} is opening")
        try:
            result = await replica.raft.propose(
                command.encode(), timeout_s=self._ctx.timeout_s, wait="apply"
            )
        except raft_errors.RaftError as exc:
            raise translate_raft_error(exc, f"partition {replica.name}") from exc
        for outcome in result or ():
            if isinstance(outcome, LogError):
                raise outcome
        return replica.remote_manifest

    async def _maybe_trim(self, replica: PartitionReplica) -> None:
        """Step 4: total retention (retention_ms, retention_bytes) over remote segments,
        oldest first, counting the local bytes not uploaded yet towards the total."""
        _, manifest, not_uploaded = await replica.with_machine(_collect_no_fds)
        config = replica.log_config
        now_ms = wall_ms()
        total = manifest.remote_bytes + not_uploaded
        trim_to = manifest.start_offset
        for segment in manifest.segments:
            expired = (
                config.retention_ms is not None
                and segment.max_timestamp_ms < now_ms - config.retention_ms
            )
            oversize = (
                config.retention_bytes is not None
                and total - segment.size_bytes >= config.retention_bytes
            )
            if not (expired or oversize):
                break
            total -= segment.size_bytes
            trim_to = segment.end_offset
        if trim_to > manifest.start_offset:
            await self._propose(replica, RemoteCommand("trim", start_offset=trim_to))
            await self._delete_trimmed(replica, True)

    async def _delete_trimmed(self, replica: PartitionReplica, leader: bool) -> None:
        """Objects of segments a trim removed (the leader deletes; others only forget)."""

        def take(machine: PartitionStateMachine) -> list[RemoteSegment]:
            removed, machine.remote_removed = machine.remote_removed, []
            return removed

        removed = await replica.with_machine(take)
        if not leader:
            return
        for segment in removed:
            for key in object_keys(segment.key):
                await self.store.delete(key)
                self.cache.drop_object(key)

    async def _sweep_orphans(self, replica: PartitionReplica) -> None:
        """Objects no manifest entry names, below the manifest's end: trimmed segments
        whose deletion a crash cut, or uploads a leader never recorded."""
        manifest = replica.remote_manifest
        named = {k for s in manifest.segments for k in object_keys(s.key)}
        for key in await self.store.list_keys(self._key_prefix(replica)):
            stem = key.rsplit("/", 1)[-1].split(".", 1)[0]
            _, _, end = stem.partition("-")
            if key not in named and end.isdigit() and int(end) <= manifest.end_offset:
                await self.store.delete(key)

    # ------------------------------------------------------------------ reads

    def first_offset(self, replica: PartitionReplica) -> int:
        """The partition's log start: the remote start when the remote part reaches the
        local log (else local retention removed what was never uploaded)."""
        return replica.remote_manifest.first_offset(replica.log_start_offset)

    async def read_for_copy(
        self, replica: PartitionReplica, start_offset: int, end_offset: int, max_bytes: int
    ) -> tuple[bytes, int] | None:
        """For a replica restoring a snapshot (fetch.py's read_batches): the batches from
        start_offset that this replica deleted locally after uploading them, and the
        offset they cover up to; None when no remote segment holds start_offset."""
        segment = replica.remote_manifest.segment_for(start_offset)
        if segment is None:
            return None
        end = min(end_offset, segment.end_offset, replica.high_watermark)
        try:
            data, next_offset = await read_segment(
                self.store, self.cache, segment, start_offset, max_bytes, end
            )
        except ObjectStoreError as exc:
            raise errors.BrokerUnavailable(
                f"partition {replica.name}: remote storage: {exc}", retry_after_ms=1000
            ) from exc
        return data, min(next_offset, end)

    def offset_for_timestamp(self, replica: PartitionReplica, timestamp_ms: int) -> int | None:
        """A lookup by time below the local log start: the first offset of the first remote
        segment (from the partition's first offset) whose max_timestamp_ms >= timestamp_ms;
        None when that lies in the local log. Per segment, not per record: a reader may
        see a few older records first (the records are not fetched to look)."""
        manifest = replica.remote_manifest
        local = replica.log_start_offset
        first = manifest.first_offset(local)
        for segment in manifest.segments:
            if segment.end_offset <= first or segment.max_timestamp_ms < timestamp_ms:
                continue
            offset = max(segment.base_offset, first)
            return offset if offset < local else None
        return None

    async def fetch(
        self,
        replica: PartitionReplica,
        offset: int,
        max_bytes: int,
        max_records: int,
        *,
        raw: bool,
        stable: bool,
    ) -> FetchResult | None:
        """A fetch below the local log start, from the remote segment holding `offset`;
        None when no remote segment holds it (the caller answers as before)."""
        segment = replica.remote_manifest.segment_for(offset)
        if segment is None or offset >= replica.log_start_offset:
            return None
        hw, lso = replica.high_watermark, replica.last_stable_offset
        end = min(segment.end_offset, lso if stable else hw)
        try:
            data, next_offset = await read_segment(
                self.store, self.cache, segment, offset, max_bytes, end
            )
        except ObjectNotFound as exc:  # trimmed by retention meanwhile
            start = self.first_offset(replica)
            raise errors.OffsetOutOfRange(
                f"offset {offset} was removed by retention ({exc})",
                offset=offset, log_start_offset=start, log_end_offset=replica.log_end_offset,
            ) from exc  # fmt: skip
        except ObjectStoreError as exc:
            raise errors.BrokerUnavailable(
                f"partition {replica.name}: remote storage: {exc}", retry_after_ms=1000
            ) from exc
        self.remote_reads += 1
        self.remote_read_bytes += len(data)
        start = self.first_offset(replica)
        aborted = [a for a in segment.aborted if a[2] >= offset and a[1] < next_offset]
        result = FetchResult(
            replica.topic, replica.partition, offset, next_offset, hw, start,
            last_stable_offset=lso, aborted=tuple(aborted) if stable else (),
        )  # fmt: skip
        if raw:
            result.raw = _memory_read_result(data, segment.key, offset, next_offset, hw, start)
            return result
        batches = (
            fmt.decode_batch(memoryview(data)[p : p + h.size_bytes], verify=False)
            for p, h in fmt.iter_batches(data)
        )
        if stable:
            result.records, result.next_offset = visible_records(
                batches, offset, end, aborted, max_records
            )
            return result
        for batch in batches:
            if batch.header.is_control:
                continue
            result.records.extend(r for r in batch.records if offset <= r.offset < end)
        if len(result.records) >= max_records:
            del result.records[max_records:]
            result.next_offset = result.records[-1].offset + 1
        return result

    # ------------------------------------------------------------------ visibility

    def partition_status(self, replica: PartitionReplica) -> dict[str, Any]:
        manifest = replica.remote_manifest
        return {
            "remote_end_offset": manifest.end_offset if manifest.started else None,
            "remote_bytes": manifest.remote_bytes,
            "local_bytes": replica.log_size_bytes,
        }


def _collect_no_fds(machine: PartitionStateMachine) -> tuple[None, RemoteManifest, int]:
    """_collect's manifest and not-uploaded bytes, opening nothing."""
    manifest = machine.remote
    not_uploaded = sum(
        s.size_bytes
        for s in machine.log.segments
        if not (manifest.started and s.next_offset <= manifest.end_offset)
    )
    return None, manifest, not_uploaded


def _memory_read_result(
    data: bytes, key: str, offset: int, next_offset: int, hw: int, start: int
) -> ReadResult:
    """Remote bytes as a ReadResult over an anonymous memory file, so the binary fetch
    path (sendfile) serves them as it serves local segments."""
    ranges = []
    if data:
        fd = os.memfd_create("dmq-remote-read", os.MFD_CLOEXEC)
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
        except BaseException:
            with contextlib.suppress(OSError):
                os.close(fd)
            raise
        ranges.append(FileRange(fd, f"remote:{key}", 0, len(data)))
    return ReadResult(ranges, offset, next_offset, hw, start)


class TieredCollector(Collector):
    """/metrics families of tiered storage, read at scrape time (broker totals: bounded
    series; per partition, GET /v1/topics/{t} says it)."""

    def __init__(self, tiered: TieredService) -> None:
        self._tiered = tiered

    def collect(self) -> Iterator[CounterMetricFamily | GaugeMetricFamily]:
        t = self._tiered
        counters = (
            ("dmq_tiered_uploaded_segments", "segments uploaded", t.uploaded_segments),
            ("dmq_tiered_uploaded_bytes", "bytes uploaded", t.uploaded_bytes),
            ("dmq_tiered_upload_seconds", "time spent uploading", t.upload_seconds),
            ("dmq_tiered_upload_failures", "failed partition upload rounds", t.upload_failures),
            ("dmq_tiered_remote_reads", "fetches answered from the object store", t.remote_reads),
            ("dmq_tiered_remote_read_bytes", "bytes those fetches answered", t.remote_read_bytes),
            ("dmq_tiered_cache_hits", "chunk cache hits", t.cache.hits),
            ("dmq_tiered_cache_misses", "chunk cache misses (ranged GETs)", t.cache.misses),
        )
        for name, text, value in counters:
            yield CounterMetricFamily(name, text, value=value)
        replicas = [r for r in t._ctx.replicas.values() if r.log_config.remote_storage_enable]
        yield GaugeMetricFamily(
            "dmq_tiered_cache_bytes", "bytes in the chunk cache", value=t.cache.used_bytes
        )
        yield GaugeMetricFamily(
            "dmq_tiered_remote_bytes",
            "bytes in the object store of the tiered partitions hosted here",
            value=sum(r.remote_manifest.remote_bytes for r in replicas),
        )
        yield GaugeMetricFamily(
            "dmq_tiered_local_bytes",
            "local segment bytes of the tiered partitions hosted here",
            value=sum(r.log_size_bytes for r in replicas),
        )
