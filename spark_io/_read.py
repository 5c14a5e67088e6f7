"""Reading one offset range in a Spark task: binary fetches into Arrow record batches.

1. Fetch from the next offset (`format=binary`, up to fetchMaxBytes, no long-poll: the
   range ends at or below a high watermark the driver saw, so its records exist), in a
   thread that keeps PREFETCH_ANSWERS answers ahead of the decoder.
2. Decode the answer into Arrow columns (spark_io/_arrow.py) and yield one RecordBatch per
   answer; the next offset is the answer's X-Dmq-Next-Offset (which steps over offsets
   compaction removed).
3. A 416 (the offset is below log_start_offset: retention removed records before they
   were read) is data loss: with failOnDataLoss it fails the task with DataLossError;
   otherwise the task logs a warning and goes on from log_start_offset. An answer that
   makes no progress below the range's end (the records are gone, e.g. the topic was
   deleted and made again) is data loss too.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Iterator
from typing import TypeVar

import pyarrow as pa

from dmq.errors import OffsetOutOfRange, StorageError
from spark_io._arrow import Columns, decode_into
from spark_io._brokers import Brokers
from spark_io._plan import OffsetRange

log = logging.getLogger("spark_io")
T = TypeVar("T")
# Fetch answers held ahead of the decoder per task: each up to fetchMaxBytes (8 MiB).
PREFETCH_ANSWERS = 1


class DataLossError(RuntimeError):
    """Records a query should have read are gone (failOnDataLoss=true)."""


def data_loss(message: str, fail: bool) -> None:
    """Raise DataLossError, or log a warning, as failOnDataLoss says."""
    if fail:
        raise DataLossError(
            f"{message}. Some data may have been lost because it is no longer available in "
            "dmq (retention removed it before it was read). If you want the query to go on "
            'regardless, set the option failOnDataLoss to "false".'
        )
    log.warning("%s; skipping them (failOnDataLoss=false)", message)


def read_range(
    urls: tuple[str, ...],
    task: OffsetRange,
    schema: pa.Schema,
    *,
    fetch_bytes: int,
    include_headers: bool,
    fail_on_data_loss: bool,
    record_filter: tuple[tuple[str, str], ...] = (),
    isolation: str = "read_uncommitted",
) -> Iterator[pa.RecordBatch]:
    """Steps 1-3 for one task: the records of task.topic/partition in [start, end).
    Fetches run one answer ahead in a thread (`_prefetched`), so that the broker's work
    and the network overlap the decoding of the previous answer."""
    fetches = _fetches(urls, task, fetch_bytes, fail_on_data_loss, record_filter, isolation)
    for offset, body, aborted in _prefetched(fetches):
        columns = Columns(task.topic, task.partition, include_headers)
        decode_into(columns, body, offset, task.end, aborted)
        if len(columns):
            yield columns.to_record_batch(schema)


def _fetches(
    urls: tuple[str, ...],
    task: OffsetRange,
    fetch_bytes: int,
    fail_on_data_loss: bool,
    record_filter: tuple[tuple[str, str], ...] = (),
    isolation: str = "read_uncommitted",
) -> Iterator[tuple[int, bytes, tuple[tuple[int, int, int], ...]]]:
    """Steps 1 and 3: (fetch offset, answer) in order until the end of the range; the
    next offset is the answer's X-Dmq-Next-Offset (every binary answer has it)."""
    offset = task.start
    with Brokers(urls) as brokers:
        while offset < task.end:
            try:
                fetched = brokers.fetch(
                    task.topic, task.partition, offset, fetch_bytes, record_filter, isolation
                )
            except OffsetOutOfRange as error:
                offset = _after_loss(task, offset, error, fail_on_data_loss)
                continue
            after = fetched.next_offset
            if after is None:
                raise StorageError("a binary fetch answer without X-Dmq-Next-Offset")
            if after <= offset:
                data_loss(
                    f"{task.topic}/{task.partition}: no records from offset {offset} to "
                    f"{task.end} (high watermark {fetched.high_watermark})",
                    fail_on_data_loss,
                )
                return
            yield offset, fetched.body, fetched.aborted
            offset = after


_DONE = object()


def _prefetched(items: Iterator[T], depth: int = PREFETCH_ANSWERS) -> Iterator[T]:
    """`items`, produced by a thread up to `depth` ahead; its exception is raised here.
    Closing this generator (Spark stops reading early) stops the thread."""
    slots: queue.Queue[object] = queue.Queue(maxsize=depth)
    stop = threading.Event()

    def put(item: object) -> bool:
        while not stop.is_set():
            try:
                slots.put(item, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def pump() -> None:
        try:
            for item in items:
                if not put(item):
                    return
            put(_DONE)
        except BaseException as error:  # handed to the reader, which raises it
            put(error)
        finally:
            close = getattr(items, "close", None)
            if close is not None:
                close()

    thread = threading.Thread(target=pump, name="dmq-prefetch", daemon=True)
    thread.start()
    try:
        while True:
            item = slots.get()
            if item is _DONE:
                return
            if isinstance(item, BaseException):
                raise item
            yield item  # type: ignore[misc]
    finally:
        stop.set()
        thread.join()


def _after_loss(task: OffsetRange, offset: int, error: OffsetOutOfRange, fail: bool) -> int:
    """Where to go on after a 416: log_start_offset, or raise (step 3)."""
    start = error.log_start_offset
    if start <= offset:  # past the end instead: the log was truncated or recreated
        data_loss(
            f"{task.topic}/{task.partition}: offset {offset} is past the log end "
            f"{error.log_end_offset}",
            fail,
        )
        return task.end
    if not task.from_earliest:
        data_loss(
            f"{task.topic}/{task.partition}: offsets {offset} to {min(start, task.end)} "
            f"were removed (log_start_offset is now {start})",
            fail,
        )
    return start
