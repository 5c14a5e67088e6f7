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
the machine). Empty bucket files
are deleted by `maybe_compact`, at a snapshot, one snapshot late (below).

**Snapshots name the store, they do not carry it.** A partition snapshot holds its
position and the store's pending count only (`PartitionSnapshot.delay_pending`). A
replica that installs one copies the store **as it was at that position** from another
replica, the leader first, as the log's missing range is copied (`export`, served by
`GET /v1/internal/delay/{topic}/{partition}/pending`, and `restore_stream`): every entry
carries its Raft position, so a source that has moved on reads its files as of the
snapshot's position (entries after it are skipped). Nothing is built in memory: the
source streams the entries of one bucket file after another, the receiver writes them
into a fresh directory and swaps it in, so a million pending records cost their bytes on
disk and in flight, not in RAM. For a source to answer for position P it needs every
bucket file that had a pending record at P: `maybe_compact(P_new)` deletes only the files
that were empty already at the previous snapshot P_prev and not written since, and stores
P_prev durably first (`compacted`: the store answers for no position before it). A
follower installing P_prev, or the latest snapshot, thus always finds its files; one that
installs across two snapshots of its source is refused (409) and tries the next replica.
"""

from __future__ import annotations

import base64
import json
import mmap
import os
import shutil
import struct
from collections.abc import Callable, Generator, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO

import crc32c

from log.errors import StorageWriteError
from log.partition_log import PartitionLog
from log.records import Record, decode_batch, encode_batch
from log.segment import NO_SPACE_ERRNOS, fsync_directory, write_durably

Position = tuple[int, int]

DELAY_MAGIC = b"D"
DELAY_COMMAND_VERSION = 1
KIND_SCHEDULE = ord("S")
# On the wire only: a schedule with an idempotent producer (decoded as KIND_SCHEDULE with
# `producer` set); its retry is answered with the first one's sids (machine.py).
KIND_SCHEDULE_IDEMPOTENT = ord("I")
KIND_RELEASE = ord("R")
KIND_CANCEL = ord("C")
# Bucket width: a due bucket is read whole into memory (its entries, not its records).
BUCKET_MS = 10_000
# Records one schedule command carries (the sid keeps 16 bits for the place in it).
SCHEDULE_RECORDS_MAX = 65_535
STORE_DIR = "delay"
COMPACTED_FILE = "compacted"  # the position the store answers for, at least (module doc)
# A copy (export) is sent in chunks of about this many bytes (whole entries).
EXPORT_CHUNK_BYTES = 1024 * 1024
_COPY_END = struct.Struct("<IIQ")  # 0, 0, count: the end of an export stream
_HEAD = struct.Struct("<cBBqI")  # magic, version, kind, now_ms, count
_PRODUCER = struct.Struct("<qhi")  # producer_id, producer_epoch, base_sequence
_SCHEDULED = struct.Struct("<qI")  # deliver_at_ms, batch length
_RELEASED = struct.Struct("<Qq")  # sid, deliver_at_ms
_ENTRY_HEAD = struct.Struct("<II")  # body length, crc32c(body)
_ENTRY_BODY = struct.Struct("<cQIQq")  # op, index, k, sid, deliver_at_ms
OP_SCHEDULED = b"S"
OP_DONE = b"D"


class DelayCommandError(ValueError):
    """A delay command this code cannot read."""


class DelayCopyError(ValueError):
    """A copy of the store that cannot be served (the source compacted past the position,
    or has not applied it) or that arrived damaged: the receiver tries another replica."""


@dataclass(frozen=True, slots=True)
class DelayCommand:
    kind: int  # KIND_SCHEDULE, KIND_RELEASE or KIND_CANCEL
    now_ms: int
    scheduled: tuple[tuple[int, bytes], ...] = ()  # (deliver_at_ms, one-record batch)
    targets: tuple[tuple[int, int], ...] = ()  # (sid, deliver_at_ms): release, cancel
    # A schedule's idempotent producer: (producer_id, producer_epoch, base_sequence).
    producer: tuple[int, int, int] | None = None

    def encode(self) -> bytes:
        if self.kind == KIND_SCHEDULE:
            if not 1 <= len(self.scheduled) <= SCHEDULE_RECORDS_MAX:
                raise ValueError(f"a schedule carries 1 to {SCHEDULE_RECORDS_MAX} records")
            kind = KIND_SCHEDULE if self.producer is None else KIND_SCHEDULE_IDEMPOTENT
            parts = [_HEAD.pack(DELAY_MAGIC, DELAY_COMMAND_VERSION, kind, self.now_ms,
                                len(self.scheduled))]  # fmt: skip
            if self.producer is not None:
                parts.append(_PRODUCER.pack(*self.producer))
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
        producer = None
        if kind == KIND_SCHEDULE_IDEMPOTENT:
            if pos + _PRODUCER.size > len(view):
                raise DelayCommandError("schedule command cut short in its producer")
            producer = _PRODUCER.unpack_from(view, pos)
            pos += _PRODUCER.size
            kind = KIND_SCHEDULE
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
            return cls(kind, now_ms, scheduled=tuple(scheduled), producer=producer)
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

    def copy(self) -> _Bucket:
        entries = None if self.entries is None else dict(self.entries)
        return _Bucket(self.count, self.earliest_ms, entries, self.size)


@dataclass(slots=True)
class DelayStore:
    """The pending delayed records of one partition (module docstring). Single-writer:
    the partition machine's owner serialises calls (the replica's lock); `export`'s
    stream is read by a storage thread while the writer goes on."""

    directory: Path
    _buckets: dict[int, _Bucket] = field(default_factory=dict)
    pending_bytes: int = 0  # batch bytes pending (the leader bounds it)
    # No record is due before this (None: none pending): the `due_hint_ms` property.
    _due_hint_ms: int | None = None
    # Called (on the writer's thread) each time the hint goes from None to a time: the
    # broker's release duty then looks at this partition (until it finds None again)
    # instead of looking at every partition at every tick (dmq/broker/delay.py).
    on_pending: Callable[[], None] | None = None
    last_now_ms: int = 0  # the latest command time applied: which buckets are due soon
    # The store answers `export` for no position before this (files deleted since).
    compacted: Position = (0, 0)
    # Bucket start -> file size, of the buckets empty at the last snapshot (`_marked_at`):
    # deleted at the next one if still so (maybe_compact).
    _empty_marks: dict[int, int] = field(default_factory=dict)
    _marked_at: Position | None = None
    _exports: set[object] = field(default_factory=set)  # copies in progress: delete nothing
    # The current command's undo: bucket start -> its summary before (None: new), and
    # (pending_bytes, due_hint_ms, last_now_ms) before. Kept until the next command.
    _undo: dict[int, _Bucket | None] = field(default_factory=dict)
    _undo_totals: tuple[int, int | None, int] = (0, None, 0)

    @classmethod
    def open(cls, partition_directory: Path, applied: Position) -> DelayStore:
        store = cls(partition_directory / STORE_DIR)
        store.directory.mkdir(parents=True, exist_ok=True)
        for path in sorted(store.directory.glob("*.bucket")):
            store._recover(path, applied)
        store.compacted = _read_compacted(store.directory)
        store.due_hint_ms = store.next_due_ms
        return store

    # --- reading ---------------------------------------------------------------------------

    @property
    def due_hint_ms(self) -> int | None:
        """No record is due before this; None: none pending. Read by the event loop
        without the lock (one int): a lower bound, made exact by `due`, lowered by each
        schedule."""
        return self._due_hint_ms

    @due_hint_ms.setter
    def due_hint_ms(self, value: int | None) -> None:
        was = self._due_hint_ms
        self._due_hint_ms = value  # before the call: whoever it wakes must see it
        if was is None and value is not None and self.on_pending is not None:
            self.on_pending()

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
        (or -1 if none was due) and the count released; [1] or [0] for a cancel.

        A write the disk refuses (OSError, or the log's StorageWriteError) is undone, the
        store's files and memory as before the command (`undo`; the machine cuts the log
        back), and raised as StorageWriteError: the command is applied again later, whole.
        """
        self._undo = {}
        self._undo_totals = (self.pending_bytes, self.due_hint_ms, self.last_now_ms)
        try:
            return self._apply(position, command, log)
        except StorageWriteError:
            self.undo()
            raise
        except OSError as exc:
            self.undo()
            raise StorageWriteError(
                f"delay store {self.directory}: {exc}", no_space=exc.errno in NO_SPACE_ERRNOS
            ) from exc

    def _apply(self, position: Position, command: DelayCommand, log: PartitionLog) -> list[int]:
        staged: dict[int, list[bytes]] = {}
        self.last_now_ms = max(self.last_now_ms, command.now_ms)
        if command.kind == KIND_SCHEDULE:
            sids = []
            for i, (at, batch) in enumerate(command.scheduled):
                sid = schedule_id(position, i)
                self._stage(position, OP_SCHEDULED, sid, at, batch, staged)
                sids.append(sid)
            self._flush(staged)
            return sids
        if command.kind == KIND_CANCEL:
            ((sid, at),) = command.targets
            found = self._take(position, sid, at, staged)
            self._flush(staged)
            self._forget_hint_if_empty()
            return [1 if found is not None else 0]
        records: list[Record] = []
        for sid, at in command.targets:
            if at > command.now_ms:
                continue  # never before its time (a proposer's clock ran ahead: it waits)
            taken = self._take(position, sid, at, staged)
            if taken is not None:
                records.extend(decode_batch(taken).records)
        self._flush(staged)
        if not records:
            return [-1, 0]
        appended = log.append(encode_batch(records), assign_offsets=True)
        self._forget_hint_if_empty()
        return [appended.base_offset, len(records)]

    def _forget_hint_if_empty(self) -> None:
        """No record pending any more: the hint says so on every replica, followers too
        (only the leader's `due` recomputes it otherwise), so the release duty stops
        looking at this partition at its next tick. An undo puts the hint back."""
        if self._due_hint_ms is not None and not self.pending_count:
            self.due_hint_ms = None

    def undo(self) -> None:
        """Put the files and the memory back as before the last command's apply (its
        entries cut off: truncating needs no space). Idempotent."""
        for start, before in self._undo.items():
            path = self._path(start)
            if before is None:
                path.unlink(missing_ok=True)
                self._buckets.pop(start, None)
                continue
            with open(path, "r+b") as f:
                f.truncate(before.size)
            self._buckets[start] = before
        if self._undo:
            self.pending_bytes, self.due_hint_ms, self.last_now_ms = self._undo_totals
        self._undo = {}

    def _take(
        self, position: Position, sid: int, at: int, staged: dict[int, list[bytes]]
    ) -> bytes | None:
        """Remove a pending record; its batch, or None if it is not pending."""
        start = bucket_of(at)
        if start not in self._buckets:
            return None
        self._remember(start)
        entries = self._load(start)
        found = entries.get(sid)
        if found is None:
            return None
        batch = self._read(start, found[1], found[2])
        self._stage(position, OP_DONE, sid, at, b"", staged)
        del entries[sid]
        bucket = self._buckets[start]
        bucket.count -= 1
        self.pending_bytes -= found[2]
        return batch

    # --- snapshots, checkpoints and copies -------------------------------------------------

    def after_checkpoint(self) -> None:
        """The machine made its applied position durable: loaded buckets that are not due
        soon leave memory."""
        soon = self.last_now_ms + 2 * BUCKET_MS
        for start, bucket in self._buckets.items():
            if start > soon and bucket.entries is not None:  # loaded by a cancel: drop
                bucket.earliest_ms = min((e[0] for e in bucket.entries.values()), default=None)
                bucket.entries = None

    def maybe_compact(self, position: Position) -> bool:
        """At a snapshot at `position` (made durable): delete the bucket files that were
        empty at the previous snapshot and not written since, after storing that
        snapshot's position as `compacted`; then mark the buckets empty now. Deletes
        nothing while a copy is being read. Whether it deleted."""
        doomed = [
            s
            for s, size in self._empty_marks.items()
            if (b := self._buckets.get(s)) is not None and b.count == 0 and b.size == size
        ]
        acted = bool(doomed and not self._exports and self._marked_at is not None)
        if acted:
            assert self._marked_at is not None
            _write_compacted(self.directory, self._marked_at)
            self.compacted = self._marked_at
            for start in doomed:
                self._path(start).unlink(missing_ok=True)
                del self._buckets[start]
            fsync_directory(self.directory)
        self._empty_marks = {s: b.size for s, b in self._buckets.items() if b.count == 0}
        self._marked_at = position
        return acted

    def export(self, position: Position) -> Generator[bytes, None, None]:
        """The store as it was at `position` (at or before the last applied one, which
        the caller checks): every entry pending then, in bucket-file format, in chunks of
        about EXPORT_CHUNK_BYTES, then the end frame with their count. Call under the
        writer's lock; the stream may be read without it (no file is deleted meanwhile:
        close it when done)."""
        if position < self.compacted:
            raise DelayCopyError(
                f"the delay store was compacted to {self.compacted}, past {position}"
            )
        token = object()
        self._exports.add(token)
        return self._export(position, sorted(self._buckets), token)

    def _export(
        self, position: Position, starts: list[int], token: object
    ) -> Generator[bytes, None, None]:
        try:
            count = 0
            out: list[bytes] = []
            size = 0
            for start in starts:
                for entry in _entries_pending_at(self._path(start), position):
                    out.append(entry)
                    size += len(entry)
                    count += 1
                    if size >= EXPORT_CHUNK_BYTES:
                        yield b"".join(out)
                        out, size = [], 0
            out.append(_COPY_END.pack(0, 0, count))
            yield b"".join(out)
        finally:
            self._exports.discard(token)

    def restore_stream(
        self, chunks: Iterable[bytes], position: Position, expected_count: int
    ) -> None:
        """Replace the store by an `export` stream of another replica's store at
        `position` (DelayCopyError if it is damaged, cut short or counts other than
        expected_count; the store is then unchanged)."""
        tmp = self.directory.with_name(STORE_DIR + ".restore")
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir()
        fresh = DelayStore(tmp)
        try:
            count = _write_stream(fresh, chunks, position)
            if count != expected_count:
                raise DelayCopyError(f"copied {count} delayed records, expected {expected_count}")
            _write_compacted(tmp, position)
            fresh.compacted = position
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        self._swap_in(fresh)

    def restore(self, doc: str | None, position: Position) -> None:
        """Replace the store by a version-2 snapshot's pending records (JSON), written at
        `position`: snapshots written before the store was copied (`restore_stream`)."""
        tmp = self.directory.with_name(STORE_DIR + ".restore")
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir()
        fresh = DelayStore(tmp)
        staged: dict[int, list[bytes]] = {}
        for sid, at, text in json.loads(doc) if doc else []:
            fresh._stage(position, OP_SCHEDULED, int(sid), int(at), base64.b64decode(text), staged)
        fresh._flush(staged)
        _write_compacted(tmp, position)
        fresh.compacted = position
        self._swap_in(fresh)

    def _swap_in(self, fresh: DelayStore) -> None:
        shutil.rmtree(self.directory, ignore_errors=True)
        os.replace(fresh.directory, self.directory)
        fsync_directory(self.directory.parent)
        self._buckets, self.pending_bytes = fresh._buckets, fresh.pending_bytes
        self.compacted = fresh.compacted
        self._empty_marks, self._marked_at, self._undo = {}, None, {}
        self.due_hint_ms = self.next_due_ms

    # --- files -----------------------------------------------------------------------------

    def _path(self, start: int) -> Path:
        return self.directory / f"{start:020d}.bucket"

    def _remember(self, start: int) -> None:
        """Keep the bucket's summary as before the current command (for `undo`)."""
        if start not in self._undo:
            bucket = self._buckets.get(start)
            self._undo[start] = None if bucket is None else bucket.copy()

    def _stage(
        self,
        position: Position,
        op: bytes,
        sid: int,
        at: int,
        batch: bytes,
        staged: dict[int, list[bytes]],
    ) -> None:
        """An entry into memory and into `staged` (written by `_flush`)."""
        start = bucket_of(at)
        self._remember(start)
        bucket = self._buckets.get(start)
        if bucket is None:  # a new file: its entries in memory only if due soon
            soon = start <= self.last_now_ms + 2 * BUCKET_MS
            bucket = self._buckets[start] = _Bucket(entries={} if soon else None)
        body = _ENTRY_BODY.pack(op, position[0], position[1], sid, at) + batch
        entry = _ENTRY_HEAD.pack(len(body), crc32c.crc32c(body)) + body
        staged.setdefault(start, []).append(entry)
        batch_pos = bucket.size + _ENTRY_HEAD.size + _ENTRY_BODY.size
        bucket.size += len(entry)
        if op == OP_SCHEDULED:
            bucket.count += 1
            self.pending_bytes += len(batch)
            bucket.earliest_ms = at if bucket.earliest_ms is None else min(bucket.earliest_ms, at)
            self.due_hint_ms = at if self.due_hint_ms is None else min(self.due_hint_ms, at)
            if bucket.entries is not None:
                bucket.entries[sid] = (at, batch_pos, len(batch))

    def _flush(self, staged: dict[int, list[bytes]]) -> None:
        """Append the staged entries, one write per bucket file, and fsync them (before the
        machine's checkpoint record)."""
        for start, parts in staged.items():
            with open(self._path(start), "ab") as f:
                f.write(b"".join(parts))
                f.flush()
                os.fsync(f.fileno())
        if staged:
            fsync_directory(self.directory)

    def _count_copied(self, start: int, at: int, size: int, batch_bytes: int) -> None:
        """A copied pending entry of `size` bytes, written at the end of its file."""
        bucket = self._buckets.get(start)
        if bucket is None:
            bucket = self._buckets[start] = _Bucket(earliest_ms=at)
        bucket.count += 1
        bucket.size += size
        if at < bucket.earliest_ms:  # type: ignore[operator]
            bucket.earliest_ms = at
        self.pending_bytes += batch_bytes

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
        """Cut a torn tail and every entry past `applied`; count what is pending. The file
        is mapped, not read: a reopen with a million pending allocates per done record
        (the sids released or cancelled), not per pending one."""
        try:
            start = int(path.stem)
        except ValueError:
            return
        with open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            good, count, earliest, batch_bytes = (0, 0, None, 0)
            if size:
                with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as data:
                    good, count, earliest, batch_bytes = _summary(data, applied)
        if good < size:
            with open(path, "r+b") as f:
                f.truncate(good)
                f.flush()
                os.fsync(f.fileno())
        self._buckets[start] = _Bucket(count=count, earliest_ms=earliest, entries=None, size=good)
        self.pending_bytes += batch_bytes


