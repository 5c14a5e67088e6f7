"""Proves that a snapshot restore copies from a compacted replica (dmq/partition/machine.py
`_copy_missing`, log/README.md invariants 12 and 13):

- when the source's compaction thinned the last batch before the snapshot's end (its last
  record removed) or removed the last batches whole, the copy is accepted, the new
  replica's log ends exactly at the snapshot's end, holds the source's surviving records
  below it, and after applying the commands that follow it ends where the source does;
- the same from segments compacted the old way (a thinned batch ending at its last kept
  record, as dmq wrote before compaction kept batch ends): the source vouches for the
  lost tail and the log rolls to the snapshot's end;
- a copy that ends short without the source vouching for the rest stops the node
  (StorageError), and so does a source contradicting itself (a batch below the offset it
  vouched for, or vouching past the snapshot's end).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from dmq.partition.machine import (
    PRODUCE_COMMAND_VERSION,
    CopiedChunk,
    PartitionSnapshot,
    PartitionStateMachine,
    ProduceCommand,
)
from log import FlushPolicy, LogConfig, PartitionLog, Record, StorageError, compaction
from log import records as fmt
from log.config import CleanupPolicy
from log.records import iter_batches

COMPACTED = LogConfig(
    segment_bytes=300,
    cleanup_policy=CleanupPolicy.COMPACT,
    flush=FlushPolicy(interval_records=None),
)
HOT = 3  # hot keys, rewritten over and over


def command(records: list[tuple[str, str]]) -> bytes:
    batch = fmt.encode_batch(
        [Record(key=k.encode(), value=v.encode(), timestamp_ms=1) for k, v in records]
    )
    return ProduceCommand(PRODUCE_COMMAND_VERSION, (batch,), None).encode()


def history(tail: str) -> tuple[list[bytes], int]:
    """Commands, and how many come before the snapshot. Odd commands put a unique key
    before a hot one. The last command before the snapshot is a thinned batch's
    ([unique, hot]) or a hot-only batch (removed whole); the commands after the snapshot
    rewrite every hot key, so compaction removes each hot record below the snapshot."""
    commands = [
        command(([(f"u{i}", f"u{i}")] if i % 2 else []) + [(f"hot{i % HOT}", f"v{i}")])
        for i in range(20)
    ]
    commands.append(
        command([("u-tail", "x"), ("hot0", "tail")] if tail == "thinned" else [("hot0", "tail")])
    )
    before_snapshot = len(commands)
    commands += [command([(f"hot{h}", f"last{h}")]) for h in range(HOT)]
    commands += [command([(f"filler{j}", "f" * 40)]) for j in range(4)]
    return commands, before_snapshot


class Source:
    """fetch_missing over a replica's log, as dmq/peers.py fetch_batches_blocking and the
    internal batches route do it (PartitionLog.read_for_copy)."""

    def __init__(self, log: PartitionLog, max_bytes: int) -> None:
        self.log = log
        self.max_bytes = max_bytes

    def __call__(self, start: int, end: int) -> Iterator[CopiedChunk]:
        offset = start
        while offset < end:
            data, covered = self.log.read_for_copy(offset, end, self.max_bytes)
            assert covered > offset
            yield CopiedChunk(split(data), covered)
            offset = covered


def split(data: bytes) -> tuple[bytes, ...]:
    return tuple(data[p : p + h.size_bytes] for p, h in iter_batches(data))


def compacted_source(
    tmp_path: Path, tail: str, legacy: bool
) -> tuple[PartitionStateMachine, bytes, list[bytes]]:
    """A replica that applied every command, snapshotted after the tail command, and
    compacted all of it (the old way if `legacy`); its snapshot; the commands."""
    commands, before_snapshot = history(tail)
    source = PartitionStateMachine("t-0", PartitionLog.open(tmp_path / "source", COMPACTED))
    snapshot = b""
    for i, data in enumerate(commands, start=1):
        source.apply_at(i, 0, data)
        if i == before_snapshot:
            snapshot = source.snapshot()
    source.log.roll()
    with pytest.MonkeyPatch.context() as patch:
        if legacy:  # dmq before this change: a thinned batch ended at its last record
            real = fmt.encode_batch

            def old_encode(
                *args: object, last_offset_delta: int | None = None, **kw: object
            ) -> bytes:
                return real(*args, **kw)  # type: ignore[arg-type]

            patch.setattr(fmt, "encode_batch", old_encode)
        compaction.compact(source.log, now_ms=10**13)
    return source, snapshot, commands


def records(log: PartitionLog, end: int) -> list[tuple[int, bytes | None, bytes | None]]:
    return [(r.offset, r.key, r.value) for r in log.read_records(0, 1 << 30, end_offset=end)]


@pytest.mark.parametrize(
    ("tail", "legacy"), [("thinned", False), ("dropped", False), ("thinned", True)]
)
@pytest.mark.parametrize("max_bytes", [1, 1 << 20])
def test_a_restore_copies_from_a_compacted_source_and_ends_at_the_snapshot(
    tmp_path: Path, tail: str, legacy: bool, max_bytes: int
) -> None:
    source, snapshot, commands = compacted_source(tmp_path, tail, legacy)
    end = PartitionSnapshot.decode(snapshot).log_end_offset
    kept_before_end = records(source.log, end)
    assert kept_before_end and kept_before_end[-1][0] < end - 1  # the tail was compacted
    last_batch_end = max(
        b.header.last_offset
        for b in source.log.read_batches(0, 1 << 30)
        if b.header.base_offset < end
    )
    # The fix keeps a thinned batch's end; a removed batch or an old segment does not.
    assert (last_batch_end == end - 1) == (tail == "thinned" and not legacy)
    follower = PartitionStateMachine(
        "t-0", PartitionLog.open(tmp_path / "follower", COMPACTED), Source(source.log, max_bytes)
    )
    follower.restore(snapshot)
    assert follower.log.log_end_offset == end == follower.log.high_watermark
    assert records(follower.log, end) == kept_before_end
    for i, data in enumerate(commands, start=1):
        if (i, 0) > follower.applied:
            follower.apply_at(i, 0, data)
    assert follower.log.log_end_offset == source.log.log_end_offset
    follower.close()
    follower.log.close()
    again = PartitionStateMachine("t-0", PartitionLog.open(tmp_path / "follower", COMPACTED))
    assert again.log.log_end_offset == source.log.log_end_offset  # and after a restart
    assert records(again.log, end) == kept_before_end


def test_a_short_copy_the_source_does_not_vouch_for_stops_the_node(tmp_path: Path) -> None:
    source, snapshot, _ = compacted_source(tmp_path, "dropped", legacy=False)
    end = PartitionSnapshot.decode(snapshot).log_end_offset

    def unvouched(start: int, stop: int) -> Iterator[CopiedChunk]:
        """A source that vouches only up to its last batch (dmq before this change)."""
        with source.log.read(start, 1 << 30, end_offset=stop) as raw:
            data, next_offset = raw.read_bytes(), raw.next_offset
        yield CopiedChunk(split(data), next_offset)

    follower = PartitionStateMachine(
        "t-0", PartitionLog.open(tmp_path / "follower", COMPACTED), unvouched
    )
    with pytest.raises(StorageError, match=f"snapshot ends at {end}"):
        follower.restore(snapshot)


@pytest.mark.parametrize("lie", ["batch below what it vouched for", "vouches past the end"])
def test_a_source_contradicting_itself_stops_the_node(tmp_path: Path, lie: str) -> None:
    source, snapshot, _ = compacted_source(tmp_path, "thinned", legacy=False)
    end = PartitionSnapshot.decode(snapshot).log_end_offset
    data, _ = source.log.read_for_copy(0, end, 1 << 30)
    batches = split(data)

    def lying(start: int, stop: int) -> Iterator[CopiedChunk]:
        if lie == "vouches past the end":
            yield CopiedChunk(batches, stop + 1)
        else:  # claims a gap up to the last batch's base, then sends the batch
            last = fmt.read_header(batches[-1])
            yield CopiedChunk(batches[:-2], last.base_offset + 1)
            yield CopiedChunk(batches[-2:], stop)

    follower = PartitionStateMachine(
        "t-0", PartitionLog.open(tmp_path / "follower", COMPACTED), lying
    )
    with pytest.raises(StorageError):
        follower.restore(snapshot)
