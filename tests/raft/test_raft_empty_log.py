"""Proves that a replica whose in-memory log holds no entry refuses its peers' messages
instead of stopping its node (issue 39, item 3: pysyncobj raised IndexError in
`__getEntries` on `__raftLog[0]` at the first append_entries, the broker's tick thread
died and the process exited).

The log is emptied the way the broker's was: a compaction up to an index past the
journal's end drops every entry (`DurableJournal.deleteEntriesTo`). Then the leader keeps
appending: its append_entries and heartbeats reach the empty follower for several election
timeouts. The follower's node must still run (no failure, its tick thread alive), must have
refused those messages (counted), must not have campaigned (its term unchanged: a refused
leader message holds its election back), and the other two go on committing. Without the
refusal the node fails with IndexError on the first append_entries.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from raft_harness import InProcessCluster

from raft import RaftConfig

# How long the leader's messages keep reaching the empty follower, in maximum election
# timeouts: long enough for its election deadline to pass several times if nothing held it.
WATCH_ELECTION_TIMEOUTS = 4


async def leader_messages_to_an_empty_log(tmp_path: Path) -> dict[str, Any]:
    config = RaftConfig()
    cluster = InProcessCluster(tmp_path, config=config)
    replicas, leader = await cluster.start_group(1)
    try:
        follower = sorted(n for n in replicas if n != leader)[0]
        for k in range(5):
            await replicas[leader].propose(b"before-%d" % k, timeout_s=5.0)
        empty = replicas[follower]

        def compact_past_the_end() -> int:
            empty.journal.deleteEntriesTo(len(empty.journal) + 10)
            return len(empty.journal)

        assert await cluster.nodes[follower].on_tick_thread(compact_past_the_end) == 0
        term = empty.status().term
        for k in range(10):  # append_entries with entries, then heartbeats
            await replicas[leader].propose(b"after-%d" % k, timeout_s=5.0)
        await asyncio.sleep(WATCH_ELECTION_TIMEOUTS * config.election_timeout_max_s)
        node = cluster.nodes[follower]
        thread = node._thread
        return {
            "failed": node.failed,
            "alive": thread is not None and thread.is_alive(),
            "refused": node.frames_refused_empty_log,
            "term_moved": empty.status().term != term,
            "leader_still": replicas[leader].status().is_leader,
        }
    finally:
        await cluster.stop()


def test_a_replica_with_an_empty_log_refuses_messages_and_its_node_runs_on(
    tmp_path: Path,
) -> None:
    seen = asyncio.run(asyncio.wait_for(leader_messages_to_an_empty_log(tmp_path), 60))
    assert seen["failed"] is None, seen
    assert seen["alive"], seen
    assert seen["refused"] > 0, seen
    assert not seen["term_moved"], seen
    assert seen["leader_still"], seen


def test_a_tick_with_entries_to_apply_and_an_empty_log_does_nothing(tmp_path: Path) -> None:
    """The replica's own tick, not only a peer's message: with the commit index past what
    was applied and no entry held, pysyncobj's apply reads the first entry (IndexError: the
    full run of 2026-11-29 saw the node stop so, when the log emptied between an entry's
    commit and its apply). The tick now leaves such a replica alone."""

    async def scenario() -> int:
        cluster = InProcessCluster(tmp_path, config=RaftConfig())
        replicas, leader = await cluster.start_group(1)
        try:
            follower = sorted(n for n in replicas if n != leader)[0]
            empty = replicas[follower]

            def empty_then_tick() -> int:
                empty.journal.deleteEntriesTo(len(empty.journal) + 10)
                sync_obj = empty.syncobj
                sync_obj._SyncObj__raftCommitIndex = sync_obj._SyncObj__raftLastApplied + 1
                empty.tick()
                return len(empty.journal)

            return int(await cluster.nodes[follower].on_tick_thread(empty_then_tick))
        finally:
            await cluster.stop()

    assert asyncio.run(asyncio.wait_for(scenario(), 60)) == 0
