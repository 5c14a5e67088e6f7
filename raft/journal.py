"""A durable, memory-bounded Raft journal for pysyncobj, synced once per tick.

pysyncobj's FileJournal writes through an mmap that is never synced, writes term and vote
with a rename that is never synced, and keeps every entry in memory until log compaction.
`DurableJournal` keeps pysyncobj's Journal interface (a list of (command, idx, term) with
add / deleteEntriesFrom / deleteEntriesTo / clear) but:

- appends go to a write buffer, then to the file with one write(2), and are made durable by
  `sync()`, which RaftNode calls once per tick for every journal that changed, *before* the
  tick's outgoing messages are released (see raft/README.md, "Durability"). One fdatasync
  covers every entry a group appended in that tick;
- term and vote are written to a small double-slotted meta file by the same `sync()`, so a
  vote reply never leaves before the vote is on disk; the commit index rides along, at most
  once a second (it is only a hint for a faster restart);
- only indexes stay in memory (16 bytes per entry) plus a bounded cache of recent commands;
  older commands are read back from the file, and slices are lazy views.

Threading: one owner, RaftNode's tick thread; `sync()` may run on a flush thread while the
tick thread waits for it. Nothing here takes a lock.

File format (`journal`), little-endian::

    header   8s magic b"DMQRJNL1" | u32 version | u32 seed                (16 bytes)
    record   u32 body_len | u32 crc32c(body, seed) | body = u64 idx | u64 term | command

Entries are consecutive: record k holds index first_idx + k. Recovery reads records until
the first one that is cut short or fails its CRC, and truncates the file there (a torn
write at the tail); a record whose index breaks the sequence is corruption and stops the
node (JournalCorrupt).

Version 2 (this code) seeds every record's CRC-32C with the file's `seed`, a random
number drawn when the file is written from its start; version 1 files (seed 0, the
plain CRC) are still read and appended to until their first compaction. The seed is what
lets compaction recycle a file (`_rewrite_from`): the tail left after a compaction is
written into `journal.spare`, the file the compaction before it retired, over its old
records, and the two swap names. Writes there overwrite blocks the file system has
allocated already, so their fdatasync commits no block allocation or file size, only
data (half the time of an append's: bench/README.md, "Recycled journal files"); the old
records beyond the new end carry another seed, so their CRCs fail and recovery stops at
the first of them as at a torn write. Version 1 code refuses a version 2 file.

Meta file (`journal.meta`): two 512-byte slots, each u32 len | u32 crc32c | u64 seq | JSON
{"term", "voted_for", "commit_index"}; writes alternate slots and recovery takes the valid
slot with the higher seq, so a torn meta write never loses both.
"""

from __future__ import annotations

import bisect
import contextlib
import errno
import json
import logging
import os
import struct
import time
from array import array
from collections import OrderedDict
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, Literal, overload

import crc32c
import pysyncobj.syncobj as _syncobj_module
from pysyncobj.journal import Journal

from raft.errors import RaftError, too_new

logger = logging.getLogger(__name__)

Entry = tuple[bytes, int, int]  # (command, idx, term), as pysyncobj stores them

MAGIC = b"DMQRJNL1"
FORMAT_VERSION = 2
READABLE_VERSIONS = frozenset({1, 2})  # 1: seed 0 (the plain CRC-32C), never recycled
_FILE_HEADER = struct.Struct("<8sII")
HEADER_BYTES = _FILE_HEADER.size  # 16
_RECORD_HEADER = struct.Struct("<II")  # body_len, crc32c(body)
_BODY_HEADER = struct.Struct("<QQ")  # idx, term
RECORD_OVERHEAD_BYTES = _RECORD_HEADER.size + _BODY_HEADER.size  # 24
# One command may not exceed this: it bounds what recovery and reads allocate per record.
COMMAND_BYTES_MAX = 256 * 1024 * 1024
# Reads of old entries fetch up to this many bytes per pread when scanning forward.
READ_AHEAD_BYTES = 1024 * 1024

_META_SLOT_BYTES = 512
_META_HEADER = struct.Struct("<IIQ")  # len, crc32c(json), seq
# The commit index is a restart hint, not safety state: persist it at most this often.
COMMIT_INDEX_PERSIST_INTERVAL_S = 1.0
# Durable pages older than the command cache leave the page cache once this many bytes of
# them have gathered (one posix_fadvise per drop; see DurableJournal._drop_pages).
PAGE_DROP_BYTES_MIN = 256 * 1024
PAGE_BYTES = os.sysconf("SC_PAGE_SIZE")
_ZEROS = memoryview(bytes(PAGE_BYTES))

JOURNAL_FILE = "journal"
META_FILE = "journal.meta"
# The file a compaction retired, reused by the next one (_rewrite_from), and the second
# name the current journal takes for the moment of the swap.
SPARE_FILE = "journal.spare"
RETIRING_FILE = "journal.retiring"
# A spare longer than this is cut to it before reuse: what a long run between two
# compactions wrote is not kept on disk twice (RaftConfig.log_compaction_bytes keeps
# journals near or under it).
SPARE_BYTES_MAX = 512 * 1024 * 1024
DURABLE_TRACE_FILE = "journal.durable"


