"""Proves dmq/tiered/store.py's file:// backend and dmq/tiered/cache.py's chunk cache.

- a put replaces an object whole and is idempotent (the same key again gives the same
  object); a put cut short leaves no object, only a temporary file that `list_keys`
  skips; ranged reads, listing by prefix and delete behave; a key with '..' is refused;
- the chunk cache never holds more than its capacity on disk (LRU eviction), answers
  every range byte-identical to the object whatever the chunk boundaries (hypothesis),
  shares one GET between readers of the same missing chunk, and counts hits and misses.
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dmq.tiered.cache import ChunkCache
from dmq.tiered.store import FileStore, ObjectNotFound, ObjectStoreError


async def no_throttle(n: int) -> None:
    return None


def put(store: FileStore, key: str, data: bytes, tmp: Path) -> None:
    source = tmp / "source"
    source.write_bytes(data)
    fd = os.open(source, os.O_RDONLY)
    try:
        asyncio.run(store.put_file(key, fd, len(data), no_throttle))
    finally:
        os.close(fd)


def test_file_store_puts_reads_lists_and_deletes(tmp_path: Path) -> None:
    store = FileStore(tmp_path / "store")
    data = os.urandom(700_000)
    put(store, "t-1/0/a.log", data, tmp_path)
    put(store, "t-1/0/a.log", data, tmp_path)  # idempotent
    put(store, "t-1/1/b.log", b"other", tmp_path)
    assert asyncio.run(store.get_range("t-1/0/a.log", 1000, 5000)) == data[1000:6000]
    assert asyncio.run(store.get_range("t-1/0/a.log", 699_990, 100)) == data[699_990:]
    assert asyncio.run(store.list_keys("t-1/0/")) == ["t-1/0/a.log"]
    asyncio.run(store.delete("t-1/0/a.log"))
    asyncio.run(store.delete("t-1/0/a.log"))  # already gone: no error
    with pytest.raises(ObjectNotFound):
        asyncio.run(store.get_range("t-1/0/a.log", 0, 1))
    with pytest.raises(ObjectStoreError):
        asyncio.run(store.get_range("../escape", 0, 1))


def test_a_put_cut_short_leaves_no_object(tmp_path: Path) -> None:
    store = FileStore(tmp_path / "store")

    async def fail_after_first(n: int, calls: list[int] = []) -> None:  # noqa: B006
        calls.append(n)
        if len(calls) > 1:
            raise ConnectionError("the store went away")

    source = tmp_path / "source"
    source.write_bytes(os.urandom(600_000))
    fd = os.open(source, os.O_RDONLY)
    try:
        with pytest.raises(ObjectStoreError):
            asyncio.run(store.put_file("k/x.log", fd, 600_000, fail_after_first))
    finally:
        os.close(fd)
    assert asyncio.run(store.list_keys("")) == []
    assert not list((tmp_path / "store").rglob("*.tmp-*"))  # removed on the way out


class CountingStore(FileStore):
    gets = 0

    async def get_range(self, key: str, start: int, length: int) -> bytes:
        self.gets += 1
        await asyncio.sleep(0.01)
        return await super().get_range(key, start, length)


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 50_000), st.integers(1, 20_000)), min_size=1, max_size=12))
def test_the_cache_answers_every_range_exactly_within_its_capacity(
    tmp_path_factory: pytest.TempPathFactory, ranges: list[tuple[int, int]]
) -> None:
    tmp = tmp_path_factory.mktemp("cache")
    store = CountingStore(tmp / "store")
    data = os.urandom(50_000)
    put(store, "o.log", data, tmp)
    cache = ChunkCache(tmp / "cache", capacity_bytes=12_000, chunk_bytes=4_000)
    cache.reset()

    async def run() -> None:
        for start, length in ranges:
            got = await cache.read(store, "o.log", len(data), start, length)
            assert got == data[start : start + length]
            on_disk = sum(p.stat().st_size for p in (tmp / "cache").iterdir())
            assert on_disk == cache.used_bytes <= 12_000

    asyncio.run(run())


def test_readers_of_one_missing_chunk_share_one_get(tmp_path: Path) -> None:
    store = CountingStore(tmp_path / "store")
    data = os.urandom(10_000)
    put(store, "o.log", data, tmp_path)
    cache = ChunkCache(tmp_path / "cache", capacity_bytes=8_192, chunk_bytes=4_096)
    cache.reset()

    async def run() -> list[bytes]:
        return list(
            await asyncio.gather(
                *(cache.read(store, "o.log", len(data), 10, 100) for _ in range(5))
            )
        )

    assert asyncio.run(run()) == [data[10:110]] * 5
    assert store.gets == 1 and cache.misses == 1
    asyncio.run(cache.read(store, "o.log", len(data), 0, 50))
    assert cache.hits == 1 and store.gets == 1
