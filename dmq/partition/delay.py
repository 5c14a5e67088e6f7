"""Delayed records: the per-partition delay store, replicated by the partition's Raft group.

A delayed record is not in the partition's log until its time. The partition's own Raft
group replicates three delay commands beside ProduceCommand (machine.py dispatches them
here by their first byte, `D`):

- `schedule(now_ms, [(deliver_at_ms, one-record batch)...])`: each record gets its
  schedule id from its place in the Raft log (`sid = index << 32 | k << 16 | i`: the
  same on every replica, unique, no counter to replicate) and is written to the store;
- `release(now_ms, [(sid, deliver_at_ms)...])`, proposed by the partition leader when
  records are due: every listed record still pending with `deliver_at_ms <= now_ms` is
  appended to the log (one batch, offsets assigned at apply) and removed from the store
  **in the same apply**. A record already released or cancelled is skipped, so a release
  proposed twice (a new leader after a failover, a retry) delivers nothing twice, and a
  record is never appended before its time by the proposing leader's clock;
- `cancel(now_ms, sid, deliver_at_ms)`: removes a pending record; answers whether it was.

**On disk** (`<partition dir>/delay/`): one append-only file per time bucket
(`<bucket start ms>.bucket`, `BUCKET_MS` wide), entries `u32 length | u32 crc32c |
body`, body `u8 op | u64 index | u32 k | u64 sid | i64 deliver_at_ms | batch (S only)`,
op S (scheduled) or D (done: released or cancelled). Memory holds, per non-empty bucket,
its count and earliest pending time, and the entries (not the records) of the buckets
that are due or touched: the window. A million pending records cost their bytes on disk
and tens of bytes per bucket in memory.

**Exactly once across crashes.** Each entry carries the Raft position of its command,
and the store is fsynced before the machine writes that command's checkpoint record, so
every position the applied checkpoint vouches for is in the store. At open the machine
hands the store its chosen applied position: entries past it are cut (the journal
replays their commands, which rewrite them; the log is cut back to the same position by
the machine). A bucket file is deleted only by `after_checkpoint`, once it has no
pending record and the machine made its position durable (a reopen never goes back
before it). Snapshots carry the pending records (`to_snapshot`), and `restore` rewrites
the store from one; the store's size is bounded (`delay_pending_bytes_max`, checked by
the leader before proposing) because a snapshot holds it whole.
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import struct
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import crc32c

from log.partition_log import PartitionLog
from log.records import Record, decode_batch, encode_batch
from log.segment import fsync_directory

Position = tuple[int, int]

DELAY_MAGIC = b"D"
DELAY_COMMAND_VERSION = 1
KIND_SCHEDULE = ord("S")
KIND_RELEASE = ord("R")
KIND_CANCEL = ord("C")
# Bucket width: a due bucket is read whole into memory (its entries, not its records).
BUCKET_MS = 10_000
# Records one schedule command carries (the sid keeps 16 bits for the place in it).
SCHEDULE_RECORDS_MAX = 65_535
STORE_DIR = "delay"
_HEAD = struct.Struct("<cBBqI")  # magic, version, kind, now_ms, count
_SCHEDULED = struct.Struct("<qI")  # deliver_at_ms, batch length
_RELEASED = struct.Struct("<Qq")  # sid, deliver_at_ms
_ENTRY_HEAD = struct.Struct("<II")  # body length, crc32c(body)
_ENTRY_BODY = struct.Struct("<cQIQq")  # op, index, k, sid, deliver_at_ms
OP_SCHEDULED = b"S"
OP_DONE = b"D"


class DelayCommandError(ValueError):
    """A delay command this code cannot read."""


@dataclass(frozen=True, slots=True)
class DelayCommand:
    kind: int  # KIND_SCHEDULE, KIND_RELEASE or KIND_CANCEL
    now_ms: int
    scheduled: tuple[tuple[int, bytes], ...] = ()  # (deliver_at_ms, one-record batch)
    targets: tuple[tuple[int, int], ...] = ()  # (sid, deliver_at_ms): release, cancel

    def encode(self) -> bytes:
        if self.kind == KIND_SCHEDULE:
            if not 1 <= len(self.scheduled) <= SCHEDULE_RECORDS_MAX:
                raise ValueError(f"a schedule carries 1 to {SCHEDULE_RECORDS_MAX} records")
            parts = [_HEAD.pack(DELAY_MAGIC, DELAY_COMMAND_VERSION, self.kind, self.now_ms,
                                len(self.scheduled))]  # fmt: skip
            for deliver_at, batch in self.scheduled:
                parts += [_SCHEDULED.pack(deliver_at, len(batch)), batch]
            return b"".join(parts)
        head = _HEAD.pack(
            DELAY_MAGIC, DELAY_COMMAND_VERSION, self.kind, self.now_ms, len(self.targets)
        )
        return head + b"".join(_RELEASED.pack(sid, at) for sid, at in self.targets)

    @classmethod
    def decode(cls, data: bytes) -> DelayCommand:
        view = memoryview(data)
        if len(view) < _HEAD.size:
            raise DelayCommandError(f"delay command of {len(view)} bytes is too short")
        magic, version, kind, now_ms, count = _HEAD.unpack_from(view)
        if magic != DELAY_MAGIC or version != DELAY_COMMAND_VERSION:
            raise DelayCommandError(f"not a delay command version 1 ({magic!r}, {version})")
        pos = _HEAD.size
        if kind == KIND_SCHEDULE:
            scheduled = []
            for _ in range(count):
                if pos + _SCHEDULED.size > len(view):
                    raise DelayCommandError("schedule command cut short")
                deliver_at, length = _SCHEDULED.unpack_from(view, pos)
                pos += _SCHEDULED.size
                if pos + length > len(view):
                    raise DelayCommandError("schedule command cut short in a batch")
                scheduled.append((deliver_at, bytes(view[pos : pos + length])))
                pos += length
            if pos != len(view):
                raise DelayCommandError("bytes after the last scheduled record")
            return cls(kind, now_ms, scheduled=tuple(scheduled))
        if kind not in (KIND_RELEASE, KIND_CANCEL):
            raise DelayCommandError(f"unknown delay command kind {kind}")
        if len(view) != pos + count * _RELEASED.size:
            raise DelayCommandError("release/cancel command of the wrong length")
        targets = tuple(_RELEASED.unpack_from(view, pos + i * _RELEASED.size) for i in range(count))
        return cls(kind, now_ms, targets=targets)


def is_delay_command(command: bytes) -> bool:
    return command[:1] == DELAY_MAGIC


def schedule_id(position: Position, i: int) -> int:
    index, k = position
    if k >= 1 << 16 or i >= 1 << 16:
        raise ValueError(f"schedule position {position}/{i} does not fit a sid")
    return index << 32 | k << 16 | i


def bucket_of(deliver_at_ms: int) -> int:
    return deliver_at_ms - deliver_at_ms % BUCKET_MS


@dataclass(slots=True)
class _Bucket:
    """A bucket's summary (always in memory) and, when loaded, its pending entries."""

    count: int = 0
    earliest_ms: int | None = None  # a lower bound of its pending records' times
    entries: dict[int, tuple[int, int, int]] | None = None  # sid -> (at, file pos, length)
    size: int = 0  # file length


