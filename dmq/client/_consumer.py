"""AsyncConsumer: reads assigned partitions by offset, with binary long-poll fetches.

How positions move (the sync `Consumer` runs exactly this on its private loop):

1. `assign([(topic, partition), ...])`, or `topic=` (every partition of that topic, looked
   up on the first poll), sets the partitions. A partition starts at `auto_offset_reset`
   ("earliest" by default) unless `seek` says otherwise.
2. `seek(topic, partition, offset | "earliest" | "latest")` and `seek_to_timestamp` are
   lazy: the next `poll` or `position` resolves names and timestamps with
   `GET .../offsets` ("latest" is the high watermark, the next offset to be committed; a
   timestamp later than every record also lands there).
3. `poll` keeps at most one fetch in flight per partition,
   `GET .../records?format=binary&offset=F&max_bytes=B&wait_ms=W`, long-polling for up to
   the poll's remaining time. The answer is whole stored batches: they are decoded with
   `log.records` (CRC checked), records below F are dropped (the first batch may start
   before F), and F becomes the `X-Dmq-Next-Offset` header. At most one answer is
   buffered per partition, so memory stays near fetch_bytes_max per partition.
4. `poll` returns buffered records, a partition at a time, starting with a different
   partition each call, up to `max_records`; `position(tp)` is the offset of the next
   record `poll` will return for tp.
5. A 416 `offset_out_of_range` (retention deleted the data under the consumer, or a seek
   past the end) moves the partition to `auto_offset_reset`; with "none" it is raised.

Consumer groups (`_group.py`, `AsyncGroupConsumer`) drive this class: the group's
assignment calls `assign`, and the group's committed offsets `seek` a newly assigned
partition (`auto_offset_reset` where the group has none).
"""

from __future__ import annotations

import asyncio
import json
import ssl
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Literal

from dmq.client import _limits
from dmq.client._http import BATCHES, Transport, header, topic_path
from dmq.client._parse import parse_description, parse_offsets
from dmq.client._types import ConsumerRecord, TopicPartition
from dmq.errors import DmqError, InvalidRequest, OffsetOutOfRange, StorageError, TopicNotFound
from log.errors import LogError
from log.records import decode_batch, iter_batches

OffsetReset = Literal["earliest", "latest", "none"]
# read_committed: only committed transactions' records, never past the last stable offset
# (the broker stops there and names the aborted transactions; this consumer drops them).
Isolation = Literal["read_uncommitted", "read_committed"]
SeekTo = int | Literal["earliest", "latest"]


@dataclass(frozen=True, slots=True)
class _Reset:
    """A position still to be resolved with the offsets endpoint."""

    to: Literal["earliest", "latest", "timestamp", "none"]  # none: raise, no position
    timestamp_ms: int | None = None


@dataclass(frozen=True, slots=True)
class _Fetched:
    offset: int  # the fetch offset the request was made for
    records: list[ConsumerRecord]
    next_offset: int


@dataclass(slots=True)
class _Partition:
    """One assigned partition. Invariant: exactly one of fetch_offset and reset is set,
    and every buffered record's offset is below fetch_offset, in increasing order."""

    fetch_offset: int | None
    reset: _Reset | None
    buffer: deque[ConsumerRecord] = field(default_factory=deque)
    fetch: asyncio.Task[_Fetched] | None = None


def decode_fetched(
    body: bytes,
    topic: str,
    partition: int,
    start_offset: int,
    aborted: list[tuple[int, int, int]] | None = None,
) -> tuple[list[ConsumerRecord], int]:
    """The records at or after `start_offset` in a binary fetch answer, and the offset
    that follows its last batch (`start_offset` if it holds none).

    Raises StorageError if a batch fails its framing or CRC check, or if offsets do
    not increase: such data is never handed to the user.
    """
    records: list[ConsumerRecord] = []
    end = start_offset
    view = memoryview(body)
    try:
        for pos, batch_header in iter_batches(view):
            end = max(end, batch_header.next_offset)
            if batch_header.next_offset <= start_offset or batch_header.is_control:
                continue
            if (
                aborted
                and batch_header.is_transactional
                and any(
                    p == batch_header.producer_id and f <= batch_header.base_offset <= m
                    for p, f, m in aborted
                )
            ):
                continue  # read_committed: a batch of an aborted transaction
            batch = decode_batch(view[pos : pos + batch_header.size_bytes])
            for r in batch.records:
                if r.offset < start_offset:
                    continue
                if records and r.offset <= records[-1].offset:
                    raise StorageError(
                        f"fetched offsets of {topic}-{partition} go back from "
                        f"{records[-1].offset} to {r.offset}"
                    )
                headers = tuple((h.key, h.value) for h in r.headers)
                records.append(
                    ConsumerRecord(
                        topic, partition, r.offset, r.timestamp_ms, r.key, r.value, headers
                    )
                )
    except LogError as exc:
        raise StorageError(
            f"a batch fetched from {topic}-{partition} at offset {start_offset} fails its "
            f"checks: {exc}"
        ) from exc
    return records, end