class JournalTooNew(RaftError):
    """The journal's header names a format newer than this code reads: nothing was read
    or changed (dmq/data_formats.py refuses it before the broker opens anything)."""


class JournalCorrupt(RaftError):
    """The journal breaks an invariant that a torn write cannot explain; the node must stop."""


class JournalWriteFailed(RaftError):
    """A write or sync of the journal failed (a full disk, an I/O error) and was undone.

    The file holds exactly the records it held before (a partial write is cut back to the
    last whole record) and the unwritten records stay in memory: sync() tries them again.
    Nothing the failed sync was to cover may be acknowledged: RaftNode stalls the group
    (raft/README.md, "A full disk"). `no_space` tells ENOSPC (EDQUOT, EFBIG) from EIO.
    """

    def __init__(self, message: str, *, no_space: bool) -> None:
        super().__init__(message)
        self.no_space = no_space


NO_SPACE_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EFBIG})


def _invariant(condition: bool, message: str) -> None:
    # Not `assert`: python -O must not strip the checks that stop a broken node.
    if not condition:
        raise JournalCorrupt(message)


def _new_seed(other: int) -> int:
    """A random CRC seed for a file written from its start: never 0 (version 1's) nor
    `other` (the seed of the records a recycled file still holds)."""
    while True:
        seed = int.from_bytes(os.urandom(4), "little")
        if seed not in (0, other):
            return seed


def _record_head(command: bytes, idx: int, term: int, seed: int) -> bytes:
    """What precedes `command` in its record: length, CRC-32C under `seed`, idx, term."""
    head = _BODY_HEADER.pack(idx, term)
    crc = crc32c.crc32c(command, crc32c.crc32c(head, seed))
    return _RECORD_HEADER.pack(len(head) + len(command), crc) + head


