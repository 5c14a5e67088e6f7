"""Proves dmq/partition/machine.py: a partition's PartitionLog as the state of its Raft group.

- ProduceCommand's binary encoding round-trips (property test) and decode refuses unknown
  versions, unknown flags and every cut-short or padded frame;
- apply assigns offsets at the log end and commits them (high watermark = log end), and
  is deterministic: two replicas given the same commands hold byte-identical files;
- replay after a restart appends nothing twice: with the whole journal replayed, with the
  checkpoint behind the log (lost records) and with the log behind the checkpoint (a cut
  tail); after each, the log is byte-identical to a replica that never stopped;
- the same through a real RaftNode: pysyncobj replays its journal after a restart, with
  and without a snapshot, and the log holds every batch exactly once;
- three RaftNodes on real sockets, proposals through every node: the replicas' segment
  files are byte-identical;
- snapshot() holds no partition data; restore() does nothing when the log covers the
  snapshot, copies only the missing range through fetch_missing when it is behind, cuts a
  conflicting suffix, and finishes a restore that a crash interrupted.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from raft_harness import free_port_on

from dmq.partition.machine import (
    APPLIED_CHECKPOINT,
    POSITION_RESTORING,
    PRODUCE_COMMAND_VERSION,
    CommandDecodeError,
    CopiedChunk,
    PartitionSnapshot,
    PartitionStateMachine,
    ProduceCommand,
)
from log import FlushPolicy, LogConfig, PartitionLog, Record, encode_batch, iter_batches
from raft import RaftConfig, RaftNode

# Small segments, so that a few commands span several of them (rolls are replicated too).
CONFIG = LogConfig(segment_bytes=600, flush=FlushPolicy(interval_records=None))


def batch(tag: str, count: int = 2) -> bytes:
    key = tag.encode()
    return encode_batch(
        [Record(key=key, value=b"%s-%d" % (key, n), timestamp_ms=1_700 + n) for n in range(count)]
    )


def command(tag: str, batches: int = 2, time_ms: int | None = 1_700_000_000_123) -> bytes:
    return ProduceCommand(
        PRODUCE_COMMAND_VERSION, tuple(batch(f"{tag}.{b}", 1 + b) for b in range(batches)), time_ms
    ).encode()


# Three commands in each of entries 1..6 (as RaftNode's group commit makes them).
COMMANDS = [((index, k), command(f"c{index}.{k}")) for index in range(1, 7) for k in range(3)]


def machine(directory: Path, fetch: Any = None) -> PartitionStateMachine:
    return PartitionStateMachine("t-0", PartitionLog.open(directory, CONFIG), fetch)


def apply_all(m: PartitionStateMachine, commands: Iterable[tuple[tuple[int, int], bytes]]) -> None:
    for (index, k), data in commands:
        m.apply_at(index, k, data)


def files(directory: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(directory.iterdir()) if p.is_file()}


def log_batches(log: PartitionLog) -> list[tuple[int, bytes]]:
    """(base offset, batch bytes from byte 8) of every batch: what each replica must agree on."""
    out = []
    with log.read(log.log_start_offset, 1 << 30) as result:
        data = result.read_bytes()
    for position, header in iter_batches(data):
        out.append((header.base_offset, data[position + 8 : position + header.size_bytes]))
    return out


def crash(m: PartitionStateMachine) -> None:
    """Drop a machine as a killed process would: nothing flushed or rewritten."""
    for segment in m.log.segments:
        segment.close_files()
    m.log.closed = True


# --- the command format -----------------------------------------------------------------


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.binary(max_size=64), min_size=1, max_size=8),
    st.one_of(st.none(), st.integers(-(2**63), 2**63 - 1)),
)
def test_produce_command_round_trips(batches: list[bytes], time_ms: int | None) -> None:
    original = ProduceCommand(PRODUCE_COMMAND_VERSION, tuple(batches), time_ms)
    encoded = original.encode()
    assert ProduceCommand.decode(encoded) == original
    assert len(encoded) == 15 + sum(4 + len(b) for b in batches)  # header + length prefixes


@settings(max_examples=200, deadline=None)
@given(st.lists(st.binary(max_size=32), min_size=1, max_size=4), st.data())
def test_decode_refuses_cut_or_padded_frames(batches: list[bytes], data: st.DataObject) -> None:
    encoded = ProduceCommand(PRODUCE_COMMAND_VERSION, tuple(batches), None).encode()
    cut = data.draw(st.integers(0, len(encoded) - 1))
    with pytest.raises(CommandDecodeError):
        ProduceCommand.decode(encoded[:cut])
    with pytest.raises(CommandDecodeError):
        ProduceCommand.decode(encoded + data.draw(st.binary(min_size=1, max_size=8)))


def test_decode_refuses_unknown_versions_and_flags() -> None:
    encoded = bytearray(ProduceCommand(PRODUCE_COMMAND_VERSION, (b"x",), 5).encode())
    for at, value, message in ((1, 2, "version 2"), (1, 0, "version 0"), (2, 0x03, "flags")):
        changed = bytearray(encoded)
        changed[at] = value
        with pytest.raises(CommandDecodeError, match=message):
            ProduceCommand.decode(bytes(changed))
    with pytest.raises(CommandDecodeError, match="magic"):
        ProduceCommand.decode(b"Q" + bytes(encoded[1:]))
    with pytest.raises(ValueError, match="version"):
        ProduceCommand(2, (b"x",), None).encode()


# --- apply --------------------------------------------------------------------------------


def test_apply_assigns_offsets_at_the_log_end_and_commits_them(tmp_path: Path) -> None:
    m = machine(tmp_path)
    assert m.apply_at(1, 0, command("a", batches=3)) == [0, 1, 3]  # batches of 1, 2, 3
    assert m.apply_at(1, 1, command("b", batches=1)) == [6]
    assert m.log.log_end_offset == m.log.high_watermark == 7
    records = m.log.read_records(0, 1 << 20)
    assert [r.offset for r in records] == list(range(7))
    assert {r.timestamp_ms for r in records} == {1_700_000_000_123}  # the command's time
    bad = ProduceCommand(PRODUCE_COMMAND_VERSION, (b"not a batch" * 6, batch("ok")), None)
    results = m.apply_at(2, 0, bad.encode())
    assert results is not None and isinstance(results[0], Exception) and results[1] == 7
    with pytest.raises(CommandDecodeError):  # a newer command stops this replica
        m.apply_at(3, 0, b"P\x09" + bytes(13))
    with pytest.raises(TypeError):
        m.apply(command("c"))


def test_two_replicas_given_the_same_commands_hold_identical_bytes(tmp_path: Path) -> None:
    a, b = machine(tmp_path / "a"), machine(tmp_path / "b")
    apply_all(a, COMMANDS)
    apply_all(b, COMMANDS)
    a.checkpoint()
    b.checkpoint()
    assert len([n for n in files(tmp_path / "a") if n.endswith(".log")]) > 3
    assert files(tmp_path / "a") == files(tmp_path / "b")


# --- replay after a restart ---------------------------------------------------------------


def reference(tmp_path: Path) -> list[tuple[int, bytes]]:
    ref = machine(tmp_path / "reference")
    apply_all(ref, COMMANDS)
    return log_batches(ref.log)


def test_a_full_journal_replay_after_a_crash_appends_nothing_twice(tmp_path: Path) -> None:
    m = machine(tmp_path / "r")
    apply_all(m, COMMANDS)
    crash(m)
    again = machine(tmp_path / "r")
    apply_all(again, COMMANDS)  # pysyncobj with no snapshot replays from index 1
    assert log_batches(again.log) == reference(tmp_path)
    assert again.replayed_commands == len(COMMANDS)
    end = again.log.log_end_offset
    assert again.apply_at(7, 0, command("new")) == [end, end + 1]  # continues at the end
    assert again.log.high_watermark == again.log.log_end_offset == end + 3


def test_replay_after_the_checkpoint_lost_records_cuts_the_log_and_reapplies(
    tmp_path: Path,
) -> None:
    m = machine(tmp_path / "r")
    apply_all(m, COMMANDS[:6])
    m.snapshot()  # durable: the checkpoint is one record, at (2, 2)
    apply_all(m, COMMANDS[6:])
    m.log.flush()  # the log reached the disk, the checkpoint records after (2, 2) did not
    checkpoint = tmp_path / "r" / APPLIED_CHECKPOINT
    checkpoint.write_bytes(checkpoint.read_bytes()[:24] + b"\x01" * 10)  # and a torn tail
    crash(m)
    again = machine(tmp_path / "r")
    assert again.applied == (2, 2)
    apply_all(again, COMMANDS)  # the journal after the snapshot at (2, 2)
    assert log_batches(again.log) == reference(tmp_path)
    assert again.replayed_commands == 6


def test_replay_after_the_log_lost_its_tail_reapplies_from_the_checkpoint(tmp_path: Path) -> None:
    m = machine(tmp_path / "r")
    apply_all(m, COMMANDS)
    crash(m)
    # The page cache lost the end of the active segment: cut it in the middle of a batch.
    active = max((tmp_path / "r").glob("*.log"))
    data = active.read_bytes()
    positions = [p for p, _ in iter_batches(data)]
    with open(active, "r+b") as f:
        f.truncate(positions[-3] + 20)
    again = machine(tmp_path / "r")
    assert again.applied < COMMANDS[-1][0]
    apply_all(again, COMMANDS)
    assert log_batches(again.log) == reference(tmp_path)


def test_applied_data_lost_below_a_durable_checkpoint_stops_the_replica(tmp_path: Path) -> None:
    m = machine(tmp_path / "r")
    apply_all(m, COMMANDS)
    m.snapshot()
    crash(m)
    for path in (tmp_path / "r").glob("*.log"):
        path.unlink()
    with pytest.raises(Exception, match="flushed data is lost"):
        machine(tmp_path / "r")


# --- snapshot and restore -----------------------------------------------------------------


class Leader:
    """fetch_missing over another replica's log; records what was asked."""

    def __init__(self, log: PartitionLog, max_bytes: int = 1 << 20) -> None:
        self.log = log
        self.max_bytes = max_bytes
        self.asked: list[tuple[int, int]] = []

    def __call__(self, from_offset: int, to_offset: int) -> Iterator[CopiedChunk]:
        self.asked.append((from_offset, to_offset))
        offset = from_offset
        while offset < to_offset:  # as dmq/peers.py fetch_batches_blocking does
            data, covered = self.log.read_for_copy(offset, to_offset, self.max_bytes)
            assert covered > offset, "the source has nothing from there"
            yield CopiedChunk(
                tuple(data[p : p + h.size_bytes] for p, h in iter_batches(data)), covered
            )
            offset = covered