@dataclass(slots=True)
class DelayStore:
    """The pending delayed records of one partition (module docstring). Single-writer:
    the partition machine's owner serialises calls (the replica's lock)."""

    directory: Path
    _buckets: dict[int, _Bucket] = field(default_factory=dict)
    pending_bytes: int = 0  # batch bytes pending (the leader bounds it)
    # No record is due before this (None: none pending). Read by the event loop without
    # the lock (one int): a lower bound, made exact by `due`, lowered by each schedule.
    due_hint_ms: int | None = None
    last_now_ms: int = 0  # the latest command time applied: which buckets are due soon

    @classmethod
    def open(cls, partition_directory: Path, applied: Position) -> DelayStore:
        store = cls(partition_directory / STORE_DIR)
        store.directory.mkdir(parents=True, exist_ok=True)
        for path in sorted(store.directory.glob("*.bucket")):
            store._recover(path, applied)
        store.due_hint_ms = store.next_due_ms
        return store

    # --- reading ---------------------------------------------------------------------------

    @property
    def pending_count(self) -> int:
        return sum(b.count for b in self._buckets.values())

    @property
    def next_due_ms(self) -> int | None:
        """The earliest pending deliver_at_ms (a lower bound while its bucket is not
        loaded: the bucket's earliest when the store was opened or last written)."""
        starts = [s for s, b in self._buckets.items() if b.count]
        if not starts:
            return None
        bucket = self._buckets[min(starts)]
        if bucket.entries is not None:
            return min(e[0] for e in bucket.entries.values())
        return bucket.earliest_ms

    def due(self, now_ms: int, records_max: int, bytes_max: int) -> list[tuple[int, int]]:
        """(sid, deliver_at_ms) of pending records due at now_ms, earliest first, up to
        records_max and about bytes_max of batches (at least one)."""
        out: list[tuple[int, int]] = []
        size = 0
        self.due_hint_ms = self.next_due_ms
        for start in sorted(self._buckets):
            if start > now_ms:
                break
            entries = self._load(start)
            for sid, (at, _pos, length) in sorted(entries.items(), key=lambda e: (e[1][0], e[0])):
                if at > now_ms or len(out) >= records_max or (out and size + length > bytes_max):
                    return out
                out.append((sid, at))
                size += length
        return out

    def pending(self) -> Iterator[tuple[int, int, bytes]]:
        """Every pending (sid, deliver_at_ms, batch), bucket by bucket (reads the files)."""
        for start in sorted(self._buckets):
            bucket = self._buckets[start]
            if not bucket.count:
                continue
            for sid, (at, pos, length) in sorted(self._load(start).items()):
                yield sid, at, self._read(start, pos, length)

    # --- applying --------------------------------------------------------------------------

    def apply(self, position: Position, command: DelayCommand, log: PartitionLog) -> list[int]:
        """Apply a delay command: the sids scheduled; the base offset of the released batch
        (or -1 if none was due) and the count released; [1] or [0] for a cancel."""
        touched: set[int] = set()
        self.last_now_ms = max(self.last_now_ms, command.now_ms)
        if command.kind == KIND_SCHEDULE:
            sids = []
            for i, (at, batch) in enumerate(command.scheduled):
                sid = schedule_id(position, i)
                self._write(position, OP_SCHEDULED, sid, at, batch)
                touched.add(bucket_of(at))
                sids.append(sid)
            self._sync(touched)
            return sids
        if command.kind == KIND_CANCEL:
            ((sid, at),) = command.targets
            found = self._take(position, sid, at)
            self._sync({bucket_of(at)} if found is not None else set())
            return [1 if found is not None else 0]
        records: list[Record] = []
        for sid, at in command.targets:
            if at > command.now_ms:
                continue  # never before its time (a proposer's clock ran ahead: it waits)
            taken = self._take(position, sid, at)
            if taken is not None:
                records.extend(decode_batch(taken).records)
                touched.add(bucket_of(at))
        self._sync(touched)
        if not records:
            return [-1, 0]
        appended = log.append(encode_batch(records), assign_offsets=True)
        return [appended.base_offset, len(records)]

    def _take(self, position: Position, sid: int, at: int) -> bytes | None:
        """Remove a pending record; its batch, or None if it is not pending."""
        start = bucket_of(at)
        if start not in self._buckets:
            return None
        entries = self._load(start)
        found = entries.get(sid)
        if found is None:
            return None
        batch = self._read(start, found[1], found[2])
        self._write(position, OP_DONE, sid, at, b"")
        del entries[sid]
        bucket = self._buckets[start]
        bucket.count -= 1
        self.pending_bytes -= found[2]
        return batch

    # --- snapshots and checkpoints ---------------------------------------------------------

    def after_checkpoint(self) -> None:
        """The machine made its applied position durable: empty buckets may go, and loaded
        buckets that are not due soon leave memory."""
        for start in [s for s, b in self._buckets.items() if b.count == 0]:
            self._path(start).unlink(missing_ok=True)
            del self._buckets[start]
        fsync_directory(self.directory)
        soon = self.last_now_ms + 2 * BUCKET_MS
        for start, bucket in self._buckets.items():
            if start > soon and bucket.entries is not None:  # loaded by a cancel: drop
                bucket.earliest_ms = min((e[0] for e in bucket.entries.values()), default=None)
                bucket.entries = None

    def to_snapshot(self) -> str | None:
        """The pending records as JSON (None when there are none)."""
        pending = [[sid, at, base64.b64encode(batch).decode()] for sid, at, batch in self.pending()]
        return json.dumps(pending, separators=(",", ":")) if pending else None

    def restore(self, doc: str | None, position: Position) -> None:
        """Replace the store by a snapshot's pending records, written at `position`."""
        tmp = self.directory.with_name(STORE_DIR + ".restore")
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir()
        fresh = DelayStore(tmp)
        touched: set[int] = set()
        for sid, at, text in json.loads(doc) if doc else []:
            fresh._write(position, OP_SCHEDULED, int(sid), int(at), base64.b64decode(text))
            touched.add(bucket_of(int(at)))
        fresh._sync(touched)
        shutil.rmtree(self.directory, ignore_errors=True)
        os.replace(tmp, self.directory)
        fsync_directory(self.directory.parent)
        self._buckets, self.pending_bytes = fresh._buckets, fresh.pending_bytes
        self.due_hint_ms = self.next_due_ms

    # --- files -----------------------------------------------------------------------------

    def _path(self, start: int) -> Path:
        return self.directory / f"{start:020d}.bucket"

    def _write(self, position: Position, op: bytes, sid: int, at: int, batch: bytes) -> None:
        start = bucket_of(at)
        bucket = self._buckets.get(start)
        if bucket is None:
            bucket = self._buckets[start] = _Bucket(entries={})
        body = _ENTRY_BODY.pack(op, position[0], position[1], sid, at) + batch
        entry = _ENTRY_HEAD.pack(len(body), crc32c.crc32c(body)) + body
        with open(self._path(start), "ab") as f:
            f.write(entry)
        batch_pos = bucket.size + _ENTRY_HEAD.size + _ENTRY_BODY.size
        bucket.size += len(entry)
        if op == OP_SCHEDULED:
            bucket.count += 1
            self.pending_bytes += len(batch)
            bucket.earliest_ms = at if bucket.earliest_ms is None else min(bucket.earliest_ms, at)
            self.due_hint_ms = at if self.due_hint_ms is None else min(self.due_hint_ms, at)
            if bucket.entries is not None:
                bucket.entries[sid] = (at, batch_pos, len(batch))

    def _sync(self, starts: set[int]) -> None:
        """fsync the touched bucket files (before the machine's checkpoint record)."""
        for start in starts:
            fd = os.open(self._path(start), os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        if starts:
            fsync_directory(self.directory)

    def _read(self, start: int, pos: int, length: int) -> bytes:
        with open(self._path(start), "rb") as f:
            f.seek(pos)
            data = f.read(length)
        if len(data) != length:
            raise OSError(f"{self._path(start)}: short read at {pos}")
        return data

    def _load(self, start: int) -> dict[int, tuple[int, int, int]]:
        bucket = self._buckets[start]
        if bucket.entries is None:
            bucket.entries = {
                sid: (at, pos, length)
                for sid, at, pos, length in _pending_entries(self._path(start), bucket.size)
            }
        return bucket.entries

    def _recover(self, path: Path, applied: Position) -> None:
        """Cut a torn tail and every entry past `applied`; count what is pending."""
        try:
            start = int(path.stem)
        except ValueError:
            return
        good = 0
        pending: dict[int, tuple[int, int, int]] = {}
        with open(path, "rb") as f:
            data = f.read()
        for end, op, position, sid, at, pos, length in _scan(data):
            if position > applied:
                break
            good = end
            if op == OP_SCHEDULED:
                pending[sid] = (at, pos, length)
            else:
                pending.pop(sid, None)
        if good < len(data):
            with open(path, "r+b") as f:
                f.truncate(good)
                f.flush()
                os.fsync(f.fileno())
        self._buckets[start] = _Bucket(
            count=len(pending),
            earliest_ms=min((e[0] for e in pending.values()), default=None),
            entries=None,
            size=good,
        )
        self.pending_bytes += sum(e[2] for e in pending.values())


def _scan(data: bytes) -> Iterator[tuple[int, bytes, Position, int, int, int, int]]:
    """(end, op, position, sid, deliver_at, batch pos, batch length) of each whole entry
    with a good CRC, up to the first torn or corrupt one."""
    pos = 0
    while pos + _ENTRY_HEAD.size <= len(data):
        length, crc = _ENTRY_HEAD.unpack_from(data, pos)
        body_at = pos + _ENTRY_HEAD.size
        end = body_at + length
        if length < _ENTRY_BODY.size or end > len(data):
            return
        if crc32c.crc32c(data[body_at:end]) != crc:
            return
        op, index, k, sid, at = _ENTRY_BODY.unpack_from(data, body_at)
        batch_at = body_at + _ENTRY_BODY.size
        yield end, op, (index, k), sid, at, batch_at, end - batch_at
        pos = end


def _pending_entries(path: Path, size: int) -> Iterator[tuple[int, int, int, int]]:
    with open(path, "rb") as f:
        data = f.read(size)
    pending: dict[int, tuple[int, int, int]] = {}
    for _end, op, _position, sid, at, pos, length in _scan(data):
        if op == OP_SCHEDULED:
            pending[sid] = (at, pos, length)
        else:
            pending.pop(sid, None)
    for sid, (at, pos, length) in pending.items():
        yield sid, at, pos, length
