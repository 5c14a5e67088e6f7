"""The object-store interface of tiered storage: what every backend offers, its errors.

Backends: dmq/tiered/store.py (file://, and `open_store`), dmq/tiered/s3.py (s3://).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Protocol

# throttle(n): awaited before each piece of n bytes a put sends (the uploader's pacing).
Throttle = Callable[[int], Awaitable[None]]


class ObjectStoreError(Exception):
    """An object-store operation failed (retriable: the caller backs off and retries)."""


class ObjectNotFound(ObjectStoreError):
    """No object under that key (deleted by retention, or never uploaded)."""


class ObjectStore(Protocol):
    url: str

    async def put_file(self, key: str, fd: int, size: int, throttle: Throttle) -> None:
        """Store bytes [0, size) of the open file `fd` under `key`, awaiting
        `throttle(n)` before each piece of n bytes; replaces an object whole."""
        ...

    async def get_range(self, key: str, start: int, length: int) -> bytes:
        """Bytes [start, start + length) of the object (fewer only at its end)."""
        ...

    async def delete(self, key: str) -> None:
        """Remove the object; no error if it is already gone."""
        ...

    async def list_keys(self, prefix: str) -> list[str]:
        """Every key that starts with `prefix`, sorted."""
        ...

    async def close(self) -> None: ...