def test_snapshot_is_metadata_only(tmp_path: Path) -> None:
    m = machine(tmp_path)
    apply_all(m, COMMANDS)
    snap = m.snapshot()
    assert len(snap) < 200
    assert PartitionSnapshot.decode(snap) == PartitionSnapshot(
        "t-0", 0, m.log.log_end_offset, COMMANDS[-1][0], producers="{}"
    )


def test_restore_of_a_covered_snapshot_does_nothing(tmp_path: Path) -> None:
    leader = machine(tmp_path / "leader")
    apply_all(leader, COMMANDS)
    snap = leader.snapshot()
    fetch = Leader(leader.log)
    follower = machine(tmp_path / "follower", fetch)
    apply_all(follower, COMMANDS)
    before = files(tmp_path / "follower")
    follower.restore(snap)
    assert fetch.asked == [] and follower.applied == COMMANDS[-1][0]
    assert files(tmp_path / "follower") == before


@pytest.mark.parametrize("applied_first", [0, 7])
def test_restore_when_behind_copies_only_the_missing_range(
    tmp_path: Path, applied_first: int
) -> None:
    leader = machine(tmp_path / "leader")
    apply_all(leader, COMMANDS[:12])
    snap = leader.snapshot()
    apply_all(leader, COMMANDS[12:])  # the leader moved on after its snapshot
    fetch = Leader(leader.log)
    follower = machine(tmp_path / "follower", fetch)
    apply_all(follower, COMMANDS[:applied_first])
    start = follower.log.log_end_offset
    follower.restore(snap)
    end = PartitionSnapshot.decode(snap).log_end_offset
    assert fetch.asked == [(start, end)]
    assert follower.applied == COMMANDS[11][0] and follower.log.high_watermark == end
    apply_all(follower, COMMANDS)  # pysyncobj continues after the snapshot's index
    assert log_batches(follower.log) == log_batches(leader.log)
    crash(follower)  # and the restored state survives a restart
    again = machine(tmp_path / "follower")
    assert again.applied == COMMANDS[-1][0]
    assert log_batches(again.log) == log_batches(leader.log)