def _fsync_directory(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class DurableJournal(Journal):  # type: ignore[misc]  # pysyncobj is untyped
    """pysyncobj's Journal, made durable per tick and bounded in memory (module docstring)."""

    def __init__(
        self,
        directory: Path,
        *,
        durability: Literal["fsync", "none"] = "fsync",
        cache_bytes_max: int = 8 * 1024 * 1024,
        write_buffer_bytes_max: int = 1024 * 1024,
        snapshot_path: Path | None = None,
        durable_trace: bool = False,
    ) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        self.directory = directory
        self.path = directory / JOURNAL_FILE
        self._durability = durability
        self._cache_bytes_max = cache_bytes_max
        self._write_buffer_bytes_max = write_buffer_bytes_max
        self._snapshot_path = snapshot_path
        # Test hook for the power-loss test: after each fdatasync, append the durable length.
        self._trace_fd = (
            os.open(directory / DURABLE_TRACE_FILE, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
            if durable_trace
            else None
        )
        # Invariant: entry k (0-based position) has index _first_idx + k, term _terms[k], and
        # its record starts at file offset _offsets[k]; records are contiguous up to _end.
        self._first_idx = 0
        self._terms = array("q")
        self._offsets = array("q")
        self._end = HEADER_BYTES
        # Invariant: HEADER_BYTES <= _durable <= _written <= _end; bytes [_written, _end)
        # are in _pending, not yet in the file.
        self._written = HEADER_BYTES
        self._durable = HEADER_BYTES
        self._pending = bytearray()
        self._dirty = False  # a change since the last fdatasync (append, truncate, clear)
        self._cache: OrderedDict[int, bytes] = OrderedDict()  # idx -> command, recent only
        # File bytes below this offset were handed back to the OS (_drop_pages).
        self._dropped_to = 0
        self.dropped_bytes = 0  # journal bytes dropped from the page cache (for tests)
        self._cache_bytes = 0
        self._epoch = 0  # bumped by every deletion: views taken before it are stale
        self._first_entry: tuple[int, Entry] | None = None  # (epoch, entry 0), entry_at
        self._seed = 0  # every record's CRC-32C starts from it (module docstring)
        self._settle_swap()
        # The retired file the next compaction writes into, and the journal file's own
        # length where it passed what was written (a recycled file's old records): both
        # only for disk_bytes, a metric.
        self.spare_bytes = _length_of(directory / SPARE_FILE)
        self._fd = self._open_and_recover()
        self._file_bytes = os.fstat(self._fd).st_size
        self._meta = _MetaFile(directory / META_FILE)
        self._term, self._voted_for, self._commit_index = self._meta.load()
        self._vote_dirty = False
        self._commit_dirty = False
        self._commit_persisted_at = 0.0
        self.syncs = 0  # fdatasync calls on the journal file, for tests and metrics
        # A write that failed in add() (raised by the next sync) and how many writes or
        # syncs failed so far (a metric).
        self._write_error: JournalWriteFailed | None = None
        self.write_failures = 0

    # --- recovery -----------------------------------------------------------------------

    def _open_and_recover(self) -> int:
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        size = os.fstat(fd).st_size
        if size < HEADER_BYTES:
            # New file, or one cut inside its header by a crash during creation.
            os.ftruncate(fd, 0)
            self._seed = _new_seed(0)
            os.pwrite(fd, _FILE_HEADER.pack(MAGIC, FORMAT_VERSION, self._seed), 0)
            os.fdatasync(fd)
            _fsync_directory(self.directory)
            return fd
        magic, version, seed = _FILE_HEADER.unpack(os.pread(fd, HEADER_BYTES, 0))
        _invariant(magic == MAGIC, f"{self.path}: not a dmq raft journal")
        if version > FORMAT_VERSION:  # not corrupt: written by a newer dmq
            os.close(fd)
            raise JournalTooNew(too_new(f"{self.path}: journal", version, FORMAT_VERSION))
        _invariant(version in READABLE_VERSIONS, f"{self.path}: unknown format version {version}")
        _invariant(version == 2 or seed == 0, f"{self.path}: version 1 with a seed")
        self._seed = seed
        self._end = HEADER_BYTES
        for entry_offset, entry_end, idx, term in self._scan(fd, size):
            if self._offsets:
                _invariant(
                    idx == self._first_idx + len(self._offsets),
                    f"{self.path}: index {idx} at offset {entry_offset} breaks the sequence",
                )
            else:
                self._first_idx = idx
            self._offsets.append(entry_offset)
            self._terms.append(term)
            self._end = entry_end
        if self._end < size and not self._only_padding(fd, size):
            # A torn tail (the crash cut the last write short), or a recycled file's old
            # records (another seed). Dropped for good either way: past a torn write this
            # file's own unsynced records may follow, and the next append must not leave
            # one where recovery could read it after a record of the same length.
            os.ftruncate(fd, self._end)
            os.fdatasync(fd)
        self._written = self._durable = self._end
        return fd

    def _only_padding(self, fd: int, size: int) -> bool:
        """Whether the bytes after the last record are only a write's zero padding (less
        than a page of zeros to the end of the file): then nothing follows that a later
        recovery could misread, and the open need not truncate and sync the file."""
        return size - self._end < PAGE_BYTES and not os.pread(
            fd, size - self._end, self._end
        ).strip(b"\0")

    def _scan(self, fd: int, size: int) -> Iterator[tuple[int, int, int, int]]:
        """(offset, end, idx, term) of every valid record, in order, up to the first bad one."""
        offset = HEADER_BYTES
        while offset + RECORD_OVERHEAD_BYTES <= size:
            body_len, crc = _RECORD_HEADER.unpack(os.pread(fd, _RECORD_HEADER.size, offset))
            body_start = offset + _RECORD_HEADER.size
            if body_len < _BODY_HEADER.size or body_len > COMMAND_BYTES_MAX + _BODY_HEADER.size:
                return
            if body_start + body_len > size:
                return
            body = os.pread(fd, body_len, body_start)
            if len(body) != body_len or crc32c.crc32c(body, self._seed) != crc:
                return
            idx, term = _BODY_HEADER.unpack_from(body)
            yield offset, body_start + body_len, idx, term
            offset = body_start + body_len

    # --- pysyncobj's Journal interface ----------------------------------------------------

    def add(self, command: bytes, idx: int, term: int) -> None:
        if not isinstance(command, bytes):
            command = bytes(command)
        _invariant(len(command) <= COMMAND_BYTES_MAX, f"command of {len(command)} bytes")
        if self._offsets:
            expected = self._first_idx + len(self._offsets)
            _invariant(idx == expected, f"append of index {idx}, expected {expected}")
        else:
            self._first_idx = idx
        self._offsets.append(self._end)
        self._terms.append(term)
        self._pending += _record_head(command, idx, term, self._seed)
        self._pending += command
        self._end += RECORD_OVERHEAD_BYTES + len(command)
        self._dirty = True
        self._cache_put(idx, command)
        if len(self._pending) >= self._write_buffer_bytes_max and self._write_error is None:
            try:
                self._write_pending()
            except JournalWriteFailed as error:
                # Inside pysyncobj's message handling: kept in memory, and raised by the
                # round's sync(), which stalls the group before anything is acknowledged.
                self._write_error = error

    def clear(self) -> None:
        # pysyncobj clears the journal right after installing or loading a snapshot: the
        # snapshot must be durable before the entries it replaces may disappear.
        self._sync_snapshot_file()
        self._truncate_to(0)
        self._first_idx = 0

    def deleteEntriesFrom(self, entryFrom: int) -> None:  # noqa: N802 - pysyncobj's name
        """Drop entries at positions >= entryFrom (a follower's conflicting suffix)."""
        if entryFrom < len(self._offsets):
            self._truncate_to(max(entryFrom, 0))

    def deleteEntriesTo(self, entryTo: int) -> None:  # noqa: N802 - pysyncobj's name
        """Drop entries at positions < entryTo, after a snapshot covering them (compaction)."""
        if entryTo <= 0:
            return
        entryTo = min(entryTo, len(self._offsets))
        cut = self._offsets[entryTo] if entryTo < len(self._offsets) else self._end
        try:
            self._sync_snapshot_file()
            self._write_pending()
            self._rewrite_from(cut)
        except (OSError, JournalWriteFailed) as exc:
            # A full disk: keep the entries (the journal stays longer than it needs to be,
            # which is safe) and let pysyncobj's next log compaction try again.
            # The spare's blocks are given back to the full disk; a compaction after this
            # one writes a new file again.
            self.write_failures += 1
            (self.directory / SPARE_FILE).unlink(missing_ok=True)
            self.spare_bytes = 0
            logger.warning("journal compaction of %s put off: %s", self.path, exc)
            return
        shift = cut - HEADER_BYTES
        self._offsets = array("q", (offset - shift for offset in self._offsets[entryTo:]))
        self._terms = self._terms[entryTo:]
        self._first_idx += entryTo
        self._end -= shift
        self._written = self._durable = self._end
        while self._cache and next(iter(self._cache)) < self._first_idx:
            _, command = self._cache.popitem(last=False)
            self._cache_bytes -= len(command)
        self._epoch += 1

    def finish_compaction(self, previous: tuple[int, int], last: tuple[int, int]) -> int:
        """Drop the entries before `previous` if the journal holds both entries a snapshot
        ends with ((index, term) each); the number of entries dropped.

        pysyncobj writes a snapshot in one tick and drops the journal entries it covers
        (deleteEntriesTo) in the next. A crash between the two leaves a new snapshot beside
        a journal that still starts before it. At start, pysyncobj's `__loadDumpFile`
        keeps the journal only if its first two entries are the snapshot's last two, and
        otherwise clears it: every entry after the snapshot, synced and acknowledged,
        would go with it (jepsen/README.md, "Real bugs found": an acknowledged write lost
        at a whole-cluster power cut). Called before pysyncobj loads the snapshot, this
        finishes the compaction instead. Both entries must be here with the snapshot's
        terms: by Raft's log matching, everything after them then continues the history
        the snapshot ends, so it is kept. Otherwise nothing is dropped, and pysyncobj's
        clear is right (the journal holds nothing past the snapshot, or another history).
        """
        (previous_idx, previous_term), (last_idx, last_term) = previous, last
        if self.term_at(previous_idx) != previous_term or self.term_at(last_idx) != last_term:
            return 0
        position = previous_idx - self._first_idx
        if position > 0:
            self.deleteEntriesTo(position)
            self.sync()
        return max(position, 0)

    @overload
    def __getitem__(self, item: int) -> Entry: ...
    @overload
    def __getitem__(self, item: slice) -> JournalView: ...
    def __getitem__(self, item: int | slice) -> Entry | JournalView:
        count = len(self._offsets)
        if isinstance(item, slice):
            start, stop, step = item.indices(count)
            _invariant(step == 1, "journal slices have step 1")
            return JournalView(self, start, max(start, stop))
        position = item + count if item < 0 else item
        if not 0 <= position < count:
            raise IndexError(item)
        return self.entry_at(position)

    def __len__(self) -> int:
        return len(self._offsets)

    def _destroy(self) -> None:
        self.close()

    def setRaftCommitIndex(self, raftCommitIndex: int) -> None:  # noqa: N802, N803
        if raftCommitIndex != self._commit_index:
            self._commit_index = raftCommitIndex
            self._commit_dirty = True

    def getRaftCommitIndex(self) -> int:  # noqa: N802
        return self._commit_index

    def setCurrentTerm(self, term: int, votedForNodeId: Any) -> None:  # noqa: N802, N803
        # Durable at the next sync(), which runs before any message of this tick leaves.
        self._term = term
        self._voted_for = votedForNodeId
        self._vote_dirty = True

    def getCurrentTerm(self) -> int:  # noqa: N802
        return self._term

    def getVotedForNodeId(self) -> Any:  # noqa: N802
        return self._voted_for

    def onOneSecondTimer(self) -> None:  # noqa: N802
        pass  # the commit index is persisted by sync(), at most once a second

    def flush(self) -> None:
        self.sync()

    # --- durability (called by RaftNode, once per tick) -----------------------------------

    def needs_sync(self) -> bool:
        """True if sync() has work: entries, a truncation or a vote not yet durable, or a
        commit index due to be persisted."""
        return self._dirty or self._vote_dirty or self._commit_due()

    def _commit_due(self) -> bool:
        return self._commit_dirty and (
            time.monotonic() - self._commit_persisted_at >= COMMIT_INDEX_PERSIST_INTERVAL_S
        )

    def sync_waits_for_disk(self) -> bool:
        """True if sync() has work and will wait for the disk (durability "fsync")."""
        return self._durability == "fsync" and self.needs_sync()

    def is_synced(self) -> bool:
        """True if every entry, truncation, term and vote so far went through sync()."""
        return not (self._dirty or self._vote_dirty or self._pending)

    def sync(self, *, final: bool = False) -> None:
        """Make every change so far durable (or, with durability "none", hand it to the OS).

        Entries first, then the meta file: a persisted commit index never points past entries
        that are on disk. The meta file is written (and fdatasync'ed) for a new term or vote,
        and for the commit index only once COMMIT_INDEX_PERSIST_INTERVAL_S has passed since
        it was last written, or when `final` (close): the index moves in nearly every round
        that appends, and writing it each time was a second fdatasync per round (#22).
        """
        self._write_error = None
        self._write_pending()
        if self._dirty:
            if self._durability == "fsync":
                try:
                    os.fdatasync(self._fd)
                except OSError as exc:
                    # Written but not known durable. The page cache may still hold the
                    # bytes (a retried fdatasync that succeeds makes them durable on Linux
                    # filesystems that keep dirty pages, e.g. ext4 after ENOSPC); on an
                    # EIO the tail is rewritten from memory before the next sync.
                    self._rewind_unsynced()
                    self.write_failures += 1
                    raise JournalWriteFailed(
                        f"fdatasync of {self.path} failed: {exc}",
                        no_space=exc.errno in NO_SPACE_ERRNOS,
                    ) from exc
                self.syncs += 1
                self._durable = self._written
                if self._trace_fd is not None:
                    os.write(self._trace_fd, b"%d\n" % self._durable)
                self._drop_pages()
            self._dirty = False
        if self._vote_dirty or (self._commit_dirty and (final or self._commit_due())):
            try:
                self._meta.store(
                    self._term, self._voted_for, self._commit_index, self._durability == "fsync"
                )
            except OSError as exc:  # the other slot still holds the last durable vote
                self.write_failures += 1
                raise JournalWriteFailed(
                    f"writing {self._meta.path} failed: {exc}",
                    no_space=exc.errno in NO_SPACE_ERRNOS,
                ) from exc
            self._vote_dirty = self._commit_dirty = False
            self._commit_persisted_at = time.monotonic()

    def _drop_pages(self) -> None:
        """Hand the page cache's copy of old durable records back to the OS.

        A journal is written once and read back only when an entry has left the command
        cache (a lagging follower, a restart), so its pages are better spent on the
        partition logs' reads. Freed at once, they are also the pages the next write takes,
        where new page-cache pages cost several times more on a VM whose free memory is
        returned to the host: the kernel's copy into fresh pages was half of a follower's
        CPU (raft/README.md, "Durability contract"; PostgreSQL drops WAL pages likewise).
        Only durable bytes older than the oldest cached entry go, whole pages only (the
        kernel keeps a partial page), so neither the next write nor a cached read touches
        the disk.
        """
        limit = self._durable
        if self._cache:
            oldest = next(iter(self._cache)) - self._first_idx
            if 0 <= oldest < len(self._offsets):
                limit = min(limit, self._offsets[oldest])
        start = max(self._dropped_to, HEADER_BYTES) // PAGE_BYTES * PAGE_BYTES
        end = limit // PAGE_BYTES * PAGE_BYTES
        if end - start < PAGE_DROP_BYTES_MIN:
            return
        try:
            os.posix_fadvise(self._fd, start, end - start, os.POSIX_FADV_DONTNEED)
        except OSError as exc:  # advice only: the records are durable whatever it says
            logger.debug("dropping pages of %s: %s", self.path, exc)
            return
        self.dropped_bytes += end - start
        self._dropped_to = end

    def close(self) -> None:
        if self._fd < 0:
            return
        try:
            self.sync(final=True)
        except JournalWriteFailed as error:
            # A full disk at close (a stalled group removed, or the node stopping): the
            # records not written were never acknowledged by this node; close anyway.
            logger.warning("closing %s with records not on disk: %s", self.path, error)
        os.close(self._fd)
        self._fd = -1
        self._meta.close()
        if self._trace_fd is not None:
            os.close(self._trace_fd)
            self._trace_fd = None

    # --- reads ------------------------------------------------------------------------------

    @property
    def epoch(self) -> int:
        return self._epoch

    @property
    def size_bytes(self) -> int:
        """Bytes of the journal's records, those not yet written included (a metric)."""
        return self._end

    @property
    def disk_bytes(self) -> int:
        """Bytes the journal takes on disk (a metric): its file, whose length passes its
        records by the last write's zero padding and, once recycled, by the old records
        after them; and the spare, the retired file the next compaction writes into."""
        return max(self._written, self._file_bytes) + self.spare_bytes

    @property
    def memory_bytes(self) -> int:
        """Bytes this journal holds in memory: indexes, cache and write buffer."""
        index_bytes = (len(self._offsets) + len(self._terms)) * 8
        return index_bytes + self._cache_bytes + len(self._pending)

    @property
    def first_index(self) -> int:
        """The index of the first entry the journal holds (0 if it holds none); it moves
        at each compaction."""
        return self._first_idx if self._offsets else 0

    @property
    def last_index(self) -> int:
        """The index of the last entry (0 if there is none)."""
        return self._first_idx + len(self._offsets) - 1 if self._offsets else 0

    def term_at(self, idx: int) -> int | None:
        """The term of entry `idx`, or None if the journal does not hold it."""
        position = idx - self._first_idx
        if self._offsets and 0 <= position < len(self._terms):
            return self._terms[position]
        return None

    def entry_at(self, position: int) -> Entry:
        idx = self._first_idx + position
        command = self._cache.get(idx)
        if command is not None:
            return command, idx, self._terms[position]
        if position == 0:
            # pysyncobj reads log[0] for the first index three times per append_entries it
            # sends; that entry is old, out of the cache, its pages dropped (_drop_pages).
            # Kept until the next deletion changes the first entry (the epoch).
            if self._first_entry is None or self._first_entry[0] != self._epoch:
                self._first_entry = (self._epoch, self.read_range(0, 1)[0])
            return self._first_entry[1]
        return self.read_range(position, position + 1)[0]

    def read_range(self, start: int, stop: int) -> list[Entry]:
        """Entries at positions [start, stop): from the cache where it holds them (the
        recent entries a leader sends to its followers), the rest from the file with as
        few preads as READ_AHEAD allows."""
        entries: list[Entry] = []
        cache = self._cache
        first_idx = self._first_idx
        position = start
        while position < stop:
            command = cache.get(first_idx + position)
            if command is not None:
                entries.append((command, first_idx + position, self._terms[position]))
                position += 1
                continue
            first_offset = self._offsets[position]
            last = position
            while (
                last + 1 < stop
                and self._offsets[last + 1] - first_offset < READ_AHEAD_BYTES
                and first_idx + last + 1 not in cache
            ):
                last += 1
            end = self._offsets[last + 1] if last + 1 < len(self._offsets) else self._end
            data = memoryview(self._read_bytes(first_offset, end))
            for k in range(position, last + 1):
                entries.append(self._parse_record(data, self._offsets[k] - first_offset, k))
            position = last + 1
        return entries

    def _read_bytes(self, start: int, end: int) -> bytes:
        if start >= self._written:
            return bytes(self._pending[start - self._written : end - self._written])
        if end <= self._written:
            data = os.pread(self._fd, end - start, start)
            _invariant(len(data) == end - start, f"short read at {start} in {self.path}")
            return data
        return self._read_bytes(start, self._written) + self._read_bytes(self._written, end)

    def _parse_record(self, data: memoryview, offset: int, position: int) -> Entry:
        body_len, crc = _RECORD_HEADER.unpack_from(data, offset)
        body = data[offset + _RECORD_HEADER.size : offset + _RECORD_HEADER.size + body_len]
        _invariant(
            len(body) == body_len and crc32c.crc32c(body, self._seed) == crc,
            f"{self.path}: bad record at position {position} (CRC or length)",
        )
        idx, term = _BODY_HEADER.unpack_from(body)
        _invariant(idx == self._first_idx + position, f"{self.path}: index {idx} misplaced")
        return bytes(body[_BODY_HEADER.size :]), idx, term

    # --- internals --------------------------------------------------------------------------

    def _cache_put(self, idx: int, command: bytes) -> None:
        if len(command) > self._cache_bytes_max:
            return
        self._cache[idx] = command
        self._cache_bytes += len(command)
        while self._cache_bytes > self._cache_bytes_max:
            _, evicted = self._cache.popitem(last=False)
            self._cache_bytes -= len(evicted)

    def _write_pending(self) -> None:
        if not self._pending:
            return
        # Zeros up to the next page boundary (never part of the journal: recovery stops at
        # them): the write then covers its last page whole, so the kernel does not first
        # read that page from the disk, which it must where the file holds older bytes
        # there (a recycled file); the next write starts in that page, still cached.
        pad = -(self._written + len(self._pending)) % PAGE_BYTES
        try:
            written = os.pwritev(self._fd, [self._pending, _ZEROS[:pad]], self._written)
        except OSError as exc:
            self._undo_partial_write()
            self.write_failures += 1
            raise JournalWriteFailed(
                f"write to {self.path} failed: {exc}", no_space=exc.errno in NO_SPACE_ERRNOS
            ) from exc
        if written < len(self._pending):
            # The disk filled up mid-write: cut the file back to the last whole record
            # (recovery would too) and keep every record in memory for the next try.
            self._undo_partial_write()
            self.write_failures += 1
            raise JournalWriteFailed(
                f"short write to {self.path}: {written} of {len(self._pending)} bytes",
                no_space=True,
            )
        self._file_bytes = max(self._file_bytes, self._written + written)  # padding too
        self._written += len(self._pending)  # what follows, if written, is padding
        self._pending.clear()

    def _undo_partial_write(self) -> None:
        """Cut the file back to _written (a record boundary). If even that fails the
        file's tail is unknown: JournalCorrupt stops the node (recovery cuts a torn tail)."""
        try:
            if os.fstat(self._fd).st_size > self._written:
                os.ftruncate(self._fd, self._written)
                self._file_bytes = self._written
        except OSError as exc:
            raise JournalCorrupt(f"cannot undo a failed write to {self.path}: {exc}") from exc

    def _rewind_unsynced(self) -> None:
        """After a failed fdatasync: move the records written since the last durable point
        back to the write buffer, so the next sync writes them again (a failed fsync may have
        dropped dirty pages: never trust them, as PostgreSQL learned)."""
        if self._written == self._durable:
            return
        tail = os.pread(self._fd, self._written - self._durable, self._durable)
        _invariant(len(tail) == self._written - self._durable, f"short read of {self.path}")
        # Pages a failed fdatasync dropped read back as what the disk holds there: in a
        # recycled file, older records. Only records of this file, whole, go back.
        first = bisect.bisect_left(self._offsets, self._durable)
        for k in range(first, len(self._offsets)):
            if self._offsets[k] >= self._written:
                break
            self._parse_record(memoryview(tail), self._offsets[k] - self._durable, k)
        self._pending[:0] = tail
        self._written = self._durable
        self._undo_partial_write()

    def _truncate_to(self, position: int) -> None:
        cut = self._offsets[position] if position < len(self._offsets) else self._end
        if cut >= self._written:
            del self._pending[cut - self._written :]
        else:
            self._pending.clear()
            os.ftruncate(self._fd, cut)
            self._file_bytes = cut
            self._written = cut
            self._durable = min(self._durable, cut)
            self._dropped_to = min(self._dropped_to, cut)
        del self._offsets[position:]
        del self._terms[position:]
        self._end = cut
        self._dirty = True
        first_dropped = self._first_idx + position
        while self._cache and next(reversed(self._cache)) >= first_dropped:
            _, command = self._cache.popitem(last=True)
            self._cache_bytes -= len(command)
        self._epoch += 1

    def _rewrite_from(self, cut: int) -> None:
        """Make the journal its header and records [cut, _end), durably, in a recycled file.

        The records are written, under a new seed, into `journal.spare` (the file the last
        compaction retired, or a new one) from its start, over what it held; then the
        spare becomes the journal and the journal the spare: a hard link gives the current
        journal a second name, an atomic rename puts the spare in its place, a second one
        names the old journal spare. A crash at any step leaves a complete journal under
        its name (`_settle_swap` tidies the other names at the next open). Each record comes
        from the command cache or from the file with its CRC checked before it is sealed
        under the new seed, so a damaged record is never given a valid one. Anything that
        fails before the first rename leaves the journal as it was (the caller keeps its
        entries).
        """
        spare = self.directory / SPARE_FILE
        fd = os.open(spare, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            size = os.fstat(fd).st_size
            old_seed = 0
            if size >= HEADER_BYTES:
                magic, _, old_seed = _FILE_HEADER.unpack(os.pread(fd, HEADER_BYTES, 0))
                old_seed = old_seed if magic == MAGIC else 0
            if size > SPARE_BYTES_MAX:
                os.ftruncate(fd, SPARE_BYTES_MAX)
            seed = _new_seed(old_seed)
            header = _FILE_HEADER.pack(MAGIC, FORMAT_VERSION, seed)
            self._copy_resealed(fd, cut, seed)
            written = HEADER_BYTES + self._end - cut  # the new file's records end here
            os.pwrite(fd, header, 0)
            if self._durability == "fsync":
                os.fdatasync(fd)
            retiring = self.directory / RETIRING_FILE
            retiring.unlink(missing_ok=True)
            os.link(self.path, retiring)
            os.replace(spare, self.path)  # the swap is done here
        except BaseException:
            os.close(fd)
            raise
        # The swap is done: from here nothing may raise an OSError, which the caller takes
        # for "compaction put off" while the journal is the new file already.
        old_fd, self._fd, self._seed = self._fd, fd, seed
        with contextlib.suppress(OSError):
            os.close(old_fd)
        try:
            os.replace(retiring, spare)
        except OSError as exc:  # the next open tidies up (_settle_swap)
            logger.warning("journal compaction of %s: retiring the old file: %s", self.path, exc)
        self.spare_bytes = _length_of(spare) or _length_of(retiring)  # the retired file
        self._file_bytes = _length_of(self.path)  # the recycled file, old records included
        if self._durability == "fsync":
            try:
                _fsync_directory(self.directory)  # the first rename: before any append is synced
            except OSError as exc:
                raise JournalCorrupt(f"{self.path}: its swap may not be durable: {exc}") from exc
        self._dropped_to = 0  # a new file: its pages are the tail's, just written
        self._dirty = False
        if self._trace_fd is not None:
            # The durable length of the new file: what follows the tail is the spare's old
            # records, which a power cut may leave as they are (a torn-write test cuts there).
            os.write(self._trace_fd, b"rewrite\n%d\n" % written)

    def _copy_resealed(self, fd: int, cut: int, seed: int) -> None:
        """Write records [cut, _end) at HEADER_BYTES of `fd`, each read as `read_range`
        reads it (CRC checked under this file's seed, or from the command cache) and sealed
        under `seed`."""
        position = bisect.bisect_left(self._offsets, cut)
        _invariant(
            cut == self._end or (position < len(self._offsets) and self._offsets[position] == cut),
            f"{self.path}: compaction cut {cut} is not a record boundary",
        )
        out = HEADER_BYTES
        while position < len(self._offsets):
            first = self._offsets[position]
            last = position
            while (
                last + 1 < len(self._offsets) and self._offsets[last + 1] - first < READ_AHEAD_BYTES
            ):
                last += 1
            parts: list[bytes] = []
            for command, idx, term in self.read_range(position, last + 1):
                parts += (_record_head(command, idx, term, seed), command)
            chunk = b"".join(parts)  # one buffer: pwritev takes at most IOV_MAX (1024) of them
            written = os.pwrite(fd, chunk, out)
            if written != len(chunk):  # the disk filled up: put the compaction off
                raise OSError(errno.ENOSPC, f"short write compacting {self.path}")
            out += written
            position = last + 1
        _invariant(out - HEADER_BYTES == self._end - cut, f"short write compacting {self.path}")

    def _settle_swap(self) -> None:
        """At open: finish or undo a compaction's swap that a crash interrupted (the link
        and two renames of `_rewrite_from`). The journal's own name always holds a whole
        journal; only which file is the spare can be left to decide."""
        self.path.with_name(JOURNAL_FILE + ".tmp").unlink(missing_ok=True)  # version 1's
        retiring = self.directory / RETIRING_FILE
        if not retiring.exists():
            return
        if not self.path.exists():  # not left by _rewrite_from; keep the data it names
            os.replace(retiring, self.path)
        elif os.path.samefile(retiring, self.path):  # before the swap: a second name only
            retiring.unlink()
        else:  # after it: the old journal, which is the spare now
            os.replace(retiring, self.directory / SPARE_FILE)
        _fsync_directory(self.directory)

    def _sync_snapshot_file(self) -> None:
        if self._durability != "fsync" or self._snapshot_path is None:
            return
        if self._snapshot_path.exists():
            fd = os.open(self._snapshot_path, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        _fsync_directory(self._snapshot_path.parent)


def _length_of(path: Path) -> int:
    """A file's length, 0 if it is not there (or cannot be read: a metric only)."""
    try:
        return os.stat(path).st_size
    except OSError:
        return 0


class JournalView(Sequence[Entry]):
    """A lazy slice [start, stop) of a DurableJournal: entries are read when touched.

    pysyncobj slices the journal to the end (`log[diff:]`) and then takes what fits in one
    message, so a materialised slice would read the whole tail. Sub-slices of a view are
    plain lists: they go into messages, which must pickle as lists.
    """

    __slots__ = ("_epoch", "_journal", "_start", "_stop")

    def __init__(self, journal: DurableJournal, start: int, stop: int) -> None:
        self._journal = journal
        self._start = start
        self._stop = stop
        self._epoch = journal.epoch

    def __len__(self) -> int:
        return self._stop - self._start

    @overload
    def __getitem__(self, item: int) -> Entry: ...
    @overload
    def __getitem__(self, item: slice) -> list[Entry]: ...
    def __getitem__(self, item: int | slice) -> Entry | list[Entry]:
        self._check_fresh()
        if isinstance(item, slice):
            start, stop, step = item.indices(len(self))
            if step != 1:
                return list(self)[item]
            if stop <= start:
                return []
            return self._journal.read_range(self._start + start, self._start + stop)
        position = item + len(self) if item < 0 else item
        if not 0 <= position < len(self):
            raise IndexError(item)
        return self._journal.entry_at(self._start + position)

    def __iter__(self) -> Iterator[Entry]:
        position = self._start
        while position < self._stop:
            self._check_fresh()
            stop = min(self._stop, position + 256)
            yield from (self._journal.entry_at(k) for k in range(position, stop))
            position = stop

    def __reduce__(self) -> tuple[Any, ...]:
        # If a view ever ends up in a message it must travel as a list, never as a view.
        return (list, (list(self),))

    def _check_fresh(self) -> None:
        _invariant(self._epoch == self._journal.epoch, "journal view used after a deletion")


class _MetaFile:
    """Term, vote and commit index in two alternating checksummed slots (module docstring)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        self._seq = 0

    def load(self) -> tuple[int, Any, int]:
        best: tuple[int, dict[str, Any]] | None = None
        for slot in range(2):
            raw = os.pread(self._fd, _META_SLOT_BYTES, slot * _META_SLOT_BYTES)
            if len(raw) < _META_HEADER.size:
                continue
            length, crc, seq = _META_HEADER.unpack_from(raw)
            payload = raw[_META_HEADER.size : _META_HEADER.size + length]
            if seq == 0 or len(payload) != length or crc32c.crc32c(payload) != crc:
                continue  # never written (zeros), or torn
            if best is None or seq > best[0]:
                best = (seq, json.loads(payload))
        if best is None:
            return 0, None, 1  # pysyncobj's defaults for a new journal
        self._seq = best[0]
        meta = best[1]
        return int(meta["term"]), meta["voted_for"], int(meta["commit_index"])

    def store(self, term: int, voted_for: Any, commit_index: int, durable: bool) -> None:
        self._seq += 1
        payload = json.dumps(
            {"term": term, "voted_for": voted_for, "commit_index": commit_index}
        ).encode()
        slot = _META_HEADER.pack(len(payload), crc32c.crc32c(payload), self._seq) + payload
        _invariant(len(slot) <= _META_SLOT_BYTES, "meta record too large (node id too long?)")
        os.pwrite(self._fd, slot, (self._seq % 2) * _META_SLOT_BYTES)
        if durable:
            os.fdatasync(self._fd)

    def close(self) -> None:
        os.close(self._fd)


# --- the one hook into pysyncobj ------------------------------------------------------------
# SyncObj.__init__ builds its journal with the module-level createJournal(conf.journalFile)
# and offers no parameter for a custom one. We wrap that function once: a DurableJournal
# passed as conf.journalFile is used as is; anything else goes to pysyncobj's own function,
# so stock SyncObj objects in the same process (the benchmark's baseline) are unchanged.
_stock_create_journal = _syncobj_module.createJournal


def _create_journal(journal_file: Any = None) -> Any:
    if isinstance(journal_file, DurableJournal):
        return journal_file
    return _stock_create_journal(journal_file)


if getattr(_syncobj_module.createJournal, "__module__", None) != __name__:
    _syncobj_module.createJournal = _create_journal
