"""Proves that forgetting aborted ranges (TrimCommand, dmq/partition/transactions.py
"Forgetting aborted ranges") changes no read_committed answer, and is the same on every
replica.

Two replicas of one partition (real PartitionStateMachines on real logs, small segments)
apply the same journal: transactional batches of three producers, plain batches, commit
and abort markers (bumped), and the TrimCommands the leader (replica A) proposes at any
horizon up to its own clean offset (its log start, or the end of its last compaction
pass). Each replica runs retention (delete policy: by record time) or compaction
(compact policy) on its own clock, restarts (journal replayed) and, for B, installs A's
snapshot (also after missing commands: it keeps its local data, copies the rest from A). Each has a twin that applies the same commands but never a trim, and cleans
the same way. Checked after every step, for every offset a reader may start at (log start
to LSO): read_committed returns the same records from each replica as from its twin; the
replicated list is the same on both replicas; and once both have cleaned up to the
leader's horizon, nothing older is left.
"""

from __future__ import annotations

import json
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dmq.partition.machine import (
    PRODUCE_COMMAND_VERSION,
    CopiedChunk,
    FetchMissing,
    PartitionSnapshot,
    PartitionStateMachine,
    ProduceCommand,
    TrimCommand,
)
from dmq.partition.transactions import TransactionStates, encode_marker, visible_records
from log import (
    CleanupPolicy,
    FlushPolicy,
    LogConfig,
    PartitionLog,
    Record,
    compaction,
    encode_batch,
)
from log.records import iter_batches

RETENTION_MS = 10_000
PRODUCERS = 2


def _config(policy: CleanupPolicy) -> LogConfig:
    return LogConfig(
        segment_bytes=400,
        retention_ms=RETENTION_MS,
        cleanup_policy=policy,
        delete_retention_ms=0,
        flush=FlushPolicy(interval_records=None),
    )


@dataclass
class Replica:
    directory: Path
    config: LogConfig
    machine: PartitionStateMachine = field(init=False)

    def __post_init__(self) -> None:
        self.machine = self._open()

    def _open(self) -> PartitionStateMachine:
        return PartitionStateMachine("t-0", PartitionLog.open(self.directory, self.config))

    def apply(self, index: int, command: bytes) -> None:
        self.machine.apply_at(index, 0, command)

    def restart(self, journal: list[bytes | None]) -> None:
        self.machine.close()
        self.machine.log.close()
        self.machine = self._open()
        for index, command in enumerate(journal, start=1):
            if command is not None:
                self.apply(index, command)

    def clean(self, now_ms: int) -> None:
        """Retention or one compaction pass, then the machine's after_cleaning hook (as
        PartitionReplica.maybe_clean does)."""
        m = self.machine
        log = m.log
        log.maybe_delete_segments(now_ms)
        compacted_below = None
        if self.config.compacts:
            plan = compaction.plan_compaction(
                log, stable_offset=m.last_stable_offset, aborted=m.transactions.aborted
            )
            if plan is not None:
                last = plan.segments[-1].base_offset
                end = next(s.next_offset for s in log.segments if s.base_offset == last)
                result = compaction.build_compaction(plan, now_ms)
                if compaction.install_compaction(log, result):
                    compacted_below = end
        m.after_cleaning(compacted_below)

    def reads(self) -> dict[int, list[tuple[int, bytes | None, bytes | None]]]:
        """What read_committed returns from offsets a reader may start at: the log
        start, the LSO and evenly spread ones between (every offset is checked over the
        examples)."""
        m = self.machine
        log = m.log
        end = m.last_stable_offset
        out: dict[int, list[tuple[int, bytes | None, bytes | None]]] = {}
        if end < log.log_start_offset:  # retention passed an open transaction's start
            return out
        starts = {log.log_start_offset, end, *range(log.log_start_offset + 1, end, 7)}
        for start in sorted(starts):
            aborted = m.transactions.aborted_between(start, end)
            records, _ = visible_records(
                log.read_batches(start, 1 << 30, end_offset=end), start, end, aborted, 1 << 30
            )
            out[start] = [(r.offset, r.key, r.value) for r in records]
        return out


