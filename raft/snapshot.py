"""A group's snapshot file: pysyncobj's bookkeeping and the state machine's state, checked.

pysyncobj compacts its log by calling the `serializer(fileName, data)` of its SyncObjConf,
and installs a snapshot (its own at start-up, or one sent by the leader) through
`deserializer(fileName)`. Stock pysyncobj pickles the whole SyncObj; raft/ writes only
`data` (pysyncobj's bookkeeping: its members and log position) and the machine's own
`snapshot()` bytes, under a header that lets a torn or corrupt file be told apart:

    b"DMQRSNP1" | u32 crc32c(payload) | u64 len(payload) | payload
    payload = pickle((tuple(data), machine state))

raft/replica.py owns when these run (on the tick thread) and what a failure does.
"""

from __future__ import annotations

import os
import pickle
import struct
from typing import Any

import crc32c

from raft import safe_pickle
from raft.errors import RaftError, too_new

SNAPSHOT_FILE = "snapshot"
SNAPSHOT_FORMAT = 1  # the magic's last byte, as a digit: a newer one is refused as newer
SNAPSHOT_MAGIC_PREFIX = b"DMQRSNP"
_SNAPSHOT_MAGIC = SNAPSHOT_MAGIC_PREFIX + str(SNAPSHOT_FORMAT).encode()
_SNAPSHOT_HEADER = struct.Struct("<8sIQ")  # magic, crc32c(payload), payload length


def write_snapshot(path: str, data: Any, state: bytes, *, fsync: bool) -> None:
    """Write pysyncobj's bookkeeping `data` and the machine's `state` to `path`; fsync
    the file before returning if asked (durability="fsync")."""
    payload = pickle.dumps((tuple(data), state), pickle.HIGHEST_PROTOCOL)
    with open(path, "wb") as file:
        file.write(_SNAPSHOT_HEADER.pack(_SNAPSHOT_MAGIC, crc32c.crc32c(payload), len(payload)))
        file.write(payload)
        file.flush()
        if fsync:
            os.fsync(file.fileno())


def read_snapshot(path: str) -> tuple[tuple[Any, ...], Any]:
    """(pysyncobj's bookkeeping, the machine's state) from `path`; RaftError if the file
    fails its magic, length or CRC check."""
    with open(path, "rb") as file:
        raw = file.read()
    magic, crc, length = _SNAPSHOT_HEADER.unpack_from(raw)
    found = snapshot_format(magic)
    if found is not None and found > SNAPSHOT_FORMAT:
        raise RaftError(too_new(f"{path}: Raft snapshot", found, SNAPSHOT_FORMAT))
    payload = raw[_SNAPSHOT_HEADER.size :]
    if magic != _SNAPSHOT_MAGIC or len(payload) != length or crc32c.crc32c(payload) != crc:
        raise RaftError(f"{path}: snapshot fails its checks")
    data, state = safe_pickle.load_snapshot(payload)  # the file is ours or the leader's
    return tuple(data), state


def snapshot_format(magic: bytes) -> int | None:
    """The format a snapshot file's first 8 bytes name; None if they are not a snapshot's."""
    if len(magic) != len(_SNAPSHOT_MAGIC) or not magic.startswith(SNAPSHOT_MAGIC_PREFIX):
        return None
    digit = magic[len(SNAPSHOT_MAGIC_PREFIX) :]
    return int(digit) if digit.isdigit() else None
