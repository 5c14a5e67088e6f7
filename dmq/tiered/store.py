"""The file:// backend of tiered storage, and `open_store` (the interface: objects.py).

An object store holds immutable objects by key. Tiered storage needs four operations:
put a whole file (streamed piece by piece, so the uploader can pace it), read a byte
range, delete, and list by prefix. Puts are idempotent: the same segment always gets the
same key, and a put replaces the object whole or not at all (file://: a temporary file,
fsync, rename), so an upload cut short (a kill -9) leaves either nothing or the old
object, and the next attempt writes it again.

`open_store(url)`: `file:///dir` is the embedded backend (one machine, tests, a shared
filesystem); `s3://bucket/prefix` is s3.py's. The store is asyncio-facing: blocking file
I/O runs in threads.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
import uuid
from pathlib import Path

from dmq.tiered.objects import ObjectNotFound, ObjectStore, ObjectStoreError, Throttle
from log.segment import fsync_directory

__all__ = [
    "FileStore",
    "ObjectNotFound",
    "ObjectStore",
    "ObjectStoreError",
    "Throttle",
    "open_store",
]

# Bytes copied per step of a put: the pacing granularity of the bandwidth limit.
PUT_PIECE_BYTES = 256 * 1024

# A put's temporary file untouched this long belongs to a dead process: removed at open.
TEMPORARY_AGE_S = 600


def open_store(url: str, endpoint_url: str = "") -> ObjectStore:
    """`file:///dir`, or `s3://bucket/prefix` (dmq/tiered/s3.py: needs aiobotocore, the
    `s3` extra; `endpoint_url` for an S3-compatible server other than AWS)."""
    if url.startswith("file:///"):
        return FileStore(Path(url.removeprefix("file://")))
    if url.startswith("s3://"):
        try:
            from dmq.tiered.s3 import S3Store
        except ImportError as exc:
            raise ValueError(f"{url}: s3:// needs aiobotocore (pip install 'dmq[s3]')") from exc
        return S3Store(url, endpoint_url or None)
    raise ValueError(f"unknown object store {url!r}: file:///dir or s3://bucket/prefix")


class FileStore:
    """Objects as files under one directory; keys are relative paths (no '..')."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.url = f"file://{root}"
        root.mkdir(parents=True, exist_ok=True)
        self._sweep_temporaries()

    def _sweep_temporaries(self) -> None:
        """Temporary files of puts a kill cut short (brokers sharing the store may be
        writing theirs: only those untouched for TEMPORARY_AGE_S go)."""
        horizon = time.time() - TEMPORARY_AGE_S
        for dirpath, _, files in os.walk(self.root):
            for name in files:
                path = os.path.join(dirpath, name)
                with contextlib.suppress(OSError):
                    if ".tmp-" in name and os.stat(path).st_mtime < horizon:
                        os.unlink(path)

    def _path(self, key: str) -> Path:
        parts = key.split("/")
        if not key or any(p in ("", ".", "..") for p in parts) or ".tmp-" in key:
            raise ObjectStoreError(f"bad object key {key!r}")
        return self.root.joinpath(*parts)

    async def put_file(self, key: str, fd: int, size: int, throttle: Throttle) -> None:
        path = self._path(key)
        tmp = path.with_name(f"{path.name}.tmp-{uuid.uuid4().hex}")
        try:
            await asyncio.to_thread(path.parent.mkdir, parents=True, exist_ok=True)
            out = await asyncio.to_thread(os.open, tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
            try:
                position = 0
                while position < size:
                    n = min(PUT_PIECE_BYTES, size - position)
                    await throttle(n)
                    copied = await asyncio.to_thread(os.copy_file_range, fd, out, n, position)
                    if copied <= 0:
                        raise ObjectStoreError(f"{key}: source ended at {position} of {size}")
                    position += copied
                await asyncio.to_thread(os.fsync, out)
            finally:
                os.close(out)
            await asyncio.to_thread(os.replace, tmp, path)
            await asyncio.to_thread(fsync_directory, path.parent)
        except OSError as exc:
            raise ObjectStoreError(f"put {key}: {exc}") from exc
        finally:
            tmp.unlink(missing_ok=True)

    async def get_range(self, key: str, start: int, length: int) -> bytes:
        path = self._path(key)

        def read() -> bytes:
            with open(path, "rb") as f:
                return os.pread(f.fileno(), length, start)

        try:
            return await asyncio.to_thread(read)
        except FileNotFoundError:
            raise ObjectNotFound(key) from None
        except OSError as exc:
            raise ObjectStoreError(f"get {key}: {exc}") from exc

    async def delete(self, key: str) -> None:
        try:
            await asyncio.to_thread(self._path(key).unlink, True)
        except OSError as exc:
            raise ObjectStoreError(f"delete {key}: {exc}") from exc

    async def list_keys(self, prefix: str) -> list[str]:
        def walk() -> list[str]:
            out = []
            for dirpath, _, files in os.walk(self.root):
                for name in files:
                    if ".tmp-" in name:
                        continue
                    key = os.path.relpath(os.path.join(dirpath, name), self.root)
                    if key.startswith(prefix):
                        out.append(key)
            return sorted(out)

        return await asyncio.to_thread(walk)

    async def close(self) -> None:
        return None