def _copy_from(source: PartitionLog) -> FetchMissing:
    """fetch_missing over another replica's log (what the broker does over HTTP)."""

    def fetch(start: int, end: int) -> Iterator[CopiedChunk]:
        while start < end:
            data, covered = source.read_for_copy(start, end, 1 << 20)
            batches = [data[p : p + h.size_bytes] for p, h in iter_batches(data)]
            yield CopiedChunk(tuple(batches), covered)
            if covered <= start:
                return
            start = covered

    return fetch


Step = tuple  # type: ignore[type-arg]
steps_strategy = st.lists(
    st.one_of(
        st.tuples(st.just("txn"), st.integers(0, PRODUCERS - 1), st.integers(0, 3)),
        st.tuples(st.just("plain"), st.integers(0, 3)),
        # Mostly aborts, mostly the leader cleaning: B then lags A's horizon.
        st.tuples(st.just("end"), st.integers(0, PRODUCERS - 1), st.sampled_from([0, 0, 1])),
        st.tuples(st.just("end"), st.integers(0, PRODUCERS - 1), st.sampled_from([0, 0, 1])),
        st.tuples(st.just("clean"), st.sampled_from("AAAB"), st.integers(0, 90)),
        st.tuples(st.just("trim"), st.sampled_from([1.0, 1.0, 0.5, 0.0])),
        st.tuples(st.just("restart"), st.sampled_from("AB")),
        st.tuples(st.just("install")),
        st.tuples(st.just("lag")),
    ),
    min_size=30,
    max_size=90,
)


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    policy=st.sampled_from([CleanupPolicy.DELETE, CleanupPolicy.COMPACT]),
    steps=steps_strategy,
)
def test_trimming_changes_no_read_committed_answer_and_agrees_on_every_replica(
    policy: CleanupPolicy, steps: list[Step]
) -> None:
    config = _config(policy)
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        replicas = {n: Replica(root / n, config) for n in ("A", "B", "A0", "B0")}
        journal: list[bytes] = []  # every command, trims included
        untrimmed: list[bytes | None] = []  # the twins' journal: trims left out
        epochs = [0] * PRODUCERS
        open_txn = [False] * PRODUCERS
        clock = [0]

        lagging = [False]  # B (and B0) cut off: commands reach them by a snapshot

        def append(command: bytes, trim: bool = False) -> None:
            journal.append(command)
            untrimmed.append(None if trim else command)
            for name, r in replicas.items():
                if (trim and name.endswith("0")) or (lagging[0] and name.startswith("B")):
                    continue
                r.apply(len(journal), command)

        def produce(batch: bytes) -> None:
            append(ProduceCommand(PRODUCE_COMMAND_VERSION, (batch,), None).encode())

        for step in steps:
            clock[0] += 1
            now = clock[0] * 1_000
            kind = step[0]
            if kind == "txn":
                p, key = step[1], step[2]
                records = [Record(b"k%d" % key, b"v%d" % clock[0], (), now)]
                produce(
                    encode_batch(
                        records,
                        producer_id=p + 1,
                        producer_epoch=epochs[p],
                        base_sequence=-1,
                        is_transactional=True,
                    )
                )
                open_txn[p] = True
            elif kind == "plain":
                produce(encode_batch([Record(b"k%d" % step[1], b"p%d" % clock[0], (), now)]))
            elif kind == "end" and open_txn[step[1]]:
                p, commit = step[1], bool(step[2])
                produce(encode_marker(p + 1, epochs[p] + 1, commit, now, epochs[p]))
                epochs[p] += 1
                open_txn[p] = False
            elif kind == "clean":
                # A replica and its twin clean the same way, at the same time.
                name, at = step[1], step[2] * 1_000 + RETENTION_MS
                replicas[name].clean(at)
                replicas[name + "0"].clean(at)
            elif kind == "trim":
                leader = replicas["A"].machine
                horizon = int(leader.clean_below * step[1])
                if leader.transactions.can_trim(horizon) or step[1] > 0.5:
                    append(TrimCommand(horizon).encode(), trim=True)
            elif kind == "lag":
                lagging[0] = True
            elif kind == "restart":
                replicas[step[1]].restart(journal)
                replicas[step[1] + "0"].restart(untrimmed)
                lagging[0] = lagging[0] and step[1] == "A"
            elif kind == "install":
                lagging[0] = False
                # B installs A's snapshot (B0 A0's), keeping or copying its local data.
                for src, dst in (("A", "B"), ("A0", "B0")):
                    source = replicas[src].machine
                    snapshot = source.snapshot()
                    replicas[dst].machine.fetch_missing = _copy_from(source.log)
                    replicas[dst].machine.restore(snapshot)
            for name in ("A", "B"):
                assert replicas[name].reads() == replicas[name + "0"].reads(), (name, step)
            if not lagging[0]:
                a, b = replicas["A"].machine.transactions, replicas["B"].machine.transactions
                assert a.replicated_aborted == b.replicated_aborted
                assert a.trim_horizon == b.trim_horizon
        if lagging[0]:  # B catches up by A's snapshot
            lagging[0] = False
            for src, dst in (("A", "B"), ("A0", "B0")):
                replicas[dst].machine.fetch_missing = _copy_from(replicas[src].machine.log)
                replicas[dst].machine.restore(replicas[src].machine.snapshot())
        # Both clean everything retention or compaction can; the leader trims: nothing
        # below the horizon is left in the replicated list, nor kept where it is gone.
        for name in ("A", "B", "A0", "B0"):
            replicas[name].clean(clock[0] * 1_000 + 10 * RETENTION_MS)
        leader = replicas["A"].machine
        horizon = leader.clean_below
        if leader.transactions.can_trim(horizon):
            append(TrimCommand(horizon).encode(), trim=True)
        for name in ("A", "B"):
            t = replicas[name].machine.transactions
            assert all(r[2] >= horizon for r in t.replicated_aborted)
            clean = replicas[name].machine.clean_below
            assert all(r[2] >= clean for r in t.aborted if r[2] < horizon)
            assert replicas[name].reads() == replicas[name + "0"].reads()
        for r in replicas.values():
            r.machine.close()
            r.machine.log.close()