def test_restore_cuts_a_conflicting_suffix_then_copies(tmp_path: Path) -> None:
    leader = machine(tmp_path / "leader")
    apply_all(leader, COMMANDS[:9])
    snap = leader.snapshot()
    fetch = Leader(leader.log)
    follower = machine(tmp_path / "follower", fetch)
    apply_all(follower, COMMANDS[:2])
    # Data no position of the leader's log accounts for: behind in position, ahead in data.
    follower.apply_at(1, 2, command("diverged", batches=30))
    assert follower.log.log_end_offset > PartitionSnapshot.decode(snap).log_end_offset
    follower.restore(snap)
    assert log_batches(follower.log) == log_batches(leader.log)
    assert follower.applied == COMMANDS[8][0]


def test_a_restore_interrupted_by_a_crash_is_finished_by_the_next_one(tmp_path: Path) -> None:
    leader = machine(tmp_path / "leader")
    apply_all(leader, COMMANDS)
    snap = leader.snapshot()

    def failing(from_offset: int, to_offset: int) -> Iterator[CopiedChunk]:
        # One batch per chunk (max_bytes 1): the sixth answer never comes.
        for k, chunk in enumerate(Leader(leader.log, max_bytes=1)(from_offset, to_offset)):
            if k == 5:
                raise ConnectionError("leader went away")
            yield chunk

    follower = machine(tmp_path / "follower", failing)
    apply_all(follower, COMMANDS[:3])
    with pytest.raises(ConnectionError):
        follower.restore(snap)
    crash(follower)
    again = machine(tmp_path / "follower", Leader(leader.log))
    assert again.applied == POSITION_RESTORING
    assert again.log.high_watermark == again.log.log_start_offset  # nothing served meanwhile
    again.restore(snap)  # pysyncobj loads the installed snapshot again at start
    assert log_batches(again.log) == log_batches(leader.log)


