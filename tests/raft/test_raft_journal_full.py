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

from raft.journal import DurableJournal, JournalWriteFailed
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
