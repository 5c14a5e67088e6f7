"""Fetch: committed records, offsets and offset lookups, from the partition leader.

The path of one fetch (dmq/README.md, "dmq/broker/"): `resolve_offset` turns earliest,
latest or a timestamp into an offset, then `fetch` finds the serving replica
(routing.py: this broker's if it leads, has applied its election no-op and heard from a
majority lately; else `ForwardRequest` to the leader's broker, relayed once by
http_api/forward.py), checks the offset against the log, long-polls up to `wait_ms` on
the replica's "committed advanced" event when there is nothing yet (at most
`waiting_fetches_max` waiting), and reads on the replica's storage thread: decoded
records, or raw batches for the binary format. Only committed records are served.

The group fetch (groups.py) reads through `partition_read` / `partition_offsets`, which
answer here or ask the leader's broker themselves (a group fetch reads many partitions
in one request, so it cannot be relayed whole).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
from collections.abc import Iterator
from typing import Any, Literal

from dmq import errors, limits, planted
from dmq.broker.context import BrokerContext
from dmq.broker.filtering import fetch_filtered
from dmq.broker.routing import Routing
from dmq.broker.tiered import TieredService
from dmq.broker.transactions import Isolation, read_committed
from dmq.broker.translate import translate
from dmq.broker.types import Consistency, FetchResult, ForwardRequest, OffsetsResult
from dmq.partition.replica import PartitionReplica
from dmq.selector import RecordFilter
from log import errors as log_errors
from log.records import Header, Record

# A group position past a partition's log end (a lagging new leader) answers no records
# after at most this long, so a long-polling member looks again soon.
GROUP_AHEAD_OF_LOG_WAIT_MS = 500


class FetchService:
    """Owns the count of parked long-polls (waiting_fetches_max bounds it)."""

    def __init__(
        self, ctx: BrokerContext, routing: Routing, tiered: TieredService | None = None
    ) -> None:
        self._ctx = ctx
        self._routing = routing
        self._tiered = tiered  # tiered storage (tiered.py): reads below the local log
        self._waiting_fetches = 0  # long-polls parked now, at most waiting_fetches_max

    @property
    def waiting_fetches(self) -> int:
        return self._waiting_fetches

    async def _serving(
        self, topic: str, partition: int, forwarded: bool, consistency: Consistency
    ) -> PartitionReplica:
        """The replica that answers here (routing.py), its leadership confirmed after this
        call for a linearizable read (raft/read_index.py: one confirmation round serves
        every read that arrived before it went out)."""
        if planted.active("lease-read"):
            consistency = "leader"  # the node-level lease alone, never confirmed
        replica = self._routing.serving_replica(topic, partition, forwarded, consistency)
        if consistency == "linearizable" and not planted.active("stale-read"):
            await replica.read_barrier()
        return replica

    async def resolve_offset(
        self,
        topic: str,
        partition: int,
        *,
        offset: int | Literal["earliest", "latest"],
        timestamp_ms: int | None = None,
        forwarded: bool = False,
        consistency: Consistency = "linearizable",
    ) -> int:
        if timestamp_ms is None and isinstance(offset, int):
            # The fetch that follows confirms (or forwards); nothing is answered from here.
            self._routing.serving_replica(topic, partition, forwarded, consistency)
            return offset
        replica = await self._serving(topic, partition, forwarded, consistency)
        if timestamp_ms is not None:
            found = await self._offset_for_timestamp(replica, timestamp_ms)
            return replica.high_watermark if found is None else found
        if offset == "earliest":
            return self._first_offset(replica)
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
        forwarded: bool = False,
        record_filter: RecordFilter | None = None,
        isolation: Isolation = "read_uncommitted",
        consistency: Consistency = "linearizable",
    ) -> FetchResult:
        """Committed records from `offset` (long-polls up to wait_ms when there are none);
        with a filter, only the records it keeps (filtering.py); read_committed: below the
        LSO, aborted records left out (transactions.py). consistency: routing.py."""
        stable = isolation == "read_committed"
        count = self._ctx.traffic.fetched  # what is served is counted (traffic.py)
        replica = await self._serving(topic, partition, forwarded, consistency)
        if record_filter is None:
            remote = await self._from_store(replica, offset, max_bytes, max_records, raw, stable)
            if remote is not None:
                return count(remote)
        if not replica.log_start_offset <= offset <= replica.log_end_offset:
            start = self._first_offset(replica)
            raise errors.OffsetOutOfRange(
                f"offset {offset} is outside [{start}, {replica.log_end_offset}]",
                offset=offset,
                log_start_offset=start,
                log_end_offset=replica.log_end_offset,
            )
        if planted.active("fetch-off-by-one") and 0 < offset < replica.high_watermark:
            offset += 1
        if record_filter is not None:  # raw: the kept records as one batch (filtering.py)
            kept = await fetch_filtered(
                replica, offset, record_filter, max_bytes=max_bytes, max_records=max_records,
                wait_ms=wait_ms, scan_bytes_max=self._ctx.config.filter_scan_bytes_max,
                parked=self._parked, stable=stable,
            )  # fmt: skip
            self._check_not_deleted(replica)
            return count(kept)
        end = replica.last_stable_offset if stable else replica.high_watermark
        if offset >= end and wait_ms > 0:
            with self._parked():
                await replica.wait_for_commit_past(offset, wait_ms / 1000, stable=stable)
        if replica.closed:
            self._check_not_deleted(replica)
            # Shutting down, or the replica moved or was altered: answer the waiting
            # fetch as if its wait had run out, rather than failing it (no records, and
            # no raw batches for the binary format).
            return FetchResult(
                topic,
                partition,
                offset,
                offset,
                replica.high_watermark,
                self._first_offset(replica),
            )
        try:
            if stable:
                found = await read_committed(
                    replica, topic, partition, offset, max_bytes, max_records, raw
                )
                found.log_start_offset = self._first_offset(replica)
                return count(found)
            if raw:
                result = await replica.read(offset, max_bytes)
                return count(
                    FetchResult(
                        topic,
                        partition,
                        offset,
                        result.next_offset,
                        result.high_watermark,
                        self._first_offset(replica),
                        raw=result,
                        last_stable_offset=replica.last_stable_offset,
                    )
                )
            recs, next_offset, hw, _ = await replica.read_records(offset, max_bytes, max_records)
        except log_errors.OffsetOutOfRangeError as exc:
            # The local log start passed `offset` after the check above (uploaded segments
            # deleted locally meanwhile, during a long-poll or under the storage lock): the
            # object store holds it now. Refused as the local log's, the caller would move
            # the position to the local start and skip the remote records.
            remote = await self._from_store(replica, offset, max_bytes, max_records, raw, stable)
            if remote is not None:
                return count(remote)
            raise translate(exc) from exc
        except log_errors.LogError as exc:
            raise translate(exc) from exc
        # The partition's first offset, not the local log's: with tiered storage a reader
        # (a share group's start, a consumer's reset) must not skip the remote part.
        return count(FetchResult(
            topic, partition, offset, next_offset, hw, self._first_offset(replica), records=recs,
            last_stable_offset=replica.last_stable_offset,
        ))  # fmt: skip

    def _check_not_deleted(self, replica: PartitionReplica) -> None:
        """TopicNotFound (404) when the replica was closed because its topic was deleted
        (or deleted and created again: a new topic id) while a fetch waited on it. Such a
        fetch answers as one that arrives after the delete, whatever its format, as Kafka
        answers UNKNOWN_TOPIC_OR_PARTITION: a consumer must learn the topic is gone, not
        read an empty answer and ask again forever (http_api/README.md, "Fetch")."""
        if not replica.closed:
            return
        view = self._routing.view(replica.topic)
        if view is None or view.topic_id != replica.topic_id:
            raise errors.TopicNotFound(
                f"topic {replica.topic!r} was deleted while this fetch waited",
                field="topic",
            )

    async def _from_store(
        self,
        replica: PartitionReplica,
        offset: int,
        max_bytes: int,
        max_records: int,
        raw: bool,
        stable: bool,
    ) -> FetchResult | None:
        """The object store's answer for an offset below the local log (tiered storage),
        or None: no tiered storage, an offset the local log holds, or none uploaded."""
        if self._tiered is None or offset >= replica.log_start_offset:
            return None
        return await self._tiered.fetch(
            replica, offset, max_bytes, max_records, raw=raw, stable=stable
        )

    async def _offset_for_timestamp(
        self, replica: PartitionReplica, timestamp_ms: int
    ) -> int | None:
        """The local log's answer, or, with tiered storage, the start of the first remote
        segment below the local log holding a timestamp >= timestamp_ms (per segment)."""
        if self._tiered is not None:
            remote = self._tiered.offset_for_timestamp(replica, timestamp_ms)
            if remote is not None:
                return remote
        return await replica.offset_for_timestamp(timestamp_ms)

    def _first_offset(self, replica: PartitionReplica) -> int:
        """The log start a reader sees: below the local one when tiered storage holds more."""
        if self._tiered is None:
            return replica.log_start_offset
        return self._tiered.first_offset(replica)

    @contextlib.contextmanager
    def _parked(self) -> Iterator[None]:
        """A long-poll parked for its wait: at most waiting_fetches_max at once (429)."""
        if self._waiting_fetches >= self._ctx.config.waiting_fetches_max:
            raise errors.Backpressure(
                f"{self._waiting_fetches} fetches are waiting (waiting_fetches_max)",
                limit=self._ctx.config.waiting_fetches_max,
            )
        self._waiting_fetches += 1
        try:
            yield
        finally:
            self._waiting_fetches -= 1

    async def list_offsets(
        self,
        topic: str,
        partition: int,
        timestamp_ms: int | None,
        *,
        forwarded: bool = False,
        consistency: Consistency = "linearizable",
    ) -> OffsetsResult:
        replica = await self._serving(topic, partition, forwarded, consistency)
        found = None
        if timestamp_ms is not None:
            found = await self._offset_for_timestamp(replica, timestamp_ms)
        return OffsetsResult(
            partition, self._first_offset(replica), replica.high_watermark, found,
            replica.last_stable_offset,
        )  # fmt: skip

    async def read_batches(
        self, topic: str, partition: int, start_offset: int, end_offset: int
    ) -> tuple[bytes, int]:
        """Internal (a lagging replica's catch-up): this replica's committed batches from
        start_offset, up to end_offset or fetch_bytes_max; and the offset up to which it
        vouches for the range (past the last batch when only compaction gaps follow)."""
        view = self._routing.topic(topic)
        self._routing.check_partition(view, partition)
        replica = self._ctx.replicas.local(topic, partition, view.topic_id)
        if replica is None:
            raise errors.BrokerUnavailable(f"no replica of {topic}-{partition} here")
        if start_offset < replica.log_start_offset and self._tiered is not None:
            # Uploaded and deleted here since the copier's snapshot: from the store.
            remote = await self._tiered.read_for_copy(
                replica, start_offset, end_offset, self._ctx.config.fetch_bytes_max
            )
            if remote is not None:
                return remote
        if not replica.log_start_offset <= start_offset <= replica.high_watermark:
            raise errors.OffsetOutOfRange(
                f"offset {start_offset} is outside [{replica.log_start_offset}, "
                f"{replica.high_watermark}] here",
                offset=start_offset,
                log_start_offset=replica.log_start_offset,
                log_end_offset=replica.log_end_offset,
            )
        try:
            return await replica.read_batches(
                start_offset, end_offset, self._ctx.config.fetch_bytes_max
            )
        except log_errors.LogError as exc:
            raise translate(exc) from exc

    async def partition_read(
        self,
        topic: str,
        partition: int,
        offset: int,
        wait_ms: int,
        max_records: int,
        max_bytes: int = limits.FETCH_BYTES_DEFAULT,
        record_filter: RecordFilter | None = None,
        isolation: Isolation = "read_uncommitted",
    ) -> FetchResult:
        """For the group fetch (dmq/broker/groups.py): records from `offset`, read here or
        at the partition leader's broker. A position below the log start (retention removed
        it) reads from the log start, as Kafka's auto.offset.reset=earliest. A position past
        the log end is never moved back: a new leader may still lag the committed offset,
        and serving from its end would deliver records again and let the next commit move
        the group backwards. It answers no records (after up to wait_ms) until the log
        reaches the position."""
        max_bytes = min(max_bytes, self._ctx.config.fetch_bytes_max)
        try:
            return await self._read_here_or_there(
                topic, partition, offset, wait_ms, max_records, max_bytes, record_filter,
                isolation,
            )  # fmt: skip
        except errors.OffsetOutOfRange as exc:
            start, end = exc.log_start_offset, exc.log_end_offset
            if offset > end:
                await asyncio.sleep(min(wait_ms, GROUP_AHEAD_OF_LOG_WAIT_MS) / 1000)
                return FetchResult(topic, partition, offset, offset, end, start)
            return await self._read_here_or_there(
                topic, partition, start, wait_ms, max_records, max_bytes, record_filter,
                isolation,
            )  # fmt: skip

    async def _read_here_or_there(
        self, topic: str, partition: int, offset: int, wait_ms: int, max_records: int,
        max_bytes: int, record_filter: RecordFilter | None = None,
        isolation: Isolation = "read_uncommitted",
    ) -> FetchResult:  # fmt: skip
        try:
            return await self.fetch(
                topic, partition, offset=offset, max_bytes=max_bytes,
                max_records=max_records, wait_ms=wait_ms, raw=False, record_filter=record_filter,
                isolation=isolation,
            )  # fmt: skip
        except ForwardRequest as fwd:
            params = {"offset": str(offset), "wait_ms": str(wait_ms), "value_encoding": "base64"}
            params["isolation"] = isolation
            params |= {"max_records": str(max_records), "max_bytes": str(max_bytes)}
            params |= dict(record_filter.params if record_filter is not None else ())
            doc = await self._ctx.peers.call(
                "GET", fwd.http_addr, f"/v1/topics/{topic}/partitions/{partition}/records",
                params=params, timeout_s=wait_ms / 1000 + self._ctx.timeout_s,
            )  # fmt: skip
            return fetch_result_from_json(topic, partition, offset, doc)

    async def partition_offsets(
        self, topic: str, partition: int, timestamp_ms: int | None = None
    ) -> OffsetsResult:
        """list_offsets answered here or at the partition leader's broker."""
        try:
            return await self.list_offsets(topic, partition, timestamp_ms)
        except ForwardRequest as fwd:
            params = {} if timestamp_ms is None else {"timestamp": str(timestamp_ms)}
            doc = await self._ctx.peers.call(
                "GET", fwd.http_addr, f"/v1/topics/{topic}/partitions/{partition}/offsets",
                params=params, timeout_s=self._ctx.timeout_s,
            )  # fmt: skip
            return OffsetsResult(
                partition, doc["log_start_offset"], doc["high_watermark"], doc["offset"],
                doc.get("last_stable_offset"),
            )  # fmt: skip


def fetch_result_from_json(
    topic: str, partition: int, offset: int, doc: dict[str, Any]
) -> FetchResult:
    """A base64 JSON fetch answer from another broker, as the local fetch returns it."""

    def raw(text: str | None) -> bytes | None:
        return None if text is None else base64.b64decode(text)

    records = [
        Record(
            raw(r["key"]),
            raw(r["value"]),
            tuple(Header(h["key"], base64.b64decode(h["value"])) for h in r["headers"]),
            r["timestamp"],
            r["offset"],
        )
        for r in doc["records"]
    ]
    return FetchResult(
        topic, partition, offset, doc["next_offset"], doc["high_watermark"],
        doc["log_start_offset"], records=records,
    )  # fmt: skip