# --- through a real RaftNode --------------------------------------------------------------


def test_a_raft_node_restart_replays_its_journal_without_duplicates(tmp_path: Path) -> None:
    port = free_port_on(["127.0.0.11"])
    peers = {"n1": f"127.0.0.11:{port}"}
    config = RaftConfig(log_compaction_min_entries=10)
    data = [command(f"p{n}", batches=1) for n in range(300)]

    async def run_node(commands: list[bytes]) -> tuple[list[Any], PartitionStateMachine, int]:
        """Propose `commands` on a node over the same directories; then a crash."""
        node = RaftNode("n1", peers, tmp_path / "raft", config)
        m = machine(tmp_path / "log")
        replica = await node.add_group(3, m)
        await node.start()
        proposals = []
        for k in range(0, len(commands), 2):  # two by two: many entries of a few commands
            proposals += [asyncio.create_task(replica.propose(c)) for c in commands[k : k + 2]]
            await asyncio.sleep(0.002)
        results = await asyncio.gather(*proposals)
        await node.stop()
        values.append([r.value or b"" for r in m.log.read_records(0, 1 << 24)])
        crash(m)
        return results, m, replica.snapshots_written

    values: list[list[bytes]] = []
    first, m1, snapshots = asyncio.run(asyncio.wait_for(run_node(data[:200]), 30))
    assert sorted(r[0] for r in first) == list(range(200))  # one offset each, dense
    assert snapshots >= 1  # the journal was compacted: replay starts after a snapshot
    second, m2, _ = asyncio.run(asyncio.wait_for(run_node(data[200:]), 30))
    assert sorted(r[0] for r in second) == list(range(200, 300))
    assert values[0] == values[1][:200]  # the restart appended nothing before the new ones
    assert sorted(values[1]) == sorted(b"p%d.0-0" % n for n in range(300))  # each once
    assert m2.replayed_commands > 0  # pysyncobj did replay entries the log already held


def test_three_nodes_hold_identical_segment_bytes(tmp_path: Path) -> None:
    hosts = [f"127.0.0.{11 + k}" for k in range(3)]
    port = free_port_on(hosts)
    peers = {f"n{k + 1}": f"{host}:{port}" for k, host in enumerate(hosts)}

    async def scenario() -> list[PartitionStateMachine]:
        nodes = [RaftNode(node_id, peers, tmp_path / node_id / "raft") for node_id in peers]
        machines = [machine(tmp_path / node_id / "log") for node_id in peers]
        replicas = [await n.add_group(5, m) for n, m in zip(nodes, machines, strict=True)]
        for n in nodes:
            await n.start()
        # Through every node (followers forward to the leader), concurrently.
        results = await asyncio.gather(
            *(replicas[k % 3].propose(c, timeout_s=10) for k, (_, c) in enumerate(COMMANDS))
        )
        bases = sorted(r[0] for r in results)
        assert bases == [3 * i for i in range(len(COMMANDS))]  # dense, each once
        assert all(r[1] == r[0] + 1 for r in results)
        # Followers apply once the next append_entries says committed. Waited for on the
        # machines' own logs: Raft's last_applied once equalled the commit index on every
        # node while one machine's log still lacked the last commands (a full run, 2
        # workers), and the comparison below then saw a follower two segments short.
        for _ in range(500):
            statuses = [r.status() for r in replicas]
            commit = max(status.commit_index for status in statuses)
            if all(status.last_applied == commit for status in statuses) and all(
                m.log.log_end_offset == 3 * len(COMMANDS) for m in machines
            ):
                break
            await asyncio.sleep(0.02)
        for n in nodes:
            await n.stop()
        return machines

    machines = asyncio.run(asyncio.wait_for(scenario(), 30))
    logs = [
        {name: data for name, data in files(m.log.directory).items() if name.endswith(".log")}
        for m in machines
    ]
    assert logs[0] and logs[0] == logs[1] == logs[2]
    assert all(m.log.log_end_offset == 3 * len(COMMANDS) for m in machines)
