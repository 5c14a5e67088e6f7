"""Reading one offset range in a Spark task: binary fetches into Arrow record batches.

1. Fetch from the next offset (`format=binary`, up to fetchMaxBytes, no long-poll: the
   range ends at or below a high watermark the driver saw, so its records exist).
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
from collections.abc import Iterator

import pyarrow as pa

from dmq.errors import OffsetOutOfRange
from spark_io._arrow import Columns, decode_into
from spark_io._brokers import Brokers
from spark_io._plan import OffsetRange

log = logging.getLogger("spark_io")


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
) -> Iterator[pa.RecordBatch]:
    """Steps 1-3 for one task: the records of task.topic/partition in [start, end)."""
    offset = task.start
    with Brokers(urls) as brokers:
        while offset < task.end:
            try:
                fetched = brokers.fetch(task.topic, task.partition, offset, fetch_bytes)
            except OffsetOutOfRange as error:
                offset = _after_loss(task, offset, error, fail_on_data_loss)
                continue
            columns = Columns(task.topic, task.partition, include_headers)
            after = decode_into(columns, fetched.body, offset, task.end)
            if fetched.next_offset is not None:
                after = max(after, fetched.next_offset)
            if after <= offset:
                data_loss(
                    f"{task.topic}/{task.partition}: no records from offset {offset} to "
                    f"{task.end} (high watermark {fetched.high_watermark})",
                    fail_on_data_loss,
                )
                return
            if len(columns):
                yield columns.to_record_batch(schema)
            offset = after


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