class AsyncConsumer:
    """Reads records from assigned partitions (see the module docstring for the steps).

    Use it as `async with AsyncConsumer(url, topic="orders") as consumer:` or call
    `close()`. It belongs to the event loop it is first used in; not thread-safe.
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
        isolation: Isolation = "read_uncommitted",
        tls: ssl.SSLContext | None = None,
        token: str | None = None,
    ) -> None:
        if isolation not in ("read_uncommitted", "read_committed"):
            raise ValueError(
                f"isolation must be read_uncommitted or read_committed, not {isolation!r}"
            )
        self._isolation = isolation
        if auto_offset_reset not in ("earliest", "latest", "none"):
            raise ValueError(
                f"auto_offset_reset must be earliest, latest or none, not {auto_offset_reset!r}"
            )
        if not 1 <= fetch_bytes_max <= _limits.FETCH_BYTES_MAX:
            raise ValueError(f"fetch_bytes_max must be in 1..{_limits.FETCH_BYTES_MAX}")
        self._transport = Transport(
            url,
            request_timeout_ms=request_timeout_ms,
            retries=retries,
            retry_backoff_ms=retry_backoff_ms,
            api_timeout_ms=default_api_timeout_ms,
            tls=tls,
            token=token,
        )
        self._topic = topic
        self._auto_offset_reset = auto_offset_reset
        self._fetch_bytes_max = fetch_bytes_max
        # The longest long-poll asked for; lowered if the broker's own bound is lower.
        self._fetch_wait_ms_max = _limits.FETCH_WAIT_MS_MAX
        # Insertion order is the assignment order; poll starts draining at _drain_start.
        self._partitions: dict[TopicPartition, _Partition] = {}
        self._drain_start = 0
        self._closed = False

    @property
    def url(self) -> str:
        return self._transport.url

    async def __aenter__(self) -> AsyncConsumer:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    # ------------------------------------------------------------------ assignment

    def assign(self, partitions: Iterable[tuple[str, int]]) -> None:
        """Read exactly these partitions from now on (replaces `topic=` and any earlier
        assignment). Partitions kept from the old assignment keep their position."""
        self._check_open()
        wanted = [TopicPartition(str(t), int(p)) for t, p in partitions]
        if any(tp.partition < 0 for tp in wanted):
            raise ValueError("partitions are numbered from 0")
        old = self._partitions
        self._partitions = {}
        for tp in wanted:
            kept = old.pop(tp, None)
            self._partitions[tp] = kept if kept is not None else self._new_partition()
        for state in old.values():
            self._cancel_fetch(state)
        self._topic = None

    def assignment(self) -> list[TopicPartition]:
        return list(self._partitions)

    def _new_partition(self) -> _Partition:
        return _Partition(None, _Reset(self._auto_offset_reset))

    async def _maybe_assign_topic(self) -> None:
        if self._topic is None:
            return
        response = await self._transport.request("GET", topic_path(self._topic))
        description = parse_description(response.json())
        self.assign((description.name, p.partition) for p in description.partitions)

    # ------------------------------------------------------------------ positions

    def seek(self, topic: str, partition: int, offset: SeekTo) -> None:
        """Make `offset` (or the partition's "earliest"/"latest") the next record polled."""
        state = self._state(TopicPartition(topic, partition))
        self._cancel_fetch(state)
        state.buffer.clear()
        if offset == "earliest" or offset == "latest":
            state.fetch_offset, state.reset = None, _Reset(offset)
        elif isinstance(offset, int) and not isinstance(offset, bool) and offset >= 0:
            state.fetch_offset, state.reset = offset, None
        else:
            raise ValueError(f'offset must be an int >= 0, "earliest" or "latest", not {offset!r}')

    def seek_to_timestamp(self, topic: str, partition: int, timestamp_ms: int) -> None:
        """Next poll starts at the first record with a timestamp at or after timestamp_ms
        (at the end of the partition if there is none)."""
        state = self._state(TopicPartition(topic, partition))
        self._cancel_fetch(state)
        state.buffer.clear()
        state.fetch_offset, state.reset = None, _Reset("timestamp", int(timestamp_ms))

    async def position(self, tp: tuple[str, int]) -> int:
        """The offset of the next record `poll` returns for tp."""
        key = TopicPartition(*tp)
        self._check_open()
        await self._maybe_assign_topic()
        state = self._state(key)
        if state.reset is not None:
            await self._resolve(key, state)
        if state.buffer:
            return state.buffer[0].offset
        if state.fetch_offset is None:  # a seek came in while we resolved
            return await self.position(tp)
        return state.fetch_offset

    def _state(self, tp: TopicPartition) -> _Partition:
        self._check_open()
        state = self._partitions.get(tp)
        if state is None and self._topic is not None:
            raise ValueError(
                f"the partitions of topic {self._topic!r} are looked up by the "
                "first poll() or position(); call assign() to seek before"
            )
        if state is None:
            raise ValueError(f"{tp.topic}-{tp.partition} is not assigned to this consumer")
        return state

    async def _resolve_resets(self) -> None:
        pending = [(tp, s) for tp, s in self._partitions.items() if s.reset is not None]
        if pending:
            await asyncio.gather(*(self._resolve(tp, s) for tp, s in pending))

    async def _resolve(self, tp: TopicPartition, state: _Partition) -> None:
        reset = state.reset
        if reset is None:
            return  # resolved meanwhile by a concurrent poll or position
        if reset.to == "none":
            raise _no_position(tp)
        params = {} if reset.timestamp_ms is None else {"timestamp": str(reset.timestamp_ms)}
        response = await self._transport.request(
            "GET", f"{topic_path(tp.topic)}/partitions/{tp.partition}/offsets", params=params
        )
        offsets = parse_offsets(response.json(), tp.topic)
        if state.reset is not reset:
            return  # a seek replaced it while we waited
        if reset.to == "earliest":
            state.fetch_offset = offsets.log_start_offset
        elif reset.to == "latest" or offsets.offset is None:
            state.fetch_offset = offsets.high_watermark
        else:
            state.fetch_offset = offsets.offset
        state.reset = None

    # ------------------------------------------------------------------ poll

    async def poll(
        self,
        timeout_ms: int = _limits.POLL_TIMEOUT_MS_DEFAULT,
        max_records: int = _limits.POLL_RECORDS_DEFAULT,
    ) -> list[ConsumerRecord]:
        """Up to max_records records, waiting up to timeout_ms for the first one.

        Returns an empty list when nothing arrived in time. Raises the broker's error
        for a partition (e.g. TopicNotFound) after retrying retriable ones.
        """
        if timeout_ms < 0 or max_records < 1:
            raise ValueError("need timeout_ms >= 0 and max_records >= 1")
        self._check_open()
        await self._maybe_assign_topic()
        if not self._partitions:
            raise RuntimeError("no partitions assigned: call assign() or pass topic=")
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_ms / 1000
        while True:
            self._collect()  # may turn a 416 into a reset, resolved next
            await self._resolve_resets()
            records = self._drain(max_records)
            if records:
                return records
            remaining_s = deadline - loop.time()
            self._start_fetches(min(max(0, int(remaining_s * 1000)), _limits.FETCH_WAIT_MS_MAX))
            fetches = [s.fetch for s in self._partitions.values() if s.fetch is not None]
            if remaining_s <= 0 or not fetches:
                return []  # the fetches just started keep going for the next poll
            await asyncio.wait(fetches, timeout=remaining_s, return_when=asyncio.FIRST_COMPLETED)

    def _start_fetches(self, wait_ms: int) -> None:
        for tp, state in self._partitions.items():
            if state.fetch is None and not state.buffer and state.fetch_offset is not None:
                state.fetch = asyncio.get_running_loop().create_task(
                    self._fetch(tp, state.fetch_offset, wait_ms)
                )

    async def _fetch(self, tp: TopicPartition, offset: int, wait_ms: int) -> _Fetched:
        while True:
            wait_ms = min(wait_ms, self._fetch_wait_ms_max)
            params = {
                "offset": str(offset),
                "max_bytes": str(self._fetch_bytes_max),
                "wait_ms": str(wait_ms),
                "format": "binary",
                "isolation": self._isolation,
            }
            try:
                response = await self._transport.request(
                    "GET",
                    f"{topic_path(tp.topic)}/partitions/{tp.partition}/records",
                    params=params,
                    accept=BATCHES,
                    wait_ms=wait_ms,
                )
                break
            except InvalidRequest as error:
                if not self._maybe_lower_fetch_limits(error):
                    raise
            except TopicNotFound as error:
                # Which topic: a group consumer drops a deleted topic's partitions (_group.py).
                error.details.setdefault("topic", tp.topic)
                raise
        content_type = (header(response.headers, "Content-Type") or "").split(";")[0].strip()
        if content_type and content_type != BATCHES:
            raise DmqError(f"asked for {BATCHES}, the broker answered {content_type}")
        aborted_text = header(response.headers, "X-Dmq-Aborted-Transactions")
        aborted = (
            None
            if aborted_text is None
            else [(int(p), int(f), int(m)) for p, f, m in json.loads(aborted_text)]
        )
        records, end = decode_fetched(response.body, tp.topic, tp.partition, offset, aborted)
        next_offset = response.header_int("X-Dmq-Next-Offset")
        return _Fetched(offset, records, max(offset, end if next_offset is None else next_offset))

    def _maybe_lower_fetch_limits(self, error: InvalidRequest) -> bool:
        """Adopt a broker's lower wait_ms or max_bytes bound (it refuses, with the bound
        in `limit`, what exceeds its fetch_wait_ms_max or fetch_bytes_max); returns
        whether a limit came down, so that the fetch is worth repeating."""
        limit = error.limit
        if not isinstance(limit, int) or limit < 1:
            return False
        if error.field == "wait_ms" and limit < self._fetch_wait_ms_max:
            self._fetch_wait_ms_max = limit
            return True
        if error.field == "max_bytes" and limit < self._fetch_bytes_max:
            self._fetch_bytes_max = limit
            return True
        return False

    def _collect(self) -> None:
        """Move finished fetches into the buffers; raise the first error, if any."""
        first_error: BaseException | None = None
        for state in self._partitions.values():
            task = state.fetch
            if task is None or not task.done():
                continue
            state.fetch = None
            if task.cancelled():
                continue
            error = task.exception()
            if isinstance(error, OffsetOutOfRange) and self._auto_offset_reset != "none":
                state.fetch_offset, state.reset = None, _Reset(self._auto_offset_reset)
            elif error is not None:
                first_error = first_error or error
            else:
                fetched = task.result()
                if fetched.offset == state.fetch_offset:  # else a seek made it stale
                    state.buffer.extend(fetched.records)
                    state.fetch_offset = fetched.next_offset
        if first_error is not None:
            raise first_error

    def _drain(self, max_records: int) -> list[ConsumerRecord]:
        out: list[ConsumerRecord] = []
        states = list(self._partitions.values())
        for i in range(len(states)):
            buffer = states[(self._drain_start + i) % len(states)].buffer
            while buffer and len(out) < max_records:
                out.append(buffer.popleft())
            if len(out) >= max_records:
                break
        if states:
            self._drain_start = (self._drain_start + 1) % len(states)
        return out

    # ------------------------------------------------------------------ lifecycle

    def _cancel_fetch(self, state: _Partition) -> None:
        if state.fetch is not None:
            state.fetch.cancel()
            state.fetch = None

    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError("the consumer is closed")

    async def close(self) -> None:
        """Stop every fetch and release the connection pool. Idempotent."""
        if self._closed:
            return
        self._closed = True
        tasks = [s.fetch for s in self._partitions.values() if s.fetch is not None]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await self._transport.close()


def _no_position(tp: TopicPartition) -> InvalidRequest:
    return InvalidRequest(
        f"{tp.topic}-{tp.partition} has no position: seek() it first (auto_offset_reset is 'none')",
        field="position",
    )