def _summary(data: mmap.mmap, applied: Position) -> tuple[int, int, int | None, int]:
    """(end of the last whole entry at or before `applied`, pending count, earliest
    pending time, pending batch bytes) of a bucket file: done sids first, then the rest."""
    good = 0
    done: set[int] = set()
    for end, op, position, sid, _at, _pos, _length in _scan(data):
        if position > applied:
            break
        good = end
        if op == OP_DONE:
            done.add(sid)
    count, earliest, batch_bytes = 0, None, 0
    for end, op, _position, sid, at, _pos, length in _scan(data):
        if end > good:
            break
        if op == OP_SCHEDULED and sid not in done:
            count += 1
            batch_bytes += length
            earliest = at if earliest is None else min(earliest, at)
    return good, count, earliest, batch_bytes


def _scan(data: bytes | mmap.mmap) -> Iterator[tuple[int, bytes, Position, int, int, int, int]]:
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


def _entries_pending_at(path: Path, position: Position) -> Iterator[bytes]:
    """The whole entries (head and body) of a bucket file's records pending at
    `position`, in file order: two passes over a map of the file, the done sids first
    (framing only: the second pass checks each entry's CRC, and stops at a bad one)."""
    try:
        f = open(path, "rb")  # noqa: SIM115 - closed below, after the map
    except FileNotFoundError as exc:
        raise DelayCopyError(f"{path} went away during a copy") from exc
    with f:
        if os.fstat(f.fileno()).st_size == 0:
            return
        with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as data:
            done = _done_sids(data, position)
            start = 0
            for end, op, at_position, sid, _at, _pos, _len in _scan(data):
                if op == OP_SCHEDULED and at_position <= position and sid not in done:
                    yield data[start:end]
                start = end


