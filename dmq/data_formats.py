"""Before a broker opens anything: refuse a data directory holding a format newer than this
release reads, with every byte of it unchanged (README.md, "Releases and upgrading").

Each reader refuses a newer format on its own too (raft/journal.py, raft/snapshot.py,
log/records.py, dmq/meta_file.py, dmq/partition/machine.py), but by the time the last of
them opens, the first have written (journal recovery, checkpoints): `check_data_dir` reads
only the version field of every versioned file first, so a refused start changes nothing.
What it reads, by file (each format is described where it is written):

| file                                   | where the version is                        |
|----------------------------------------|---------------------------------------------|
| meta.properties                        | its `version=` line                         |
| raft/groups/*/journal, journal.spare   | header u32 at byte 8 (after b"DMQRJNL1")    |
| raft/groups/*/snapshot                 | the magic's last byte, b"DMQRSNP<digit>"    |
| partitions/*/*.log (segments)          | the first batch's magic (byte 12)           |
| partitions/*/raft-producers            | its JSON head's `format` (absent: 1)        |
| partitions/*/remote-manifest           | its JSON's `format` (absent: 1)             |

A segment is checked by its first batch only: a release that changes the batch format
rolls every active segment before writing one (log/README.md), so the first batch of a
segment names the format of all of them. Files 0.1.0 wrote without a version
(raft-applied, journal.meta, the delay store's buckets, the checkpoints of log/) are not
checked: a release that changes one must give it a new name.

Cost: two small reads per Raft group and per segment, at start only.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Iterator
from pathlib import Path
from typing import Final

import crc32c

from dmq import meta_file
from dmq.compat import too_new_message
from dmq.errors import FormatTooNew
from dmq.partition.machine import (
    PRODUCER_STATE,
    PRODUCER_STATE_FORMAT,
    REMOTE_MANIFEST,
    REMOTE_MANIFEST_FORMAT,
)
from log import records
from raft import journal, snapshot

# The JSON head of raft-producers and the remote manifest are read only this far.
JSON_HEAD_BYTES_MAX: Final = 1 << 20
_U32: Final = struct.Struct("<I")


def check_data_dir(data_dir: Path) -> None:
    """FormatTooNew naming the first file found in a newer format than this release reads;
    reads only, never writes (module docstring)."""
    for what, found, readable_max in _versions(data_dir):
        if found > readable_max:
            raise FormatTooNew(too_new_message(what, found, readable_max))


def _versions(data_dir: Path) -> Iterator[tuple[str, int, int]]:
    """(what, format found, highest format readable) of every versioned file."""
    meta = data_dir / meta_file.META_FILE
    if meta.is_file():
        found = meta_file.written_version(meta.read_bytes()[: meta_file.META_FILE_BYTES_MAX])
        if found is not None:
            yield str(meta), found, meta_file.FORMAT_VERSION
    for group in sorted((data_dir / "raft" / "groups").glob("*")):
        for name in (journal.JOURNAL_FILE, journal.SPARE_FILE):
            head = _head(group / name, journal.HEADER_BYTES)
            if len(head) == journal.HEADER_BYTES and head.startswith(journal.MAGIC):
                found = _U32.unpack_from(head, len(journal.MAGIC))[0]
                yield f"{group / name}: Raft journal", found, journal.FORMAT_VERSION
        found_snapshot = snapshot.snapshot_format(_head(group / snapshot.SNAPSHOT_FILE, 8))
        if found_snapshot is not None:
            where = f"{group / snapshot.SNAPSHOT_FILE}: Raft snapshot"
            yield where, found_snapshot, snapshot.SNAPSHOT_FORMAT
    for partition in sorted((data_dir / "partitions").glob("*")):
        yield from _partition_versions(partition)


def _partition_versions(partition: Path) -> Iterator[tuple[str, int, int]]:
    magic_at = 12  # after base_offset (i64) and batch_length (i32): log/records.py
    for segment in sorted(partition.glob("*.log")):
        head = _head(segment, magic_at + 1)
        if len(head) == magic_at + 1:
            yield f"{segment}: segment batch", head[magic_at], records.MAGIC
    producers = _json_head(partition / PRODUCER_STATE, skip=4, line=True)
    if producers is not None:
        where = f"{partition / PRODUCER_STATE}: producer and transaction state"
        yield where, producers, PRODUCER_STATE_FORMAT
    manifest = _json_head(partition / REMOTE_MANIFEST, skip=4, line=False)
    if manifest is not None:
        where = f"{partition / REMOTE_MANIFEST}: tiered-storage manifest"
        yield where, manifest, REMOTE_MANIFEST_FORMAT


def _head(path: Path, size: int) -> bytes:
    try:
        with open(path, "rb") as file:
            return file.read(size)
    except (FileNotFoundError, IsADirectoryError):
        return b""


def _json_head(path: Path, *, skip: int, line: bool) -> int | None:
    """The `format` of a CRC-prefixed JSON file (1 when absent); None when the file is
    missing or not ours to judge here (a torn or corrupt file is its reader's to refuse)."""
    raw = _head(path, skip + JSON_HEAD_BYTES_MAX)
    if len(raw) < skip:
        return None
    body = raw[skip:]
    if not line and crc32c.crc32c(body) != _U32.unpack_from(raw)[0]:
        return None
    try:
        doc = json.loads(body.partition(b"\n")[0] if line else body)
    except (UnicodeDecodeError, json.JSONDecodeError):
        return None
    found = doc.get("format", 1) if isinstance(doc, dict) else None
    return found if isinstance(found, int) else None
