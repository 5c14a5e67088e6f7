"""Segment data handed to the disk as it is written, on a thread of its own (#22).

A segment's `.log` is fdatasync'ed when it is sealed (`PartitionLog.roll`). The kernel
starts writing dirty pages back on its own only past `vm.dirty_background_ratio` of memory
(10 %: 2.4 GB on the 24 GiB test machine), so all of a 256 MiB segment was still dirty at
the seal, and its fdatasync took 110-250 ms on the Raft tick thread, which applies every
group of the node: every partition there stalled that long, once per segment filled.

`Writeback.kick(fd, offset, nbytes)` asks for the write-back of a range to start without
waiting for it (Linux `sync_file_range(SYNC_FILE_RANGE_WRITE)`). The call itself waits when
the disk's queue is full (16-30 ms measured), so it runs on the Writeback's own thread;
`PartitionLog` kicks each WRITEBACK_BYTES its active segment receives, and the seal's
fdatasync then finds at most about that much dirty (4-6 ms for 256 MiB written in 1 MiB
appends, against 110-123 ms; `python -m bench.writeback_bench`).

A kick only starts I/O of pages already written: it changes no data and no durability
promise. It may reach the thread after the segment's file was closed (EBADF, ignored) or
its descriptor reused for another file (that file's write-back starts early: harmless).
Kicks wait in a queue of at most QUEUE_MAX; past that they are dropped (the seal's
fdatasync then writes what they would have). Elsewhere than Linux nothing is kicked.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import queue
import sys
import threading
from collections.abc import Callable

from log.limits import MiB

logger = logging.getLogger(__name__)

WRITEBACK_BYTES = 8 * MiB
PAGE_BYTES = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096
QUEUE_MAX = 1024
SYNC_FILE_RANGE_WRITE = 2  # <fcntl.h>

Kick = Callable[[int, int, int], None]


def _sync_file_range() -> Callable[[int, int, int, int], int] | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        function = ctypes.CDLL(None, use_errno=True).sync_file_range
    except (OSError, AttributeError):
        return None
    function.argtypes = [ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_uint]
    function.restype = ctypes.c_int
    return function


class Writeback:
    """One thread that starts the write-back of the ranges it is given, in order."""

    def __init__(self) -> None:
        self._start = _sync_file_range()
        self._queue: queue.Queue[tuple[int, int, int] | None] = queue.Queue(QUEUE_MAX)
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self.kicked_bytes = 0  # ranges handed to the kernel (a metric, and for tests)
        self.dropped = 0  # kicks dropped with the queue full

    @property
    def available(self) -> bool:
        return self._start is not None

    def kick(self, fd: int, offset: int, nbytes: int) -> None:
        """Start the write-back of [offset, offset + nbytes) of `fd`, soon, elsewhere."""
        if self._start is None:
            return
        if self._thread is None:
            with self._lock:
                if self._thread is None:
                    self._thread = threading.Thread(
                        target=self._run, name="dmq-writeback", daemon=True
                    )
                    self._thread.start()
        try:
            self._queue.put_nowait((fd, offset, nbytes))
        except queue.Full:
            self.dropped += 1

    def _run(self) -> None:
        start = self._start
        assert start is not None
        while (item := self._queue.get()) is not None:
            fd, offset, nbytes = item
            if start(fd, offset, nbytes, SYNC_FILE_RANGE_WRITE) == 0:
                self.kicked_bytes += nbytes
            else:
                logger.debug("sync_file_range(%d) failed: errno %d", fd, ctypes.get_errno())

    def close(self) -> None:
        """Stop the thread once the kicks queued before are done."""
        thread = self._thread
        if thread is not None:
            with contextlib.suppress(queue.Full):
                self._queue.put(None, timeout=5)
            thread.join(timeout=5)
