"""Proves idempotent producers in the partition state machine (dmq/partition/producers.py,
dmq/partition/machine.py):

- any sequence of batches from a few producers (new ones, retries of recent batches, gaps,
  old and new epochs) is answered by a simple model: a retry of one of a producer's last 5
  batches gets its original base offset and writes nothing; a gap is refused
  (OutOfOrderSequenceError); an older epoch is refused (ProducerFencedError); every refusal
  leaves the log untouched;
- two replicas given the same commands hold byte-identical logs and give the same answers;
- after a restart (a new machine over the reopened log) the stored producer state gives
  the same answers as the replica that never stopped, for every possible next batch;
- replicas whose local compaction and retention removed different batches (a thinned
  batch keeps its base sequence with fewer records; retention deletes the prefix), which
  then crash and replay the journal after their last snapshot, or which restore a
  compacted replica's snapshot, give the same answers as a replica that kept everything.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from dmq.partition.machine import (
    PRODUCE_COMMAND_VERSION,
    CopiedChunk,
    PartitionStateMachine,
    ProduceCommand,
)
from dmq.partition.producers import (
    PRODUCER_BATCHES_KEPT,
    OutOfOrderSequenceError,
    ProducerFencedError,
)
from log import FlushPolicy, LogConfig, PartitionLog, Record, compaction, encode_batch
from log.config import CleanupPolicy
from log.records import iter_batches

CONFIG = LogConfig(segment_bytes=700, flush=FlushPolicy(interval_records=None))
COMPACTED = LogConfig(
    segment_bytes=700,
    flush=FlushPolicy(interval_records=None),
    cleanup_policy=CleanupPolicy.COMPACT,
)
RETAINED = LogConfig(segment_bytes=700, flush=FlushPolicy(interval_records=None), retention_bytes=0)

Batch = tuple[int, int, int, int]  # producer_id, epoch, base_sequence, record_count


def encode(b: Batch) -> bytes:
    pid, epoch, seq, count = b
    # Few keys, shared by every producer: compaction thins and drops their batches.
    records = [
        Record(b"k%d" % ((pid + seq + i) % 3), b"%d-%d-%d" % (pid, epoch, seq + i), timestamp_ms=1)
        for i in range(count)
    ]
    return encode_batch(records, producer_id=pid, producer_epoch=epoch, base_sequence=seq)


class Model:
    """What the answers must be, written as plainly as possible."""

    def __init__(self) -> None:
        self.producers: dict[int, tuple[int, list[tuple[int, int, int]]]] = {}
        self.end = 0

    def apply(self, b: Batch) -> int | type[Exception]:
        pid, epoch, seq, count = b
        last = seq + count - 1
        known = self.producers.get(pid)
        if known is not None and epoch < known[0]:
            return ProducerFencedError
        if known is not None and epoch == known[0]:
            for s, end, offset in known[1][-PRODUCER_BATCHES_KEPT:]:
                if (s, end) == (seq, last):
                    return offset
            if seq != known[1][-1][1] + 1:
                return OutOfOrderSequenceError
        if known is None or epoch > known[0]:
            known = (epoch, [])
        known[1].append((seq, last, self.end))
        self.producers[pid] = known
        self.end += count
        return self.end - count


def next_batches(model: Model) -> list[Batch]:
    """Candidate next batches for every known producer: retries, the next, gaps, epochs."""
    out: list[Batch] = []
    for pid, (epoch, batches) in model.producers.items():
        for s, last, _ in batches[-PRODUCER_BATCHES_KEPT - 1 :]:
            out.append((pid, epoch, s, last - s + 1))
        nxt = batches[-1][1] + 1
        out += [(pid, epoch, nxt, 1), (pid, epoch, nxt + 1, 1), (pid, epoch + 1, 0, 1)]
        if epoch > 0:
            out.append((pid, epoch - 1, nxt, 1))
    return out


def answer(m: PartitionStateMachine, position: int, b: Batch) -> int | type[Exception]:
    command = ProduceCommand(PRODUCE_COMMAND_VERSION, (encode(b),), None).encode()
    result = m.apply_at(position, 0, command)
    assert result is not None and len(result) == 1
    return result[0] if isinstance(result[0], int) else type(result[0])


@st.composite
def histories(draw: st.DrawFn) -> list[Batch]:
    model = Model()
    out: list[Batch] = []
    for _ in range(draw(st.integers(1, 40))):
        choices = next_batches(model)
        if not choices or draw(st.booleans()):
            b: Batch = (
                draw(st.integers(0, 3)),
                draw(st.integers(0, 2)),
                0,
                draw(st.integers(1, 3)),
            )
        else:
            b = draw(st.sampled_from(choices))
        model.apply(b)
        out.append(b)
    return out


@settings(max_examples=60, deadline=None)
@given(histories())
def test_answers_follow_the_model_and_survive_a_restart(history: list[Batch]) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        dirs = [Path(tmp) / "a", Path(tmp) / "b"]
        replicas = [PartitionStateMachine("t-0", PartitionLog.open(d, CONFIG)) for d in dirs]
        model = Model()
        for i, b in enumerate(history, start=1):
            expected = model.apply(b)
            for r in replicas:
                assert answer(r, i, b) == expected, (b, expected)
        for r in replicas:
            r.checkpoint()
        assert [p.read_bytes() for p in sorted(dirs[0].glob("*.log"))] == [
            p.read_bytes() for p in sorted(dirs[1].glob("*.log"))
        ]
        live = replicas[0]
        replicas[1].close()
        replicas[1].log.close()
        restarted = PartitionStateMachine("t-0", PartitionLog.open(dirs[1], CONFIG))
        position = len(history) + 1
        for b in next_batches(model):  # both get the same probes in the same order
            assert answer(restarted, position, b) == answer(live, position, b), b
            position += 1
        live.close()
        live.log.close()
        restarted.close()
        restarted.log.close()


def crash(m: PartitionStateMachine) -> None:
    """Drop a machine as a killed process would: nothing flushed or rewritten."""
    for segment in m.log.segments:
        segment.close_files()
    m.log.closed = True


def copy_from(log: PartitionLog):  # type: ignore[no-untyped-def]
    """fetch_missing over another replica's log."""

    def fetch(from_offset: int, to_offset: int) -> list[CopiedChunk]:
        with log.read(from_offset, 1 << 24, end_offset=to_offset) as result:
            data = result.read_bytes()
        batches = tuple(data[p : p + h.size_bytes] for p, h in iter_batches(data))
        return [CopiedChunk(batches, result.next_offset)]

    return fetch


