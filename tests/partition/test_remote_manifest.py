"""Proves dmq/partition/remote_manifest.py, tiered storage's replicated manifest, and its
place in the partition's state machine (dmq/partition/machine.py).

- a state machine of a partition's tiered life (hypothesis RuleBasedStateMachine): the
  log grows and rolls; leaders upload segments (with boundaries of their own, retries of
  recorded ones, uploads that leave a gap); total retention trims; replicas delete local
  segments past local retention. After every step: the manifest's invariants hold
  (contiguous, start <= end, the end is the last segment's); no replica ever deleted a
  segment that a committed add did not cover (the upload-committed-before-delete
  invariant), so every offset from the partition's first one is held locally or
  remotely; a trim leaves nothing below its offset; a refused add changes nothing;
- commands and the manifest round-trip through their encodings; decode refuses
  malformed, unknown-version and out-of-range commands;
- in the PartitionStateMachine: a remote command is applied once (replay after a restart
  skips it, and applying it again changes nothing), the manifest survives a restart
  (durable, CRC-checked), travels in the snapshot and is installed by restore.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from dmq.partition.machine import PartitionSnapshot, PartitionStateMachine
from dmq.partition.remote_manifest import (
    RemoteCommand,
    RemoteCommandError,
    RemoteManifest,
    RemoteSegment,
    apply,
    check_manifest,
    local_deletable,
)
from log import FlushPolicy, LogConfig, PartitionLog

# --- the state machine of a partition's tiered life -----------------------------------------


def seg(base: int, end: int, size: int = 100, ts: int = 0) -> RemoteSegment:
    return RemoteSegment(base, end, size, 8, ts, ts, f"p/{base:020d}-{end:020d}")


def has_gap(manifest: RemoteManifest, batch: list[RemoteSegment]) -> bool:
    """Whether recording `batch` in order would leave a gap after what came before it."""
    end = manifest.end_offset if manifest.started else None
    for s in batch:
        if end is not None and s.end_offset <= end:
            continue  # recorded already
        if end is not None and s.base_offset > end:
            return True
        end = s.end_offset
    return False


class TieredLife(RuleBasedStateMachine):
    """Local segments are (base, end, size, max_ts) with contiguous offsets; the partition's
    data is [first, log_end). Deleting locally follows `local_deletable`; the model checks
    that nothing readable is ever lost."""

    def __init__(self) -> None:
        super().__init__()
        self.manifest = RemoteManifest()
        self.local: list[tuple[int, int, int, int]] = [(0, 0, 0, 0)]  # the active one last
        self.first = 0  # the partition's first offset: total retention moves it
        self.clock = 0

    @property
    def log_end(self) -> int:
        return self.local[-1][1]

    @rule(records=st.integers(1, 50), roll=st.booleans())
    def append(self, records: int, roll: bool) -> None:
        self.clock += 1
        base, end, size, _ = self.local[-1]
        self.local[-1] = (base, end + records, size + records * 10, self.clock)
        if roll:
            self.local.append((end + records, end + records, 0, self.clock))

    @rule(data=st.data())
    def upload(self, data: st.DataObject) -> None:
        """A leader uploads closed segments from somewhere around the manifest's end, with
        boundaries that may differ from an earlier leader's."""
        closed = self.local[:-1]
        if not closed:
            return
        i = data.draw(st.integers(0, len(closed) - 1))
        count = data.draw(st.integers(1, len(closed) - i))
        shift = data.draw(st.integers(0, 5))  # another leader's boundary, a bit later
        batch = []
        for base, end, size, ts in closed[i : i + count]:
            b = base + shift if base + shift < end else base
            batch.append(seg(b, end, size, ts))
        before = self.manifest
        applied = apply(before, RemoteCommand.decode(RemoteCommand("add", tuple(batch)).encode()))
        if applied.refused is not None:
            assert applied.manifest == before  # refused: nothing changed
            assert has_gap(before, batch)
        else:
            assert not has_gap(before, batch)
        self.manifest = applied.manifest
        assert self.manifest.end_offset >= before.end_offset  # never goes back

    @rule(data=st.data())
    def trim(self, data: st.DataObject) -> None:
        """Total retention: the partition's data below `to` goes, remote first."""
        if not self.manifest.segments:
            return
        to = data.draw(st.integers(self.manifest.start_offset, self.manifest.end_offset))
        applied = apply(self.manifest, RemoteCommand("trim", start_offset=to))
        self.manifest = applied.manifest
        assert all(s.end_offset > to for s in self.manifest.segments)
        assert all(s.end_offset <= to for s in applied.removed)
        # the local log drops what lies below too (its own total retention)
        while len(self.local) > 1 and self.local[0][1] <= to:
            self.local.pop(0)
        self.first = max(self.first, min(to, self.local[0][0]))

    @rule(local_bytes=st.integers(0, 2_000), local_ms=st.none() | st.integers(0, 20))
    def delete_local(self, local_bytes: int, local_ms: int | None) -> None:
        count = local_deletable(
            self.local,
            self.manifest,
            now_ms=self.clock,
            local_retention_ms=local_ms,
            local_retention_bytes=local_bytes,
        )
        count = min(count, len(self.local) - 1)  # the log never deletes its active segment
        for base, end, _, _ in self.local[:count]:
            # upload-committed-before-delete: a committed add covers every deleted offset
            assert self.manifest.started and end <= self.manifest.end_offset
            assert self.manifest.start_offset <= base
        del self.local[:count]

    @invariant()
    def manifest_is_well_formed(self) -> None:
        check_manifest(self.manifest)
        assert RemoteManifest.from_json(self.manifest.to_json()) == self.manifest

    @invariant()
    def every_offset_from_the_first_is_held_somewhere(self) -> None:
        local_start = self.local[0][0]
        if local_start <= self.first:
            return
        # below the local log: the remote part must hold [first, local_start)
        for offset in {self.first, (self.first + local_start) // 2, local_start - 1}:
            segment = self.manifest.segment_for(offset)
            assert segment is not None, (offset, self.manifest, self.local)
            assert segment.base_offset <= offset < segment.end_offset


TestTieredLife = TieredLife.TestCase
TestTieredLife.settings = settings(max_examples=60, stateful_step_count=30, deadline=None)


# --- encodings ----------------------------------------------------------------------------

segments_st = st.lists(
    st.tuples(st.integers(0, 10**12), st.integers(1, 10**6), st.integers(0, 10**9)),
    min_size=1,
    max_size=5,
).map(lambda xs: tuple(seg(b, b + n, size) for b, n, size in xs))


@settings(max_examples=200, deadline=None)
@given(segments_st, st.integers(0, 2**62))
def test_commands_round_trip(segments: tuple[RemoteSegment, ...], start: int) -> None:
    for command in (RemoteCommand("add", segments), RemoteCommand("trim", start_offset=start)):
        assert RemoteCommand.decode(command.encode()) == command


@pytest.mark.parametrize(
    "data",
    [
        b"R",
        b"R\x02{}",
        b'R\x01{"op":"add","segments":[]}',
        b'R\x01{"op":"trim","start_offset":-1}',
        b'R\x01{"op":"drop"}',
        b'R\x01{"op":"add","segments":[{"base_offset":5,"end_offset":5}]}',
        b"R\x01not json",
        b"P\x01{}",
    ],
)
def test_decode_refuses_malformed_commands(data: bytes) -> None:
    with pytest.raises(RemoteCommandError):
        RemoteCommand.decode(data)


def test_a_retried_add_is_ignored_and_a_gap_refused() -> None:
    m = apply(RemoteManifest(), RemoteCommand("add", (seg(10, 20),))).manifest
    assert (m.start_offset, m.end_offset) == (10, 20)
    assert apply(m, RemoteCommand("add", (seg(10, 20),))).manifest == m
    refused = apply(m, RemoteCommand("add", (seg(21, 30),)))
    assert refused.manifest == m and refused.refused is not None
    overlapping = apply(m, RemoteCommand("add", (seg(15, 30),))).manifest
    assert overlapping.end_offset == 30 and overlapping.segment_for(25) == seg(15, 30)
    assert overlapping.segment_for(12) == seg(10, 20)


# --- in the partition's state machine ----------------------------------------------------

CONFIG = LogConfig(segment_bytes=600, flush=FlushPolicy(interval_records=None))


def machine(directory: Path) -> PartitionStateMachine:
    return PartitionStateMachine("t-0", PartitionLog.open(directory, CONFIG))


def test_the_machine_applies_a_remote_command_once_and_keeps_it(tmp_path: Path) -> None:
    m = machine(tmp_path)
    add = RemoteCommand("add", (seg(0, 10),)).encode()
    assert m.apply_at(1, 0, add) == [10]
    assert m.remote.end_offset == 10
    assert m.apply_at(1, 0, add) is None  # a replay of the same position: skipped
    assert m.apply_at(2, 0, add) == [10]  # the same add again (a retry): changes nothing
    trim = RemoteCommand("trim", start_offset=10).encode()
    assert m.apply_at(3, 0, trim) == [10]
    assert m.remote_removed == [seg(0, 10)]
    assert m.apply_at(4, 0, RemoteCommand("add", (seg(10, 30),)).encode()) == [30]
    snapshot = m.snapshot()
    m.close()
    m.log.close()

    again = machine(tmp_path)  # the manifest is durable
    assert again.remote == m.remote
    assert again.remote.start_offset == 10 and again.remote.end_offset == 30
    again.close()
    again.log.close()

    other = machine(tmp_path / "other")
    assert PartitionSnapshot.decode(snapshot).remote is not None
    other.restore(snapshot)
    assert other.remote == m.remote
    other.close()
    other.log.close()


def test_a_corrupt_manifest_file_stops_the_replica(tmp_path: Path) -> None:
    m = machine(tmp_path)
    m.apply_at(1, 0, RemoteCommand("add", (seg(0, 10),)).encode())
    m.close()
    m.log.close()
    path = tmp_path / "remote-manifest"
    raw = bytearray(path.read_bytes())
    raw[-2] ^= 0xFF
    path.write_bytes(bytes(raw))
    with pytest.raises(Exception, match="remote manifest"):
        machine(tmp_path)
