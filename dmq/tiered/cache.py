"""The chunk cache: remote segment bytes read back in fixed chunks, kept on local disk, LRU.

A fetch below the local log start reads a remote segment by byte range. Object stores
answer ranged GETs with a latency of milliseconds (S3: tens), so bytes come back in
chunks of `chunk_bytes` (aligned: chunk i is [i * chunk_bytes, (i + 1) * chunk_bytes)),
each kept as a file under the cache directory until the cache passes `capacity_bytes`;
then the least recently used chunks go. A consumer reading a cold partition from the
start thus costs one GET per chunk, and a second consumer none.

Bounded: at most `capacity_bytes` on disk, plus the chunks being fetched (one per reader
at most). Two readers wanting the same missing chunk share one GET. The directory is
emptied at start (`reset`): nothing in it is trusted across restarts. Single event loop;
file reads and writes run in threads.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import shutil
from collections import OrderedDict
from pathlib import Path

from dmq.tiered.store import ObjectStore, ObjectStoreError

ChunkKey = tuple[str, int]  # (object key, chunk index)


class ChunkCache:
    def __init__(self, directory: Path, *, capacity_bytes: int, chunk_bytes: int) -> None:
        if chunk_bytes < 1 or capacity_bytes < 2 * chunk_bytes:
            raise ValueError("the chunk cache holds at least two chunks")
        self.directory = directory
        self.capacity_bytes = capacity_bytes
        self.chunk_bytes = chunk_bytes
        self._chunks: OrderedDict[ChunkKey, int] = OrderedDict()  # LRU order, sizes
        self._fetching: dict[ChunkKey, asyncio.Future[bytes]] = {}
        self.used_bytes = 0
        self.hits = 0
        self.misses = 0

    def reset(self) -> None:
        """Empty the directory (chunks of an earlier run are not trusted). The broker calls
        it once it holds its data directory's lock, never at construction."""
        shutil.rmtree(self.directory, ignore_errors=True)
        self.directory.mkdir(parents=True, exist_ok=True)
        self._chunks.clear()
        self.used_bytes = 0

    def _path(self, key: ChunkKey) -> Path:
        digest = hashlib.sha256(key[0].encode()).hexdigest()[:32]
        return self.directory / f"{digest}-{key[1]}"

    async def read(
        self, store: ObjectStore, object_key: str, object_size: int, start: int, length: int
    ) -> bytes:
        """Bytes [start, start + length) of the object, clipped to its size."""
        end = min(start + length, object_size)
        parts = []
        position = start
        while position < end:
            index = position // self.chunk_bytes
            offset = position - index * self.chunk_bytes
            want = min(end - position, self.chunk_bytes - offset)
            piece = await self._piece(store, object_key, object_size, index, offset, want)
            if not piece:
                raise ObjectStoreError(f"{object_key}: chunk {index} is short")
            parts.append(piece)
            position += len(piece)
        return b"".join(parts)

    async def _piece(
        self, store: ObjectStore, object_key: str, size: int, index: int, offset: int, length: int
    ) -> bytes:
        """`length` bytes at `offset` of chunk `index`: read from its file (only those
        bytes) if cached, else the chunk is fetched whole and kept."""
        key = (object_key, index)
        if key in self._chunks:
            self._chunks.move_to_end(key)
            self.hits += 1
            try:
                return await asyncio.to_thread(_pread, self._path(key), offset, length)
            except OSError:  # evicted meanwhile: fetch it again
                self._forget(key)
        chunk = await self._chunk(store, object_key, size, index)
        return chunk[offset : offset + length]

    async def _chunk(self, store: ObjectStore, object_key: str, size: int, index: int) -> bytes:
        key = (object_key, index)
        pending = self._fetching.get(key)
        if pending is not None:
            return await asyncio.shield(pending)
        self.misses += 1
        future: asyncio.Future[bytes] = asyncio.get_running_loop().create_future()
        self._fetching[key] = future
        try:
            start = index * self.chunk_bytes
            data = await store.get_range(object_key, start, min(self.chunk_bytes, size - start))
            await asyncio.to_thread(self._write, key, data)
            self._chunks[key] = len(data)
            self.used_bytes += len(data)
            self._evict()
            future.set_result(data)
            return data
        except BaseException as exc:
            future.set_exception(exc)
            future.exception()  # retrieved: no "never retrieved" warning without waiters
            raise
        finally:
            del self._fetching[key]

    def _write(self, key: ChunkKey, data: bytes) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)  # a fetch before reset()
        self._path(key).write_bytes(data)

    def _evict(self) -> None:
        while self.used_bytes > self.capacity_bytes and len(self._chunks) > 1:
            key, _ = next(iter(self._chunks.items()))
            self._forget(key)

    def _forget(self, key: ChunkKey) -> None:
        size = self._chunks.pop(key, None)
        if size is not None:
            self.used_bytes -= size
            self._path(key).unlink(missing_ok=True)

    def drop_object(self, object_key: str) -> None:
        """Forget every chunk of an object (deleted by retention)."""
        for key in [k for k in self._chunks if k[0] == object_key]:
            self._forget(key)


def _pread(path: Path, offset: int, length: int) -> bytes:
    fd = os.open(path, os.O_RDONLY)
    try:
        return os.pread(fd, length, offset)
    finally:
        os.close(fd)