@settings(max_examples=30, deadline=None)
@given(histories(), st.data())
def test_replicas_with_different_compaction_and_retention_histories_agree(
    history: list[Batch], data: st.DataObject
) -> None:
    snapshot_at = data.draw(st.integers(0, len(history)), label="snapshot_at")
    commands = [
        ProduceCommand(PRODUCE_COMMAND_VERSION, (encode(b),), None).encode() for b in history
    ]
    model = Model()
    for b in history:
        model.apply(b)
    with tempfile.TemporaryDirectory() as tmp:
        configs = {"kept": CONFIG, "compacted": COMPACTED, "retained": RETAINED}
        machines = {
            name: PartitionStateMachine("t-0", PartitionLog.open(Path(tmp) / name, config))
            for name, config in configs.items()
        }
        snapshot = b""
        for i, command in enumerate(commands, start=1):
            for m in machines.values():
                m.apply_at(i, 0, command)
            if i == snapshot_at:
                snapshot = machines["kept"].snapshot()
                machines["compacted"].snapshot()
                machines["retained"].snapshot()
        # Each cleans its own log on its own clock, then is killed and restarts: the
        # journal replays every command after its last snapshot.
        kept, compacted, retained = machines["kept"], machines["compacted"], machines["retained"]
        compacted.log.roll()  # its segments are closed: compaction may clean them all
        compaction.compact(compacted.log, now_ms=10**13)
        retained.log.roll()
        retained.log.maybe_delete_segments(now_ms=10**13)
        for name in ("compacted", "retained"):
            crash(machines[name])
            again = PartitionStateMachine("t-0", PartitionLog.open(Path(tmp) / name, configs[name]))
            for i, command in enumerate(commands, start=1):
                again.apply_at(i, 0, command)
            machines[name] = again
        # A new replica restored from a snapshot (producer state in it), the rest replayed.
        fresh = PartitionStateMachine(
            "t-0", PartitionLog.open(Path(tmp) / "fresh", CONFIG), copy_from(kept.log)
        )
        if snapshot:
            fresh.restore(snapshot)
        for i, command in enumerate(commands, start=1):
            if (i, 0) > fresh.applied:
                fresh.apply_at(i, 0, command)
        machines["fresh"] = fresh
        position = len(history) + 1
        for b in next_batches(model):  # every machine gets the same probes in order
            answers = {name: answer(m, position, b) for name, m in machines.items()}
            assert len(set(answers.values())) == 1, (b, answers)
            position += 1
        for m in machines.values():
            m.close()
            m.log.close()
