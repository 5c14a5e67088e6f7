"""A full disk under the Raft journal (raft/README.md, "A full disk").

Proves: a sync the kernel cuts short (RLIMIT_FSIZE caps the file as a full disk would;
past it, writes fail with EFBIG) raises JournalWriteFailed; the file holds only whole
records; every entry stays readable from memory; the next sync writes them all, and a
reopen finds every one.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from raft.journal import SPARE_FILE, DurableJournal, JournalWriteFailed
from tests_support import file_size_cap


def test_a_journal_sync_cut_short_keeps_every_entry_and_writes_them_later(
    tmp_path: Path,
) -> None:
    journal = DurableJournal(tmp_path)
    for idx in range(1, 6):
        journal.add(b"entry-%d" % idx * 100, idx, 1)
    journal.sync()
    durable = journal.size_bytes  # the records end here (a write pads the file to a page)
    for idx in range(6, 12):
        journal.add(b"entry-%d" % idx * 100, idx, 1)
    with file_size_cap(durable + 700), pytest.raises(JournalWriteFailed) as refused:
        journal.sync()
    assert refused.value.no_space
    assert os.path.getsize(journal.path) == durable  # whole records only
    assert not journal.is_synced()
    assert [journal[k][1] for k in range(len(journal))] == list(range(1, 12))
    journal.sync()  # room again
    assert journal.is_synced()
    journal.close()
    reopened = DurableJournal(tmp_path)
    assert [reopened[k] for k in range(len(reopened))] == [
        (b"entry-%d" % idx * 100, idx, 1) for idx in range(1, 12)
    ]
    reopened.close()


def test_a_compaction_the_disk_cuts_short_is_put_off_and_done_later(tmp_path: Path) -> None:
    """The kept tail's copy into the spare fails part-way (the spare must grow: the first
    compaction has none): the compaction is put off, the journal stays as it was, and a
    later one, with room again, keeps exactly the tail. The tail here is 2,000 records, more
    than one write may take as separate buffers (IOV_MAX, 1024)."""
    journal = DurableJournal(tmp_path)
    entries = [(b"r%d" % idx * 20, idx, 1) for idx in range(1, 4001)]
    for entry in entries:
        journal.add(*entry)
    journal.sync()
    with file_size_cap(20_000):
        journal.deleteEntriesTo(2000)  # needs a ~110 KB spare
    assert journal.write_failures == 1
    assert [journal[k] for k in range(len(journal))] == entries
    assert journal.spare_bytes == 0 and not (tmp_path / SPARE_FILE).exists()  # given back
    journal.deleteEntriesTo(2000)
    assert [journal[k] for k in range(len(journal))] == entries[2000:]
    journal.close()
    reopened = DurableJournal(tmp_path)
    assert [reopened[k] for k in range(len(reopened))] == entries[2000:]
    reopened.close()
