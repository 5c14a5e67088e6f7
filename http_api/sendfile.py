"""A response that sends byte ranges of files with sendfile(2), no copy, no decode.

The binary fetch path answers with the raw batches exactly as stored: the body is
one or more (fd, position, length) ranges of segment files. The descriptors are
private duplicates owned by the read result, so the ranges stay valid even if
retention deletes or compaction replaces a segment while the response is sent.

Under TLS the bytes must pass through the ssl object, so sendfile(2) cannot be used:
asyncio refuses it for an SSL transport and each range is then read with pread and
written in chunks of _FALLBACK_CHUNK_BYTES (`_copy`), the same bytes at a copy's cost.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable, Sequence
from typing import Protocol

from aiohttp import web
from aiohttp.abc import AbstractStreamWriter

_FALLBACK_CHUNK_BYTES = 256 * 1024


class FileRangeLike(Protocol):
    @property
    def fd(self) -> int: ...
    @property
    def position(self) -> int: ...
    @property
    def length(self) -> int: ...


class _FdFile:
    """The minimal file object loop.sendfile needs, over a descriptor it does not own."""

    def __init__(self, fd: int) -> None:
        self._fd = fd

    def fileno(self) -> int:
        return self._fd

    def seek(self, offset: int, whence: int = 0) -> int:
        return 0  # positions are explicit; sendfile's final seek is irrelevant here


class FileRangesResponse(web.StreamResponse):
    def __init__(
        self,
        ranges: Sequence[FileRangeLike],
        *,
        content_type: str,
        headers: dict[str, str] | None = None,
        on_done: Callable[[], None] | None = None,
    ) -> None:
        super().__init__(status=200, headers=headers)
        self._ranges = list(ranges)
        self._on_done = on_done
        self.content_type = content_type
        self.content_length = sum(r.length for r in self._ranges)

    async def prepare(self, request: web.BaseRequest) -> AbstractStreamWriter | None:
        """Send headers and every range, then release the ranges (`on_done`)."""
        try:
            return await self._send(request)
        finally:
            if self._on_done is not None:
                self._on_done()
                self._on_done = None

    async def _send(self, request: web.BaseRequest) -> AbstractStreamWriter | None:
        if self.prepared:
            return await super().prepare(request)
        writer = await super().prepare(request)
        if writer is None:  # prepare() gives None only for a response already sent
            raise ConnectionResetError("the answer was sent already")
        loop = asyncio.get_running_loop()
        transport = request.transport
        if transport is None:
            raise ConnectionResetError("connection lost before the body was sent")
        for r in self._ranges:
            if r.length == 0:
                continue
            try:
                # fallback=False: asyncio's own fallback reads through file.readinto, which
                # _FdFile has not; a TLS transport raises SendfileNotAvailableError (a
                # RuntimeError) before sending anything, and _copy sends the range.
                await loop.sendfile(
                    transport,
                    _FdFile(r.fd),  # type: ignore[arg-type]
                    r.position,
                    r.length,
                    fallback=False,
                )
            except (NotImplementedError, RuntimeError):
                await self._copy(writer, r)
        await super().write_eof()
        return writer

    @staticmethod
    async def _copy(writer: AbstractStreamWriter, r: FileRangeLike) -> None:
        """Fallback when the transport cannot sendfile (e.g. TLS)."""
        sent = 0
        while sent < r.length:
            chunk = os.pread(r.fd, min(_FALLBACK_CHUNK_BYTES, r.length - sent), r.position + sent)
            if not chunk:
                raise ConnectionResetError("file shrank during the response")
            await writer.write(chunk)
            sent += len(chunk)
