"""The free-space floor (log/space.py) and what a write the disk cuts short leaves behind.

Proves:
- the default floor is the smaller of 1 GiB and 5% of the filesystem, the levels are
  ordered (full below the floor, alert below the alert level), and SpaceGuard never
  admits, between two probes, more than the free space above the floor allows (its
  admitted bytes are charged twice: journal and segment);
- an append the kernel cuts short (a real short write: RLIMIT_FSIZE caps the file, as a
  full disk would, and the next write fails with EFBIG) raises StorageWriteError, leaves
  the segment cut back to the last good batch (nothing torn is read or recovered), and the
  log takes the same append once there is room, with no reopen (tests/raft/
  test_raft_journal_full.py proves the same of the Raft journal).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from log import LogConfig, PartitionLog, Record, encode_batch
from log.errors import StorageWriteError
from log.limits import GiB
from log.space import (
    WRITE_AMPLIFICATION,
    SpaceGuard,
    StorageFull,
    admits,
    default_floor_bytes,
    level_for,
)
from tests_support import file_size_cap


@given(st.integers(0, 2**50))
def test_default_floor_is_the_smaller_of_1_gib_and_5_percent(total: int) -> None:
    floor = default_floor_bytes(total)
    assert floor == min(GiB, int(total * 0.05))
    assert 0 <= floor <= GiB and floor <= total


@given(st.integers(0, 2**40), st.integers(0, 2**40), st.integers(0, 2**40))
def test_levels_are_ordered(free: int, floor: int, extra: int) -> None:
    alert = floor + extra
    level = level_for(free, floor, alert)
    assert (level == "full") == (free < floor)
    assert (level == "ok") == (free >= alert)


@given(
    free=st.integers(0, 10**9),
    floor=st.integers(0, 10**8),
    sizes=st.lists(st.integers(1, 10**7), max_size=30),
)
def test_guard_never_admits_past_the_floor_between_probes(
    free: int, floor: int, sizes: list[int]
) -> None:
    guard = SpaceGuard(
        Path("/nowhere"),
        floor_bytes=floor,
        probe_fn=lambda _path: (free, 10 * free + 1),
        clock_s=lambda: 0.0,  # one probe: every check after it is between probes
    )
    admitted = refused = 0
    for size in sizes:
        try:
            guard.check_append(size)
        except StorageFull as full:
            refused += 1
            assert full.floor_bytes == floor and full.size_bytes == size
            assert floor > 0 and not admits(free - WRITE_AMPLIFICATION * admitted, floor, size)
            continue
        admitted += size
    if floor > 0 and admitted:  # a floor of 0 is no floor: everything is tried
        assert free - WRITE_AMPLIFICATION * admitted >= floor
    if floor == 0:
        assert refused == 0
    assert guard.refused_appends == refused
    assert guard.refused_bytes == sum(sizes) - admitted


def batch(tag: int, n: int) -> bytes:
    return encode_batch([Record(b"k", b"%d-%d" % (tag, i) * 20, (), 1000 + i) for i in range(n)])


@settings(
    max_examples=25, deadline=None, database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)  # fmt: skip
@given(sizes=st.lists(st.integers(1, 40), min_size=1, max_size=6), cut=st.floats(0.0, 0.99))
def test_a_short_write_is_cut_back_to_the_last_good_batch(
    tmp_path_factory: pytest.TempPathFactory, sizes: list[int], cut: float
) -> None:
    directory = tmp_path_factory.mktemp("log")
    log = PartitionLog.open(directory, LogConfig())
    expected = []
    for tag, n in enumerate(sizes):
        log.append(batch(tag, n))
        expected += [b"%d-%d" % (tag, i) * 20 for i in range(n)]
    log.set_high_watermark(log.log_end_offset)
    before_bytes = log.active.size_bytes
    before_end = log.log_end_offset
    torn = batch(99, 30)
    cap = before_bytes + int(len(torn) * cut) + 1
    with file_size_cap(cap), pytest.raises(StorageWriteError) as refused:
        log.append(torn)
    assert refused.value.no_space
    assert os.path.getsize(log.active.log_path) == before_bytes  # nothing torn left
    assert log.log_end_offset == before_end
    assert [r.value for r in log.read_records(0, 1 << 30)] == expected
    log.append(torn)  # room again: the same log takes it, no reopen
    log.set_high_watermark(log.log_end_offset)
    expected += [b"99-%d" % i * 20 for i in range(30)]
    assert [r.value for r in log.read_records(0, 1 << 30)] == expected
    log.close()
    reopened = PartitionLog.open(directory, LogConfig())
    reopened.set_high_watermark(reopened.log_end_offset)
    assert reopened.recovered_bytes_truncated == 0
    assert [r.value for r in reopened.read_records(0, 1 << 30)] == expected
    reopened.close()
