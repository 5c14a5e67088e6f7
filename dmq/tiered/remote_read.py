"""Whole batches of a remote segment, by byte range through the chunk cache.

The segment's `.index` object (sparse: relative offset u32, position u32, as log/segment.py
writes it) gives the position of the last indexed batch at or before the wanted offset;
from there batch headers are walked (each read through the cache) to the batch holding
the offset, then whole batches are taken up to `max_bytes` (at least one, as a local read
does) and below `end_offset`. Every batch is checked (length, CRC-32C) after it is read
back: a remote object that fails is refused, never served.
"""

from __future__ import annotations

import struct
from bisect import bisect_right

from dmq.partition.remote_manifest import RemoteSegment
from dmq.tiered.cache import ChunkCache
from dmq.tiered.store import ObjectStore, ObjectStoreError
from log import records as fmt
from log.errors import CorruptRecordError

_INDEX_ENTRY = struct.Struct(">II")


class CorruptRemoteSegment(ObjectStoreError):
    """A remote object whose bytes fail their checks."""


def object_keys(prefix: str) -> tuple[str, str, str]:
    """The .log, .index and .timeindex objects of a segment uploaded under `prefix`."""
    return prefix + ".log", prefix + ".index", prefix + ".timeindex"


async def _start_position(
    store: ObjectStore, cache: ChunkCache, segment: RemoteSegment, offset: int
) -> int:
    if segment.index_bytes == 0:
        return 0
    _, index_key, _ = object_keys(segment.key)
    raw = await cache.read(store, index_key, segment.index_bytes, 0, segment.index_bytes)
    if len(raw) % _INDEX_ENTRY.size:
        raise CorruptRemoteSegment(f"{index_key}: {len(raw)} bytes is not whole entries")
    entries = list(_INDEX_ENTRY.iter_unpack(raw))
    i = bisect_right([segment.base_offset + rel for rel, _ in entries], offset)
    return entries[i - 1][1] if i else 0


async def read_segment(
    store: ObjectStore,
    cache: ChunkCache,
    segment: RemoteSegment,
    offset: int,
    max_bytes: int,
    end_offset: int,
) -> tuple[bytes, int]:
    """Raw whole batches holding offsets from `offset` (the first may begin before it),
    each below end_offset, within max_bytes (at least one); and the offset the next read
    starts at (the segment's end once it is read to the end)."""
    log_key, _, _ = object_keys(segment.key)
    size = segment.size_bytes
    position = await _start_position(store, cache, segment, offset)
    out = bytearray()
    next_offset = offset
    while position < size:
        head = await cache.read(store, log_key, size, position, fmt.HEADER_BYTES)
        try:
            header = fmt.read_header(head)
        except CorruptRecordError as exc:
            raise CorruptRemoteSegment(f"{log_key} at {position}: {exc}") from exc
        if header.last_offset < offset:
            position += header.size_bytes
            continue
        if header.base_offset >= end_offset or (out and len(out) + header.size_bytes > max_bytes):
            return bytes(out), next_offset
        batch = await cache.read(store, log_key, size, position, header.size_bytes)
        if len(batch) != header.size_bytes or not fmt.verify_crc(batch, header):
            raise CorruptRemoteSegment(f"{log_key} at {position}: length or CRC-32C mismatch")
        out += batch
        next_offset = header.next_offset
        position += header.size_bytes
        if len(out) >= max_bytes:
            return bytes(out), next_offset
    return bytes(out), max(next_offset, min(segment.end_offset, end_offset))
