"""The `disk-full` nemesis's filesystems: each broker's data directory on a tmpfs of its own.

With `disk-full` in the nemesis list, `mount_all` puts every broker's data directory on a
tmpfs of DISK_MIB (root only: mount(8)), before the brokers start. A strike fills a
target's tmpfs with a file until FILL_LEAVE_BYTES are left, below the brokers' default
floor (5% of the filesystem, dmq/README.md "A full disk"): the broker refuses produce
(507), stops acknowledging as a follower and hands its leaderships away, and keeps
serving reads; the heal deletes the file and the broker resumes on its own. `unmount_all`
(the nemesis's close, also after a failure) unmounts them.

A run with this nemesis must stay valid: no acknowledged record lost, no stale read.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
from pathlib import Path

from jepsen.cluster import Broker, HarnessError

DISK_MIB = 64  # per broker: a few minutes of the workload fit many times over
FILL_LEAVE_BYTES = 512 * 1024  # below the default floor of 5% (3.2 MiB of 64 MiB)
FILLER = "disk-full-filler"  # the file a strike writes next to the data directory
_CHUNK = b"\0" * (1024 * 1024)


def mount_all(brokers: list[Broker]) -> list[Path]:
    """A tmpfs on each broker's data directory (empty: before the broker's first start)."""
    mounted: list[Path] = []
    for broker in brokers:
        broker.data_dir.mkdir(parents=True, exist_ok=True)
        done = subprocess.run(
            ["mount", "-t", "tmpfs", "-o", f"size={DISK_MIB}m", "tmpfs", str(broker.data_dir)],
            capture_output=True,
            text=True,
            check=False,
        )
        if done.returncode != 0:
            unmount_all(mounted)
            raise HarnessError(f"disk-full needs root to mount a tmpfs: {done.stderr.strip()}")
        mounted.append(broker.data_dir)
    return mounted


def unmount_all(mounted: list[Path]) -> None:
    for path in mounted:
        subprocess.run(["umount", "-l", str(path)], capture_output=True, check=False)
    mounted.clear()


def fill(broker: Broker) -> int:
    """Fill the broker's filesystem until FILL_LEAVE_BYTES are left; the bytes written."""
    path = broker.data_dir / FILLER
    written = 0
    with open(path, "ab") as f:
        while True:
            st = os.statvfs(broker.data_dir)
            free = st.f_bavail * st.f_frsize
            if free <= FILL_LEAVE_BYTES:
                return written
            try:
                written += f.write(_CHUNK[: max(4096, min(len(_CHUNK), free - FILL_LEAVE_BYTES))])
                f.flush()
            except OSError:  # the broker wrote meanwhile: full enough
                return written


def free(broker: Broker) -> None:
    """The heal: the filler goes (the broker resumes on its own)."""
    with contextlib.suppress(FileNotFoundError):
        (broker.data_dir / FILLER).unlink()
