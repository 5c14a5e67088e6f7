"""Proves the early write-back of segments (log/writeback.py):

- a PartitionLog given a kick function hands it, for any sequence of appends and segment
  rolls, consecutive ranges of its active segment, each of at least WRITEBACK_BYTES and
  of whole pages (the next append would wait for a page under write-back), none past what
  was written, so that about WRITEBACK_BYTES of a segment are left unkicked; a log that flushes every append kicks nothing (its data is durable already);
- `Writeback` runs the kicks on its own thread: a range of a real file is handed to the
  kernel (counted once the thread is closed), a kick for a closed descriptor is ignored,
  and a kick made before any thread exists starts one.

That the seal's fdatasync then has little left to write is a benchmark's figure
(`python -m bench.writeback_bench`), not asserted here.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from log import FlushPolicy, LogConfig, PartitionLog, Record, encode_batch
from log import partition_log as partition_log_module
from log.writeback import PAGE_BYTES, Writeback

KICK_BYTES = 4096


def batch(value_bytes: int) -> bytes:
    return encode_batch([Record(b"k", b"v" * value_bytes, (), 1000)])


@settings(max_examples=40, deadline=None)
@given(
    sizes=st.lists(st.integers(1, 3000), min_size=1, max_size=60),
    segment_bytes=st.integers(2000, 20_000),
)
def test_kicks_cover_each_segment_in_order_leaving_at_most_one_range_dirty(
    tmp_path_factory: pytest.TempPathFactory, sizes: list[int], segment_bytes: int
) -> None:
    directory = tmp_path_factory.mktemp("log")
    saved = partition_log_module.WRITEBACK_BYTES
    partition_log_module.WRITEBACK_BYTES = KICK_BYTES
    try:
        log = PartitionLog.open(
            directory,
            LogConfig(segment_bytes=segment_bytes, flush=FlushPolicy(interval_records=None)),
        )
        kicks: list[tuple[int, int, int]] = []
        log.writeback = lambda fd, offset, nbytes: kicks.append((fd, offset, nbytes))
        for size in sizes:
            log.append(batch(size))
        by_fd: dict[int, list[tuple[int, int]]] = {}
        for fd, offset, nbytes in kicks:
            by_fd.setdefault(fd, []).append((offset, nbytes))
        active = log.segments[-1]
        assert active.fd in by_fd or active.size_bytes < KICK_BYTES
        for ranges in by_fd.values():
            assert ranges[0][0] == 0  # from the start of the segment, in order, no gaps
            for (offset, nbytes), (next_offset, _) in zip(ranges, ranges[1:], strict=False):
                assert next_offset == offset + nbytes
            assert all(nbytes >= KICK_BYTES for _, nbytes in ranges)
            assert all((offset + nbytes) % PAGE_BYTES == 0 for offset, nbytes in ranges)
        kicked = sum(n for _, n in by_fd.get(active.fd, []))
        assert kicked <= active.size_bytes < kicked + KICK_BYTES + PAGE_BYTES + max(sizes) + 200
        log.close()
    finally:
        partition_log_module.WRITEBACK_BYTES = saved


def test_a_log_that_flushes_every_append_kicks_nothing(tmp_path: Path) -> None:
    log = PartitionLog.open(tmp_path, LogConfig(flush=FlushPolicy(interval_records=1)))
    kicks: list[tuple[int, int, int]] = []
    log.writeback = lambda fd, offset, nbytes: kicks.append((fd, offset, nbytes))
    for _ in range(20):
        log.append(batch(10_000))
    assert kicks == []
    log.close()


def test_writeback_thread_hands_ranges_to_the_kernel(tmp_path: Path) -> None:
    writeback = Writeback()
    if not writeback.available:
        pytest.skip("no sync_file_range here (not Linux)")
    fd = os.open(tmp_path / "data", os.O_RDWR | os.O_CREAT, 0o644)
    os.write(fd, os.urandom(1 << 20))
    writeback.kick(fd, 0, 1 << 20)
    closed_fd = os.open(tmp_path / "other", os.O_RDWR | os.O_CREAT, 0o644)
    os.close(closed_fd)
    writeback.kick(closed_fd, 0, 4096)  # EBADF on the thread: ignored
    writeback.kick(fd, 1 << 20, 0)
    writeback.close()
    os.close(fd)
    assert writeback.kicked_bytes == 1 << 20
