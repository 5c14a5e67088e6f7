"""Proves that DurableJournal (raft/journal.py) is pysyncobj's Journal, durable per sync()
and bounded in memory:

- it behaves like a list of (command, idx, term) under any sequence of add, truncation of
  a suffix (deleteEntriesFrom), of a prefix (deleteEntriesTo, after compaction) and clear,
  with reads of single entries, slices and negative indexes, and reopening the files after
  sync() gives the same list, term, vote and commit index;
- one sync() makes any number of appended entries durable with one fdatasync, and term and
  vote set before it survive a reopen;
- a torn tail (the file cut at every byte of its last record, or that record's bytes
  damaged) reopens as the earlier entries, and the file is truncated to them;
- a torn meta write (one slot damaged) falls back to the other slot;
- memory is bounded: with a small cache, thousands of large entries keep only indexes and
  the cache in memory, and old entries are read back from the file, also through lazy
  slices (a slice pickles as a plain list);
- pysyncobj uses the journal handed to it as journalFile, and stock SyncObj objects in the
  same process still get pysyncobj's own journals;
- compaction recycles the file the compaction before it retired (the journal and
  `journal.spare` swap; the old records beyond the new end never reopen, whatever a power
  cut leaves of the writes after the last sync: a property); a swap cut short by a crash
  is finished or undone at the next open; a version 1 journal (seed 0) is still read,
  appended to and compacted into version 2.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import mmap
import os
import pickle
import random
import struct
from pathlib import Path
from typing import Literal

import crc32c
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pysyncobj.journal import FileJournal, MemoryJournal

import raft.journal as journal_module
from raft.journal import (
    HEADER_BYTES,
    JOURNAL_FILE,
    META_FILE,
    PAGE_BYTES,
    PAGE_DROP_BYTES_MIN,
    RETIRING_FILE,
    SPARE_FILE,
    DurableJournal,
    JournalView,
)

Entry = tuple[bytes, int, int]


def entries_of(journal: DurableJournal) -> list[Entry]:
    return [journal[k] for k in range(len(journal))]


operations = st.lists(
    st.one_of(
        st.tuples(st.just("add"), st.binary(max_size=300), st.integers(0, 2)),
        st.tuples(st.just("delete_from"), st.integers(0, 40)),
        st.tuples(st.just("delete_to"), st.integers(0, 40)),
        st.tuples(st.just("sync_reopen")),
        st.tuples(st.just("sync")),
        st.tuples(st.just("clear")),
        st.tuples(st.just("term"), st.integers(0, 50), st.sampled_from([None, "n1", "n2"])),
    ),
    max_size=60,
)


@settings(suppress_health_check=[HealthCheck.function_scoped_fixture], max_examples=60)
@given(ops=operations)
def test_behaves_like_a_list_across_any_operations_and_reopens(
    tmp_path_factory: pytest.TempPathFactory,
    monkeypatch: pytest.MonkeyPatch,
    ops: list[tuple[object, ...]],
) -> None:
    monkeypatch.setattr(journal_module, "PAGE_DROP_BYTES_MIN", 0)  # drop pages at every sync
    directory = tmp_path_factory.mktemp("journal")
    journal = DurableJournal(directory, cache_bytes_max=500, write_buffer_bytes_max=1024)
    model: list[Entry] = []
    term, vote = 0, None
    for op in ops:
        if op[0] == "add":
            _, command, term_step = op
            idx = model[-1][1] + 1 if model else 1
            entry_term = (model[-1][2] if model else 0) + int(term_step)  # type: ignore[call-overload]
            journal.add(command, idx, entry_term)
            model.append((command, idx, entry_term))  # type: ignore[arg-type]
        elif op[0] == "delete_from":
            journal.deleteEntriesFrom(op[1])
            del model[op[1] :]  # type: ignore[misc]
        elif op[0] == "delete_to":
            journal.deleteEntriesTo(op[1])
            del model[: op[1]]  # type: ignore[misc]
        elif op[0] == "clear":
            journal.clear()
            model.clear()
        elif op[0] == "term":
            term, vote = op[1], op[2]  # type: ignore[assignment]
            journal.setCurrentTerm(term, vote)
        elif op[0] == "sync":
            journal.sync()  # old pages leave the page cache: later reads go to the disk
        else:
            journal.setRaftCommitIndex(max(1, len(model)))
            journal.sync()
            journal.close()
            journal = DurableJournal(directory, cache_bytes_max=500, write_buffer_bytes_max=1024)
            assert journal.getRaftCommitIndex() == max(1, len(model))
        assert len(journal) == len(model)
        assert entries_of(journal) == model
        assert list(journal[1:]) == model[1:]
        assert journal[0:][0 : len(model)] == model  # read_range: cache and file mixed
        if model:
            assert journal[-1] == model[-1]
            assert journal.last_index == model[-1][1]
        assert (journal.getCurrentTerm(), journal.getVotedForNodeId()) == (term, vote)
    journal.close()


def test_one_fdatasync_covers_a_whole_tick_of_entries(tmp_path: Path) -> None:
    journal = DurableJournal(tmp_path)
    for idx in range(1, 1001):
        journal.add(b"x" * 100, idx, 1)
    journal.setCurrentTerm(3, "n2")
    assert journal.needs_sync()
    journal.sync()
    assert journal.syncs == 1
    assert not journal.needs_sync()
    os.close(journal._fd)  # a crash: no close(), no further sync
    journal._fd = -1
    reopened = DurableJournal(tmp_path)
    assert len(reopened) == 1000
    assert (reopened.getCurrentTerm(), reopened.getVotedForNodeId()) == (3, "n2")
    reopened.close()


def test_the_commit_index_costs_no_fdatasync_of_its_own_per_round(tmp_path: Path) -> None:
    """Rounds that append and advance the commit index write the meta file at most once
    per COMMIT_INDEX_PERSIST_INTERVAL_S (it was once per round: a second fdatasync); a
    vote is written in its own round; close() writes the last commit index."""
    journal = DurableJournal(tmp_path)
    writes = journal._meta._seq
    for idx in range(1, 201):  # 200 rounds, well within one interval
        journal.add(b"x", idx, 1)
        journal.setRaftCommitIndex(idx)
        journal.sync()
    assert journal.syncs == 200
    assert journal._meta._seq - writes == 1  # the first round's; the rest wait
    assert not journal.needs_sync()
    journal.setCurrentTerm(2, "n3")
    journal.sync()
    assert journal._meta._seq - writes == 2
    journal.close()
    reopened = DurableJournal(tmp_path)
    assert reopened.getRaftCommitIndex() == 200
    assert (reopened.getCurrentTerm(), reopened.getVotedForNodeId()) == (2, "n3")
    reopened.close()


def write_three(directory: Path) -> list[Entry]:
    """Three entries in a journal file cut to its records (a write pads the file with
    zeros to a page boundary: the tests below damage the records' own last bytes)."""
    journal = DurableJournal(directory)
    entries = [(b"first", 1, 1), (b"second", 2, 1), (b"third-" * 10, 3, 2)]
    for entry in entries:
        journal.add(*entry)
    end = journal.size_bytes
    journal.close()
    path = directory / JOURNAL_FILE
    assert os.path.getsize(path) % PAGE_BYTES == 0 and not path.read_bytes()[end:].strip(b"\0")
    os.truncate(path, end)
    return entries


def test_torn_tail_at_every_byte_reopens_as_the_earlier_entries(tmp_path: Path) -> None:
    entries = write_three(tmp_path / "source")
    data = (tmp_path / "source" / JOURNAL_FILE).read_bytes()
    last_start = len(data) - (24 + len(entries[2][0]))
    for cut in range(last_start, len(data)):
        directory = tmp_path / f"cut{cut}"
        directory.mkdir()
        (directory / JOURNAL_FILE).write_bytes(data[:cut])
        journal = DurableJournal(directory)
        assert entries_of(journal) == entries[:2]
        journal.add(b"new", 3, 3)
        assert journal.size_bytes == last_start + 24 + 3
        journal.close()
        assert entries_of(DurableJournal(directory))[-1] == (b"new", 3, 3)


@pytest.mark.parametrize("offset_from_end", [1, 5, 20, 30, 40])
def test_damaged_last_record_is_dropped(tmp_path: Path, offset_from_end: int) -> None:
    entries = write_three(tmp_path)
    path = tmp_path / JOURNAL_FILE
    data = bytearray(path.read_bytes())
    data[-offset_from_end] ^= 0x40
    path.write_bytes(bytes(data))
    journal = DurableJournal(tmp_path)
    assert entries_of(journal) == entries[:2]
    journal.close()


def test_torn_meta_slot_falls_back_to_the_other(tmp_path: Path) -> None:
    journal = DurableJournal(tmp_path)
    journal.setCurrentTerm(4, "n1")
    journal.sync()
    journal.setCurrentTerm(5, "n3")
    journal.sync()
    journal.close()
    path = tmp_path / META_FILE
    data = bytearray(path.read_bytes())
    newest_slot = 0 if data[:4] != b"\0\0\0\0" and data[8] == 2 else 512
    data[newest_slot + 20] ^= 0xFF
    path.write_bytes(bytes(data))
    reopened = DurableJournal(tmp_path)
    assert (reopened.getCurrentTerm(), reopened.getVotedForNodeId()) == (4, "n1")
    reopened.close()


def test_memory_stays_bounded_and_old_entries_come_from_the_file(tmp_path: Path) -> None:
    cache = 256 * 1024
    journal = DurableJournal(tmp_path, cache_bytes_max=cache, write_buffer_bytes_max=64 * 1024)
    big = 32 * 1024
    for idx in range(1, 3001):  # ~94 MiB appended
        journal.add(idx.to_bytes(4, "little") * (big // 4), idx, 1)
        if idx % 100 == 0:
            journal.sync()
    assert journal.memory_bytes < cache + 64 * 1024 + 3000 * 16 + big
    assert journal[0][0][:4] == (1).to_bytes(4, "little")
    view = journal[10:]
    assert isinstance(view, JournalView) and len(view) == 2990
    assert [entry[1] for entry in view[:3]] == [11, 12, 13]
    assert pickle.loads(pickle.dumps(journal[2995:])) == entries_of(journal)[2995:]
    journal.deleteEntriesTo(2990)
    assert journal[0][1] == 2991 and len(journal) == 10
    assert os.path.getsize(tmp_path / JOURNAL_FILE) == HEADER_BYTES + 10 * (24 + big)
    journal.close()


def test_a_slice_of_recent_entries_comes_from_the_cache_not_the_file(tmp_path: Path) -> None:
    """What a leader sends its followers (pysyncobj slices the journal's tail) is served from
    the cache, the very bytes objects appended: no pread, no CRC pass, no copy (#22)."""
    journal = DurableJournal(tmp_path, cache_bytes_max=3 * 1024, write_buffer_bytes_max=1024)
    commands = [bytes([k]) * 1024 for k in range(1, 7)]
    for idx, command in enumerate(commands, start=1):
        journal.add(command, idx, 1)
    journal.sync()
    entries = journal[0:][0:6]
    assert entries == [(c, k, 1) for k, c in enumerate(commands, start=1)]
    assert all(entries[k][0] is commands[k] for k in range(3, 6))  # the cached three
    assert all(entries[k][0] is not commands[k] for k in range(3))  # read back from the file
    journal.close()


def test_pysyncobj_uses_the_durable_journal_and_stock_journals_are_untouched(
    tmp_path: Path,
) -> None:
    durable = DurableJournal(tmp_path / "durable")
    assert journal_module._create_journal(durable) is durable
    assert isinstance(journal_module._create_journal(None), MemoryJournal)
    stock = journal_module._create_journal(str(tmp_path / "stock"))
    assert isinstance(stock, FileJournal)
    stock._destroy()
    durable.close()


def resident_pages(path: Path) -> list[bool]:
    """Which pages of `path` are in the page cache now: mincore(2) over a read-only map
    (mapping a file reads nothing in; only touching it would)."""
    libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int,
                          ctypes.c_int, ctypes.c_long]  # fmt: skip
    libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
    libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    size = os.path.getsize(path)
    pages = (size + mmap.PAGESIZE - 1) // mmap.PAGESIZE
    vector = (ctypes.c_ubyte * pages)()
    fd = os.open(path, os.O_RDONLY)
    try:
        address = libc.mmap(None, size, mmap.PROT_READ, mmap.MAP_SHARED, fd, 0)
        assert address not in (None, ctypes.c_void_p(-1).value), os.strerror(ctypes.get_errno())
        try:
            assert libc.mincore(address, size, vector) == 0, os.strerror(ctypes.get_errno())
        finally:
            libc.munmap(address, size)
    finally:
        os.close(fd)
    return [bool(v & 1) for v in vector]


@pytest.mark.parametrize("durability", ["fsync", "none"])
def test_durable_pages_older_than_the_cache_leave_the_page_cache(
    tmp_path: Path, durability: Literal["fsync", "none"]
) -> None:
    """After each sync, the journal hands back to the OS the pages of durable records older
    than its command cache (#22: fresh page-cache pages were half a follower's CPU on this
    VM). The cached entries' pages, the unsynced tail and anything under durability "none"
    (dirty pages, not yet on disk) stay; every entry still reads back, also after reopening."""
    page = mmap.PAGESIZE
    cache = 64 * 1024
    journal = DurableJournal(
        tmp_path, durability=durability, cache_bytes_max=cache, write_buffer_bytes_max=1024
    )
    command_bytes = 4 * 1024 - 24  # one record a page
    for idx in range(1, 257):  # 1 MiB
        journal.add(idx.to_bytes(2, "little") * (command_bytes // 2), idx, 1)
        if idx % 8 == 0:
            journal.sync()
    resident = resident_pages(tmp_path / JOURNAL_FILE)
    assert len(resident) == 257  # the 16-byte file header, then record k on page k (k >= 1)
    cached_from = 256 - cache // command_bytes  # the 16 newest commands are cached
    if durability == "fsync":
        dropped = journal.dropped_bytes // page
        # Everything older than the cache, give or take the last drop's worth (drops wait
        # for PAGE_DROP_BYTES_MIN), is gone; the cached entries' pages all stay.
        assert cached_from - PAGE_DROP_BYTES_MIN // page <= dropped <= cached_from
        assert not any(resident[:dropped])
        assert all(resident[cached_from:])
    else:
        assert journal.dropped_bytes == 0 and all(resident)
    assert [journal[k][1] for k in range(len(journal))] == list(range(1, 257))
    assert journal[0][0] == (1).to_bytes(2, "little") * (command_bytes // 2)
    journal.close()
    reopened = DurableJournal(tmp_path, durability=durability)
    assert reopened[100][0][:2] == (101).to_bytes(2, "little") and len(reopened) == 256
    reopened.close()


def test_the_first_entry_is_read_from_the_file_once_until_a_deletion(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """pysyncobj reads log[0] three times for every append_entries it sends (its first
    index); entry 0 is long out of the cache, so each read was a pread and a CRC pass over
    the whole command, from the disk once its pages were dropped (#22)."""
    journal = DurableJournal(tmp_path, cache_bytes_max=4096, write_buffer_bytes_max=1024)
    for idx in range(1, 11):
        journal.add(bytes([idx]) * 1024, idx, 1)
    journal.sync()
    reads: list[int] = []
    real_pread = os.pread
    monkeypatch.setattr(
        journal_module.os, "pread", lambda fd, n, at: reads.append(at) or real_pread(fd, n, at)
    )
    assert [journal[0] for _ in range(100)] == [(bytes([1]) * 1024, 1, 1)] * 100
    assert len(reads) == 1
    journal.deleteEntriesTo(2)  # compaction: entry 0 is now index 3
    assert journal[0] == (bytes([3]) * 1024, 3, 1) and journal[0][1] == 3
    journal.deleteEntriesFrom(0)  # a conflicting suffix from the very first entry
    journal.add(b"new", 3, 2)
    assert journal[0] == (b"new", 3, 2)
    journal.close()


# --- recycled files (compaction) -------------------------------------------------------------

SECTOR = 512

crash_operations = st.lists(
    st.one_of(
        st.tuples(st.just("add"), st.integers(0, 900)),
        st.tuples(st.just("sync")),
        st.tuples(st.just("compact"), st.integers(0, 40)),
        st.tuples(st.just("crash"), st.randoms(use_true_random=False)),
    ),
    max_size=50,
)


def crashed_bytes(old: bytes, new: bytes, durable: int, rng: random.Random) -> bytes:
    """What a power cut may leave of a file that held `old` at its last fdatasync (which
    made [0, durable) durable) and `new` now: its old or its new length, and past
    `durable` each sector as it was or as it is (zeros where neither wrote it)."""
    length = rng.choice([len(old), len(new)])
    out = bytearray(new[:durable])
    for start in range(durable, length, SECTOR):
        source = rng.choice([old, new])
        piece = source[start : min(start + SECTOR, length)]
        out += piece + bytes(min(SECTOR, length - start) - len(piece))
    return bytes(out)


@settings(suppress_health_check=[HealthCheck.function_scoped_fixture], max_examples=80)
@given(ops=crash_operations)
def test_a_power_cut_reopens_a_prefix_of_what_was_written_never_a_recycled_record(
    tmp_path_factory: pytest.TempPathFactory, ops: list[tuple[object, ...]]
) -> None:
    """Entries are written, synced, compacted (each compaction after the first writes the
    tail into the file the one before retired, over its old records) and cut by power
    losses that keep any mix of old and new sectors past the durable length. Every reopen
    holds what was synced, then at most a prefix of what followed it, and nothing else:
    no record of a retired file's earlier life (they are of the same sizes and indexes,
    the worst case for a recycled file) ever comes back."""
    directory = tmp_path_factory.mktemp("journal")
    journal = DurableJournal(directory, cache_bytes_max=2000)
    model: list[Entry] = []  # what the journal holds now
    synced: list[Entry] = []  # what a power cut cannot take
    at_sync = (directory / JOURNAL_FILE).read_bytes()
    durable = len(at_sync)
    for op in ops:
        if op[0] == "add":
            idx = model[-1][1] + 1 if model else 1
            command = bytes([idx % 251]) * int(op[1])  # type: ignore[call-overload]
            journal.add(command, idx, 1)
            model.append((command, idx, 1))
        elif op[0] in ("sync", "compact"):
            if op[0] == "compact":
                journal.deleteEntriesTo(op[1])
                del model[: op[1]]  # type: ignore[misc]
            journal.sync()
            synced = list(model)
            at_sync = (directory / JOURNAL_FILE).read_bytes()
            durable = journal._durable
        else:
            journal._write_pending()  # written, not synced: in the page cache
            journal._fd, fd = -1, journal._fd
            os.close(fd)  # no sync at close: the process dies with the power
            journal._meta.close()
            now = (directory / JOURNAL_FILE).read_bytes()
            cut = crashed_bytes(at_sync, now, durable, op[1])  # type: ignore[arg-type]
            (directory / JOURNAL_FILE).write_bytes(cut)
            journal = DurableJournal(directory, cache_bytes_max=2000)
            reopened = entries_of(journal)
            assert reopened[: len(synced)] == synced
            assert reopened == model[: len(reopened)], "a record that was never written"
            model, synced = list(reopened), list(reopened)
            at_sync = (directory / JOURNAL_FILE).read_bytes()
            durable = len(at_sync)
        assert entries_of(journal) == model
    journal.close()
    reopened = DurableJournal(directory)
    assert entries_of(reopened) == model
    reopened.close()


def test_compaction_recycles_the_file_the_compaction_before_retired(tmp_path: Path) -> None:
    journal = DurableJournal(tmp_path)
    assert journal.spare_bytes == 0
    assert journal.disk_bytes == os.path.getsize(tmp_path / JOURNAL_FILE)

    def on_disk() -> int:
        return os.path.getsize(tmp_path / JOURNAL_FILE) + os.path.getsize(tmp_path / SPARE_FILE)

    inodes = []
    for round_ in range(4):
        for k in range(10):
            idx = round_ * 10 + k + 1
            journal.add(b"x" * 1000, idx, 1)
        journal.sync()
        inodes.append(os.stat(tmp_path / JOURNAL_FILE).st_ino)
        retired_bytes = os.path.getsize(tmp_path / JOURNAL_FILE)
        journal.deleteEntriesTo(len(journal) - 2)  # keep a tail of two entries
        # The retired file is the spare now, and counted (dmq_raft_journal_disk_bytes);
        # from the second compaction on, the journal is a recycled file, longer than its
        # records.
        assert journal.spare_bytes == retired_bytes == os.path.getsize(tmp_path / SPARE_FILE)
        assert journal.disk_bytes == on_disk()
        if round_ >= 1:
            assert os.path.getsize(tmp_path / JOURNAL_FILE) > journal.size_bytes
    inodes.append(os.stat(tmp_path / JOURNAL_FILE).st_ino)
    # New, new (no spare yet: the first compaction's), then the two files alternate.
    assert inodes[2] == inodes[0] and inodes[3] == inodes[1] and inodes[4] == inodes[0]
    assert inodes[0] != inodes[1]
    assert os.stat(tmp_path / SPARE_FILE).st_ino == inodes[1]
    # The recycled journal is longer than what it holds: the rest is the old life's
    # records, under another seed; reopening finds the two kept entries only.
    assert os.path.getsize(tmp_path / JOURNAL_FILE) > HEADER_BYTES + 2 * (24 + 1000)
    expected = [(b"x" * 1000, 39, 1), (b"x" * 1000, 40, 1)]
    assert entries_of(journal) == expected
    journal.close()
    reopened = DurableJournal(tmp_path)
    assert entries_of(reopened) == expected
    assert reopened.spare_bytes == os.path.getsize(tmp_path / SPARE_FILE) > 0
    assert reopened.disk_bytes == on_disk()
    reopened.add(b"y", 41, 2)
    reopened.close()
    assert entries_of(DurableJournal(tmp_path)) == [*expected, (b"y", 41, 2)]


@pytest.mark.parametrize("left", ["link only", "after the swap"])
def test_a_swap_a_crash_cut_short_is_settled_at_the_next_open(tmp_path: Path, left: str) -> None:
    journal = DurableJournal(tmp_path)
    journal.add(b"kept", 1, 1)
    journal.close()
    if left == "link only":  # crashed between the link and the first rename
        os.link(tmp_path / JOURNAL_FILE, tmp_path / RETIRING_FILE)
        (tmp_path / SPARE_FILE).write_bytes(b"half a compaction")
    else:  # crashed between the two renames: the retiring file is the old journal
        (tmp_path / RETIRING_FILE).write_bytes(b"the old journal")
    reopened = DurableJournal(tmp_path)
    assert entries_of(reopened) == [(b"kept", 1, 1)]
    assert not (tmp_path / RETIRING_FILE).exists()
    spare = (tmp_path / SPARE_FILE).read_bytes()
    assert spare == (b"half a compaction" if left == "link only" else b"the old journal")
    reopened.close()


def test_a_version_1_journal_is_read_appended_and_compacted_into_version_2(
    tmp_path: Path,
) -> None:
    """A journal written before the seed (version 1, plain CRC-32C) opens as it was."""
    records = b""
    for idx in (1, 2, 3):
        body = struct.pack("<QQ", idx, 1) + b"v1-%d" % idx
        records += struct.pack("<II", len(body), crc32c.crc32c(body)) + body
    (tmp_path / JOURNAL_FILE).write_bytes(b"DMQRJNL1" + struct.pack("<II", 1, 0) + records)
    journal = DurableJournal(tmp_path)
    assert entries_of(journal) == [(b"v1-%d" % k, k, 1) for k in (1, 2, 3)]
    journal.add(b"new", 4, 2)
    journal.close()
    journal = DurableJournal(tmp_path)
    assert journal[-1] == (b"new", 4, 2)
    assert (tmp_path / JOURNAL_FILE).read_bytes()[8:12] == struct.pack("<I", 1)
    journal.deleteEntriesTo(2)
    assert (tmp_path / JOURNAL_FILE).read_bytes()[8:12] == struct.pack("<I", 2)
    journal.close()
    assert entries_of(DurableJournal(tmp_path)) == [(b"v1-3", 3, 1), (b"new", 4, 2)]
