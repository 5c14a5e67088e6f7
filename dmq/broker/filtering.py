"""The filtered fetch: `tags=` / `filter=` applied on the partition leader, before encoding.

fetch.py hands a fetch with a RecordFilter here once it has checked the offset. The
loop (bounded in CPU and in time):

1. scan forward on the storage thread (dmq/partition/filtered_read.py) until records
   are kept, the high watermark is reached, or the fetch's scan budget
   (`filter_scan_bytes_max`, for the whole request) is spent;
2. kept records, a spent budget or a closing replica answer at once; `next_offset` is
   where the scan stopped, so the skipped records are never read again by this consumer;
3. at the high watermark with nothing kept, park on the replica's "committed advanced"
   event (as an unfiltered long-poll does: it counts in `waiting_fetches_max`) until
   `wait_ms` runs out, then scan only what was committed meanwhile. A long run of
   records that do not match therefore neither ends the long-poll early nor spins.

A binary filtered fetch answers the kept records re-encoded as one batch (`encode_kept`)
with the same X-Dmq-* headers: spark_io pushes its `tags`/`filter` options down this way.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from contextlib import AbstractContextManager

from dmq.broker.types import FetchResult
from dmq.partition.filtered_read import FilteredRead, read_matching
from dmq.partition.replica import PartitionReplica
from dmq.selector import RecordFilter
from log.records import Record, encode_batch


def encode_kept(records: list[Record]) -> bytes:
    """The kept records as one uncompressed RecordBatch with their own offsets (gaps where
    records were dropped, as compaction leaves them): the binary answer of a filtered
    fetch, which a binary consumer decodes like any other (b"" when none were kept)."""
    if not records:
        return b""
    base = records[0].offset
    return encode_batch(records, base_offset=base, offset_deltas=[r.offset - base for r in records])


async def fetch_filtered(
    replica: PartitionReplica,
    offset: int,
    record_filter: RecordFilter,
    *,
    max_bytes: int,
    max_records: int,
    wait_ms: int,
    scan_bytes_max: int,
    parked: Callable[[], AbstractContextManager[None]],
    stable: bool = False,
) -> FetchResult:
    """Kept records from `offset` (module docstring); `parked()` counts a parked wait.
    `stable` (read_committed): the scan ends at the last stable offset and leaves out the
    records of aborted transactions. Their ranges are read before the scan: every
    transaction below the LSO read first is decided, and its abort recorded, by then."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + wait_ms / 1000
    position = offset
    scanned = 0

    def readable_end() -> int:
        return replica.last_stable_offset if stable else replica.high_watermark

    while True:
        end = readable_end()
        aborted = await replica.aborted_between(position, end) if stable else []
        read: FilteredRead = await replica.read_with(
            read_matching,
            position,
            record_filter.matches,
            max_bytes=max_bytes,
            max_records=max_records,
            scan_bytes_max=max(1, scan_bytes_max - scanned),
            end_offset=end,
            aborted=aborted,
        )
        scanned += read.scanned_bytes
        # Below the end yet no step forward: nothing readable lies ahead.
        stuck = not read.records and position == read.next_offset < min(end, read.high_watermark)
        position = read.next_offset
        done = bool(read.records) or scanned >= scan_bytes_max or replica.closed or stuck
        if not done and position < readable_end():
            continue  # committed meanwhile: scan on (the budget still bounds it)
        remaining_s = deadline - loop.time()
        if done or remaining_s <= 0:
            return FetchResult(
                replica.topic,
                replica.partition,
                offset,
                position,
                read.high_watermark,
                read.log_start_offset,
                records=read.records,
                last_stable_offset=replica.last_stable_offset,
            )
        with parked():
            await replica.wait_for_commit_past(position, remaining_s, stable=stable)