def test_state_from_before_trimming_reads_as_horizon_zero_and_round_trips() -> None:
    """A stored state or snapshot document from before trimming (no `horizon`, no
    `kept`) opens unchanged; a trimmed one keeps both through its document."""
    old = TransactionStates.from_doc({"open": [[5, 20, 1]], "aborted": [[3, 1, 4], [4, 6, 9]]})
    assert old.trim_horizon == 0 and old.aborted == [(3, 1, 4), (4, 6, 9)]
    assert "horizon" not in old.to_doc() and "kept" not in old.to_doc()
    old.trim(5, clean_below=0)  # this replica's log may still hold (3, 1, 4): kept
    assert old.replicated_aborted == [(4, 6, 9)] and old.aborted == [(3, 1, 4), (4, 6, 9)]
    again = TransactionStates.from_doc(json.loads(json.dumps(old.to_doc())))
    assert (
        again.to_doc()
        == old.to_doc()
        == {
            "open": [[5, 20, 1]],
            "aborted": [[4, 6, 9]],
            "horizon": 5,
            "kept": [[3, 1, 4]],
        }
    )
    again.forget_local(5)
    assert again.aborted == [(4, 6, 9)] and again.aborted_between(0, 100) == [(4, 6, 9)]
    snapshot = PartitionSnapshot("t-0", 0, 30, (7, 0), "{}", None, json.dumps(old.to_doc()))
    assert PartitionSnapshot.decode(snapshot.encode()).transactions == snapshot.transactions


def test_a_trim_command_round_trips_and_bad_ones_are_refused() -> None:
    command = TrimCommand(1234).encode()
    assert TrimCommand.decode(command) == TrimCommand(1234)
    for bad in (command[:-1], b"T\x02" + command[2:], command + b"x"):
        try:
            TrimCommand.decode(bad)
        except ValueError:
            continue
        raise AssertionError(f"{bad!r} decoded")
