"""Proves that a crash between a snapshot's write and the journal compaction that follows
it loses nothing (jepsen/README.md, "Real bugs found", the power cut with journals
compacted every 64 entries).

pysyncobj writes a snapshot in one tick and drops the journal entries it covers in the
next. The test holds a one-node group in exactly that window for good: it runs with a
snapshot every few entries while `DurableJournal.deleteEntriesTo` does nothing, so every
snapshot is written and no compaction follows; after the first half of the commands no
snapshot is written any more (they fail, as on a full disk), so that the second half
follows the last snapshot in the journal only. Then it stops the node (the journal is
synced at close, as it is at every round) and reopens the directory with the real
journal. Every
command committed before the stop, the ones after the last snapshot included, must be
there again, in order, and a new proposal continues after them. Before the fix, pysyncobj
found the journal's first entries unlike the snapshot's, cleared the journal and lost
every entry after the snapshot (here: the last commands), and the commit index pointed
past the journal's end.

A unit test pins the journal's side: `finish_compaction` drops the covered prefix only
when the journal holds the snapshot's last two entries with their terms.
"""

from __future__ import annotations

import asyncio
from dataclasses import replace
from pathlib import Path

import pytest
from test_raft_replica import Recorder, one_node

import raft.replica
from raft import RaftConfig
from raft.journal import DurableJournal
from raft.snapshot import SNAPSHOT_FILE, write_snapshot

SNAPSHOT_ENTRIES = 4
COMMANDS = 23  # not a multiple of SNAPSHOT_ENTRIES: entries follow the last snapshot


def test_a_crash_between_snapshot_and_compaction_keeps_every_entry(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = replace(RaftConfig(), log_compaction_min_entries=SNAPSHOT_ENTRIES)

    async def before_the_crash() -> list[bytes]:
        node = one_node(tmp_path, config)
        machine = Recorder()
        replica = await node.add_group(3, machine)
        await node.start()
        for k in range(COMMANDS):
            await replica.propose(b"c%d" % k)
            if k == COMMANDS // 2:
                await asyncio.sleep(0.2)  # a few more rounds: a snapshot covers c0..ck
                snapshots.append(replica.snapshots_written)
        assert snapshots[0] >= 2 and replica.snapshots_written == snapshots[0]
        await node.stop()
        return machine.commands

    snapshots: list[int] = []

    def snapshot_until_frozen(path: str, data: object, state: bytes, *, fsync: bool) -> None:
        if snapshots:
            raise OSError(28, "no snapshot in the second half")
        write_snapshot(path, data, state, fsync=fsync)

    with monkeypatch.context() as patch:
        patch.setattr(DurableJournal, "deleteEntriesTo", lambda self, entry_to: None)
        patch.setattr(raft.replica, "write_snapshot", snapshot_until_frozen)
        committed = asyncio.run(asyncio.wait_for(before_the_crash(), 30))
    assert (tmp_path / "groups" / "3" / SNAPSHOT_FILE).exists()

    async def after_the_crash() -> None:
        node = one_node(tmp_path, config)
        machine = Recorder()
        replica = await node.add_group(3, machine)
        await node.start()
        position, _ = await replica.propose(b"after")
        assert machine.commands == [*committed, b"after"]
        assert position == len(committed)
        await node.stop()

    asyncio.run(asyncio.wait_for(after_the_crash(), 30))


def test_finish_compaction_drops_the_prefix_only_for_the_snapshots_own_entries(
    tmp_path: Path,
) -> None:
    def journal_of(terms: list[int]) -> DurableJournal:
        journal = DurableJournal(tmp_path / f"j{len(list(tmp_path.iterdir()))}")
        for idx, term in enumerate(terms, start=1):
            journal.add(b"e%d" % idx, idx, term)
        journal.sync()
        return journal

    journal = journal_of([1, 1, 2, 2, 2, 3])
    assert journal.finish_compaction((3, 2), (4, 2)) == 2  # drops entries 1 and 2
    assert (journal.first_index, journal.last_index) == (3, 6)
    assert journal[0] == (b"e3", 3, 2)
    assert journal.finish_compaction((3, 2), (4, 2)) == 0  # already done
    journal.close()

    other_history = journal_of([1, 1, 2, 2, 2, 3])
    assert other_history.finish_compaction((3, 2), (4, 7)) == 0  # another term at 4
    assert other_history.finish_compaction((7, 3), (8, 3)) == 0  # past the journal's end
    assert (other_history.first_index, len(other_history)) == (1, 6)
    other_history.close()
