"""What the log does when the disk fails, and at the edges of its offset space.

Proves: after a failed fsync the log refuses every further append and flush (a later
fsync that succeeds proves nothing about the lost writes), and a reopen recovers what
is on disk; a failed fsync while sealing a segment fails the log the same way; a
batch whose offsets lie beyond a u32 relative offset of an empty segment replaces it
instead of breaking the next roll. The disk failure is injected by replacing
os.fdatasync, the one thing that cannot be made to fail for real here.
"""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest

from log import FlushPolicy, LogConfig, PartitionLog, Record, StorageError, encode_batch
from log import segment as segment_module

REAL_FDATASYNC = os.fdatasync


def batch(n: int = 3, base_offset: int = 0) -> bytes:
    return encode_batch(
        [Record(b"k", b"v" * 10, (), 1000 + i) for i in range(n)], base_offset=base_offset
    )


def test_failed_fsync_fails_the_log_until_reopened(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    log = PartitionLog.open(tmp_path, LogConfig(flush=FlushPolicy(interval_records=1)))
    log.append(batch())

    def broken_fdatasync(fd: int) -> None:
        raise OSError(errno.EIO, "injected I/O error")

    monkeypatch.setattr(segment_module.os, "fdatasync", broken_fdatasync)
    with pytest.raises(StorageError, match="fsync"):
        log.append(batch())
    monkeypatch.setattr(segment_module.os, "fdatasync", REAL_FDATASYNC)
    with pytest.raises(StorageError, match="refuses writes"):
        log.append(batch())
    with pytest.raises(StorageError, match="refuses to flush"):
        log.flush()
    log.close()  # closing a failed log does not pretend to flush
    reopened = PartitionLog.open(tmp_path, LogConfig())
    # Both batches reached the page cache before the failure; recovery keeps what is there.
    assert reopened.log_end_offset == 6
    reopened.append(batch())
    assert reopened.log_end_offset == 9
    reopened.close()


def test_failed_fsync_while_sealing_a_segment_fails_the_log(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    log = PartitionLog.open(tmp_path, LogConfig(flush=FlushPolicy(interval_records=None)))
    log.append(batch())

    def broken_fdatasync(fd: int) -> None:
        raise OSError(errno.EIO, "injected I/O error")

    monkeypatch.setattr(segment_module.os, "fdatasync", broken_fdatasync)
    with pytest.raises(StorageError, match="sealing"):
        log.roll()
    monkeypatch.setattr(segment_module.os, "fdatasync", REAL_FDATASYNC)
    with pytest.raises(StorageError):
        log.append(batch())
    log.close()


def test_far_offsets_on_an_empty_segment_replace_it(tmp_path: Path) -> None:
    log = PartitionLog.open(tmp_path, LogConfig())
    far = 2**33
    log.append(batch(base_offset=far), assign_offsets=False)
    assert [s.base_offset for s in log.segments] == [far]
    log.roll()  # would fail packing a relative offset over 2**32 if the segment stayed at 0
    log.append(batch())
    log.set_high_watermark(log.log_end_offset)
    assert [r.offset for r in log.read_records(far, 1 << 20)] == [far + i for i in range(6)]
    log.close()