def _done_sids(data: mmap.mmap, position: Position) -> set[int]:
    """The sids of the D entries at or before `position` (framing only, no CRC)."""
    done: set[int] = set()
    pos, size, head, body = 0, len(data), _ENTRY_HEAD.size, _ENTRY_BODY.size
    op_done = OP_DONE[0]
    while pos + head <= size:
        (length,) = struct.unpack_from("<I", data, pos)
        end = pos + head + length
        if length < body or end > size:
            break
        if data[pos + head] == op_done:
            _op, index, k, sid, _at = _ENTRY_BODY.unpack_from(data, pos + head)
            if (index, k) <= position:
                done.add(sid)
        pos = end
    return done


def _write_stream(fresh: DelayStore, chunks: Iterable[bytes], position: Position) -> int:
    """Write an export stream into `fresh` (an empty store); the count its end frame
    gives, checked against the entries written. Entries come bucket by bucket: each run
    of one bucket's entries in a chunk is one write."""
    buffer = bytearray()
    count = 0
    files: dict[int, BinaryIO] = {}
    ended: int | None = None
    head, body_size = _ENTRY_HEAD.size, _ENTRY_BODY.size
    try:
        for chunk in chunks:
            if ended is not None:
                raise DelayCopyError("bytes after the end of a delay store copy")
            buffer += chunk
            view = memoryview(buffer)
            pos, run_start, run_bucket = 0, 0, -1
            try:
                while len(buffer) - pos >= head:
                    length, crc = _ENTRY_HEAD.unpack_from(view, pos)
                    if length == 0:  # the end frame
                        if len(buffer) - pos < _COPY_END.size:
                            break
                        ended = _COPY_END.unpack_from(view, pos)[2]
                        _flush_run(fresh, files, run_bucket, view[run_start:pos])
                        run_start = pos = pos + _COPY_END.size
                        break
                    end = pos + head + length
                    if end > len(buffer):
                        break
                    if length < body_size or crc32c.crc32c(view[pos + head : end]) != crc:
                        raise DelayCopyError("a copied delay entry fails its CRC or length")
                    op, index, k, sid, at = _ENTRY_BODY.unpack_from(view, pos + head)
                    if op != OP_SCHEDULED or (index, k) > position:
                        raise DelayCopyError(
                            f"a copied entry {op!r} at {(index, k)} past {position}"
                        )
                    start = at - at % BUCKET_MS
                    if start != run_bucket:
                        _flush_run(fresh, files, run_bucket, view[run_start:pos])
                        run_start, run_bucket = pos, start
                    fresh._count_copied(start, at, end - pos, length - body_size)
                    count += 1
                    pos = end
                if ended is None:
                    _flush_run(fresh, files, run_bucket, view[run_start:pos])
            finally:
                view.release()
            del buffer[:pos]
            if ended is not None:
                break
    finally:
        for f in files.values():
            _close_synced(f)
    if ended is None or buffer:
        raise DelayCopyError("a delay store copy cut short, or with bytes after its end")
    if ended != count:
        raise DelayCopyError(f"a delay store copy of {count} entries says {ended}")
    fsync_directory(fresh.directory)
    return count


def _flush_run(fresh: DelayStore, files: dict[int, BinaryIO], start: int, run: memoryview) -> None:
    """Append one bucket's run of copied entries to its file (kept open until the end:
    a bucket's entries may come in several chunks)."""
    if not len(run):
        return
    f = files.get(start)
    if f is None:
        for other in list(files):  # one file open at a time: buckets come in order
            _close_synced(files.pop(other))
        f = files[start] = open(fresh._path(start), "ab")  # noqa: SIM115
    f.write(run)


def _close_synced(f: BinaryIO) -> None:
    f.flush()
    os.fsync(f.fileno())
    f.close()


def _read_compacted(directory: Path) -> Position:
    try:
        index, k = (directory / COMPACTED_FILE).read_text().split()
    except FileNotFoundError:
        return (0, 0)
    return int(index), int(k)


def _write_compacted(directory: Path, position: Position) -> None:
    write_durably(directory / COMPACTED_FILE, f"{position[0]} {position[1]}\n".encode())
    fsync_directory(directory)
