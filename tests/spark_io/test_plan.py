"""The planning arithmetic and the data-loss decision of spark_io, without Spark or a broker.

Proves with hypothesis that `split` (minPartitions) covers every offset range exactly once
with at least minPartitions tasks when there are enough offsets, and that `_rate_limit`
(maxOffsetsPerTrigger) never moves a partition backwards or past its high watermark,
stays within the limit, uses all of it when there is that much to read, and moves every
partition with a backlog when the limit allows one offset each; and that a 416 under a
task raises DataLossError (failOnDataLoss=true) or logs a warning on the `spark_io` logger
and moves on to log_start_offset (false), except for a partition new since the query
started, which is read from its first record without complaint; and that the fetch
prefetcher keeps order, hands its thread's error to the reader and stops when closed.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator

import pytest
from hypothesis import given
from hypothesis import strategies as st

from dmq.errors import OffsetOutOfRange
from spark_io._plan import OffsetRange, split
from spark_io._read import DataLossError, _after_loss, _prefetched
from spark_io.source import _rate_limit

ranges = st.lists(
    st.tuples(st.integers(0, 10**6), st.integers(0, 5000)).map(lambda t: (t[0], t[0] + t[1])),
    min_size=1,
    max_size=8,
)


@given(bounds=ranges, min_partitions=st.none() | st.integers(1, 64))
def test_split_covers_every_range_exactly_once(
    bounds: list[tuple[int, int]], min_partitions: int | None
) -> None:
    tasks = split(
        [OffsetRange("t", p, lo, hi) for p, (lo, hi) in enumerate(bounds)], min_partitions
    )

    for p, (lo, hi) in enumerate(bounds):
        mine = sorted((t.start, t.end) for t in tasks if t.partition == p)
        covered = [o for start, end in mine for o in range(start, end)]
        assert covered == list(range(lo, hi))  # in order, no gap, no overlap
        assert all(end > start for start, end in mine)
    total = sum(hi - lo for lo, hi in bounds)
    if min_partitions is not None and total >= min_partitions:
        assert len(tasks) >= min_partitions


@given(
    spans=st.lists(
        st.tuples(st.integers(0, 10**9), st.integers(0, 10**6)), min_size=1, max_size=10
    ),
    max_rows=st.integers(1, 10**6),
)
def test_rate_limit_stays_between_start_and_end_within_the_limit(
    spans: list[tuple[int, int]], max_rows: int
) -> None:
    froms = [f for f, _ in spans]
    ends = [f + backlog for f, backlog in spans]

    limited = _rate_limit(froms, ends, max_rows)

    assert all(f <= x <= e for f, x, e in zip(froms, limited, ends, strict=True))
    moved = sum(x - f for f, x in zip(froms, limited, strict=True))
    backlog = sum(e - f for f, e in zip(froms, ends, strict=True))
    assert moved == min(max_rows, backlog)
    with_backlog = sum(1 for f, e in zip(froms, ends, strict=True) if e > f)
    if with_backlog <= max_rows:
        assert all(x > f for f, x, e in zip(froms, limited, ends, strict=True) if e > f)


def test_data_loss_raises_or_logs_a_warning_and_moves_to_log_start(
    caplog: pytest.LogCaptureFixture,
) -> None:
    task = OffsetRange("orders", 2, 10, 50)
    gone = OffsetOutOfRange("below", offset=10, log_start_offset=30, log_end_offset=60)

    with pytest.raises(DataLossError, match='failOnDataLoss to "false"'):
        _after_loss(task, 10, gone, fail=True)
    with caplog.at_level(logging.WARNING, logger="spark_io"):
        assert _after_loss(task, 10, gone, fail=False) == 30
    assert "orders/2: offsets 10 to 30 were removed" in caplog.text
    # A partition new since the query started is read from its first record: no loss.
    caplog.clear()
    new = OffsetRange("orders", 3, 0, 50, from_earliest=True)
    assert _after_loss(new, 0, gone, fail=True) == 30
    assert caplog.text == ""


def test_prefetched_keeps_order_raises_errors_and_stops_when_closed() -> None:
    def numbers(fail_at: int | None) -> Iterator[int]:
        for i in range(100):
            if i == fail_at:
                raise DataLossError(f"gone at {i}")
            yield i

    assert list(_prefetched(numbers(None))) == list(range(100))
    got: list[int] = []
    with pytest.raises(DataLossError, match="gone at 7"):
        got.extend(_prefetched(numbers(7)))
    assert got == list(range(7))

    reader = _prefetched(numbers(None))
    assert next(reader) == 0
    reader.close()  # as Spark does when it stops reading early (a limit)
    assert not any(t.name == "dmq-prefetch" for t in threading.enumerate())
