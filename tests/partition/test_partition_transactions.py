"""Proves transactions across partitions: the coordinator (dmq/metadata/transactions.py, the
real catalogue apply) and real partition machines (dmq/partition/machine.py on real logs,
with dmq/partition/transactions.py) driven together by hypothesis.

Any interleaving of begin/produce (server-side adds, queued behind a previous transaction
still writing its markers and written once CompleteTxn opens the next one), commit, abort,
timeout, fencing by a
new producer instance, a stale producer's late batch, a coordinator failover (the metadata
machine restored from its snapshot, the driver's progress forgotten) in the middle of
writing markers, duplicate markers, and partition restarts (reopened from disk, the
journal replayed) ends, once the driver has finished, with every transaction either fully
visible to read_committed in every partition it wrote to, or in none; visible exactly when
the coordinator decided commit. At every step read_committed never shows a record of a
transaction that is not committed (no dirty or aborted read), and stops at the LSO.

Also: the marker format, and the partition's transaction state round trip (snapshot).
"""

from __future__ import annotations

import json
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dmq.metadata.machine import (
    AbortTxn,
    AddPartitionsToTxn,
    Applied,
    CompleteTxn,
    CreateTopic,
    EndTxn,
    InitProducer,
    MetadataMachine,
    RegisterBroker,
    encode_command,
    transactions_to_abort,
    transactions_to_finish,
)
from dmq.partition.machine import PRODUCE_COMMAND_VERSION, PartitionStateMachine, ProduceCommand
from dmq.partition.transactions import (
    MARKER_ABORT,
    MARKER_COMMIT,
    TransactionStates,
    encode_marker,
    marker_type,
    visible_records,
)
from log import FlushPolicy, LogConfig, PartitionLog, Record, encode_batch

CONFIG = LogConfig(segment_bytes=2_000, flush=FlushPolicy(interval_records=None))
TIDS = ("t1", "t2")
PARTITIONS = 3
TIMEOUT_MS = 1_000


@dataclass
class Partition:
    directory: Path
    machine: PartitionStateMachine
    journal: list[bytes] = field(default_factory=list)  # every command, in Raft order

    def apply(self, batch: bytes) -> int | Exception:
        self.journal.append(ProduceCommand(PRODUCE_COMMAND_VERSION, (batch,), None).encode())
        result = self.machine.apply_at(len(self.journal), 0, self.journal[-1])
        assert result is not None
        return result[0]  # type: ignore[return-value]

    def restart(self) -> None:
        """Reopen from disk and replay the whole journal (applied commands are skipped)."""
        self.machine.close()
        self.machine.log.close()
        self.machine = PartitionStateMachine("t-0", PartitionLog.open(self.directory, CONFIG))
        for index, data in enumerate(self.journal, start=1):
            self.machine.apply_at(index, 0, data)

    def read_committed(self) -> tuple[list[str], int]:
        m = self.machine
        log = m.log
        end = m.last_stable_offset
        aborted = m.transactions.aborted_between(0, end)
        records, _ = visible_records(
            log.read_batches(0, 1 << 30, end_offset=end), 0, end, aborted, 1 << 30
        )
        return [r.value.decode() for r in records if r.value], end


class World:
    """The coordinator, three partitions, the producers and the driver."""

    def __init__(self, root: Path) -> None:
        self.meta = MetadataMachine()
        self.now = 1_000
        self._meta(RegisterBroker("n1", "127.0.0.1:1", "127.0.0.1:2", self.now))
        self._meta(CreateTopic("a", PARTITIONS, 1, (), self.now))
        self.parts = []
        for p in range(PARTITIONS):
            directory = root / f"a-{p}"
            log = PartitionLog.open(directory, CONFIG)
            self.parts.append(Partition(directory, PartitionStateMachine("t-0", log)))
        self.producers: dict[str, tuple[int, int]] = {}
        self.sequences: dict[tuple[str, int, int], int] = {}  # (tid, epoch, partition) -> next
        # transaction key (tid, epoch, started_ms) -> partitions its batches were written to
        self.written: dict[tuple[str, int, int], set[int]] = {}
        self.decided: dict[tuple[str, int, int], str] = {}  # key -> prepare_commit/abort
        self.stale: list[tuple[str, int, int, int]] = []  # (tid, pid, epoch, started) fenced
        # (tid, pid, epoch, partition): adds queued behind a prepare_*, written once the
        # CompleteTxn of that transaction opens the next one
        self.waiting: list[tuple[str, int, int, int]] = []
        self.fenced: set[tuple[str, int, int]] = set()  # keys the coordinator aborted

    def _meta(self, command: object) -> object:
        self.now += 7
        return self.meta.apply(encode_command(command))  # type: ignore[arg-type]

    def txn_key(self, tid: str) -> tuple[str, int, int] | None:
        txn = self.meta.state.transactions.get(tid)
        if txn is None:
            return None
        return (tid, txn.producer_epoch, txn.started_ms)

    def init(self, tid: str) -> None:
        old = self.producers.get(tid)
        result = self._meta(InitProducer(tid, self.now))
        assert isinstance(result, Applied) and result.producer is not None
        self.producers[tid] = result.producer
        key = self.txn_key(tid)
        if old is not None and key is not None:
            self.stale.append((tid, old[0], old[1], key[2]))

    def produce(self, tid: str, partition: int) -> None:
        if tid not in self.producers:
            return
        pid, epoch = self.producers[tid]
        add = AddPartitionsToTxn(tid, pid, epoch, (f"a:{partition}",), TIMEOUT_MS, self.now)
        if not isinstance(self._meta(add), Applied):
            return
        self._maybe_write(tid, pid, epoch, partition)

    def _maybe_write(self, tid: str, pid: int, epoch: int, partition: int) -> None:
        """As the broker after an applied add: write once the transaction is ongoing with
        the partition; an add queued behind the previous transaction's markers waits
        (until CompleteTxn opens the next transaction, `markers`)."""
        txn = self.meta.state.transactions[tid]
        if txn.state == "ongoing" and f"a:{partition}" in txn.partitions:
            key = self.txn_key(tid)
            assert key is not None
            self._write(key, pid, epoch, partition)
        elif f"a:{partition}" in txn.next_partitions:
            self.waiting.append((tid, pid, epoch, partition))

    def _write(self, key: tuple[str, int, int], pid: int, epoch: int, partition: int) -> None:
        tid = key[0]
        seq = self.sequences.get((tid, epoch, partition), 0)
        value = f"{key[0]}|{key[1]}|{key[2]}|{seq}"
        batch = encode_batch(
            [Record(None, value.encode(), (), self.now)], producer_id=pid,
            producer_epoch=epoch, base_sequence=seq, is_transactional=True,
        )  # fmt: skip
        result = self.parts[partition].apply(batch)
        if isinstance(result, int):
            self.sequences[(tid, epoch, partition)] = seq + 1
            self.written.setdefault(key, set()).add(partition)

    def late_batch(self, partition: int) -> None:
        """A fenced producer's batch that was in flight: the partition must refuse it or
        keep it out of read_committed (it fenced the epoch with the abort's marker)."""
        if not self.stale:
            return
        tid, pid, epoch, started = self.stale[-1]
        key = (tid, epoch, started)
        if self.decided.get(key) != "prepare_abort" or self.meta.state.transactions[tid].is_open:
            return  # only once its abort is complete (the markers are there)
        if key not in self.fenced:
            # The producer's own abort keeps its epoch: a batch it delayed past its own
            # markers is the known gap of dmq/README.md (no epoch bump per transaction).
            return
        if partition not in self.written.get(key, set()):
            return  # a batch is appended only after its add: in a partition it added
        self._write(key, pid, epoch, partition)

    def end(self, tid: str, commit: bool) -> None:
        if tid not in self.producers:
            return
        pid, epoch = self.producers[tid]
        if isinstance(self._meta(EndTxn(tid, pid, epoch, int(commit), self.now)), Applied):
            self._note_decision(tid)

    def _note_decision(self, tid: str) -> None:
        txn = self.meta.state.transactions[tid]
        key = self.txn_key(tid)
        if key is not None and txn.state in ("prepare_commit", "prepare_abort"):
            self.decided.setdefault(key, txn.state)

    def coordinator_aborts(self) -> None:
        for tid, reason in transactions_to_abort(self.meta.state, self.now):
            txn = self.meta.state.transactions[tid]
            if isinstance(self._meta(AbortTxn(tid, txn.producer_epoch, reason, self.now)), Applied):
                self._note_decision(tid)
                key = self.txn_key(tid)
                if key is not None:
                    self.fenced.add(key)  # its markers carry epoch + 1

    def markers(self, tid: str, subset: int, complete: bool) -> None:
        """The driver: markers to some (a failover cuts it short) or all partitions."""
        for t, txn in transactions_to_finish(self.meta.state):
            if t != tid:
                continue
            commit = txn.state == "prepare_commit"
            targets = [int(p.split(":")[1]) for p in txn.partitions]
            if not complete:
                targets = [p for p in targets if subset >> p & 1]
            for p in targets:
                self.parts[p].apply(encode_marker(txn.producer_id, txn.marker_epoch, commit, 1))
            if complete:
                self._meta(CompleteTxn(tid, txn.producer_epoch, txn.state, self.now))
                waiting = [w for w in self.waiting if w[0] == tid]
                self.waiting = [w for w in self.waiting if w[0] != tid]
                for _, pid, epoch, partition in waiting:
                    if self.producers.get(tid) == (pid, epoch):
                        self._maybe_write(tid, pid, epoch, partition)

    def failover(self) -> None:
        restored = MetadataMachine()
        restored.restore(self.meta.snapshot())
        assert restored.snapshot() == self.meta.snapshot()
        self.meta = restored

    def settle(self) -> None:
        """The producers are gone: time passes, the driver aborts and finishes all."""
        for _ in range(2):  # twice: a complete may open a queued next transaction
            self.now += 10 * TIMEOUT_MS
            self.coordinator_aborts()
            for tid in TIDS:
                self.markers(tid, 0, complete=True)
        assert not transactions_to_finish(self.meta.state)
        assert not any(t.is_open for t in self.meta.state.transactions.values())

    def check_no_dirty_read(self) -> None:
        for part in self.parts:
            values, lso = part.read_committed()
            assert lso <= part.machine.log.high_watermark
            for value in values:
                tid, epoch, started, _ = value.split("|")
                key = (tid, int(epoch), int(started))
                assert self.decided.get(key) == "prepare_commit", (value, self.decided.get(key))

    def check_atomic(self) -> None:
        visible: dict[tuple[str, int, int], set[int]] = {}
        for p, part in enumerate(self.parts):
            for value in part.read_committed()[0]:
                tid, epoch, started, _ = value.split("|")
                visible.setdefault((tid, int(epoch), int(started)), set()).add(p)
        for key, written in self.written.items():
            seen = visible.get(key, set())
            if self.decided.get(key) == "prepare_commit":
                assert seen == written, (key, seen, written)
            else:
                assert not seen, (key, seen, self.decided.get(key))


STEP = st.one_of(
    st.tuples(st.just("init"), st.sampled_from(TIDS)),
    st.tuples(st.just("produce"), st.sampled_from(TIDS), st.integers(0, PARTITIONS - 1)),
    st.tuples(st.just("produce"), st.sampled_from(TIDS), st.integers(0, PARTITIONS - 1)),
    st.tuples(st.just("commit"), st.sampled_from(TIDS)),
    st.tuples(st.just("abort"), st.sampled_from(TIDS)),
    st.tuples(st.just("time"), st.integers(0, 2 * TIMEOUT_MS)),
    st.tuples(
        st.just("coordinator"),
    ),
    st.tuples(st.just("markers"), st.sampled_from(TIDS), st.integers(0, 7), st.booleans()),
    st.tuples(
        st.just("failover"),
    ),
    st.tuples(st.just("restart"), st.integers(0, PARTITIONS - 1)),
    st.tuples(st.just("late"), st.integers(0, PARTITIONS - 1)),
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(STEP, max_size=40))
def test_every_transaction_is_visible_everywhere_or_nowhere(steps: list[tuple]) -> None:  # type: ignore[type-arg]
    with tempfile.TemporaryDirectory() as root:
        world = World(Path(root))
        for step in steps:
            match step:
                case ("init", tid):
                    world.init(tid)
                case ("produce", tid, partition):
                    world.produce(tid, partition)
                case ("commit", tid):
                    world.end(tid, True)
                case ("abort", tid):
                    world.end(tid, False)
                case ("time", ms):
                    world.now += ms
                case ("coordinator",):
                    world.coordinator_aborts()
                case ("markers", tid, subset, complete):
                    world.markers(tid, subset, complete)
                case ("failover",):
                    world.failover()
                case ("restart", partition):
                    world.parts[partition].restart()
                case ("late", partition):
                    world.late_batch(partition)
            world.check_no_dirty_read()
        world.settle()
        world.check_no_dirty_read()
        world.check_atomic()
        for part in world.parts:  # nothing open is left: the LSO is the high watermark
            assert part.machine.last_stable_offset == part.machine.log.high_watermark
            part.restart()
            assert part.machine.last_stable_offset == part.machine.log.high_watermark
        world.check_atomic()


def test_a_fenced_producers_late_batch_is_refused_after_the_abort_markers() -> None:
    with tempfile.TemporaryDirectory() as root:
        world = World(Path(root))
        world.init("t1")
        world.produce("t1", 0)
        world.produce("t1", 1)
        world.init("t1")  # a new instance: fences the first, whose transaction is open
        world.coordinator_aborts()
        world.markers("t1", 0, complete=True)
        before = [len(p.journal) for p in world.parts]
        world.late_batch(1)  # in flight from the old instance: arrives after the markers
        assert [len(p.journal) for p in world.parts] == [before[0], before[1] + 1, before[2]]
        world.produce("t1", 1)
        world.end("t1", True)
        world.markers("t1", 0, complete=True)
        world.check_no_dirty_read()
        world.settle()
        world.check_atomic()
        key = world.txn_key("t1")
        assert key is not None and key[1] == 1
        assert world.parts[1].read_committed()[0] == [f"t1|1|{key[2]}|0"]


def test_markers_round_trip_and_the_state_survives_a_snapshot_document() -> None:
    for commit, kind in ((True, MARKER_COMMIT), (False, MARKER_ABORT)):
        assert marker_type(encode_marker(7, 3, commit, 1)) == kind
    states = TransactionStates()
    header = type("H", (), {"is_transactional": True, "producer_id": 5})()
    states.on_data(header, 10)  # type: ignore[arg-type]
    states.on_marker(5, MARKER_ABORT, 14)
    states.on_data(header, 20)  # type: ignore[arg-type]
    doc = json.loads(json.dumps(states.to_doc()))
    again = TransactionStates.from_doc(doc)
    assert again.to_doc() == states.to_doc()
    assert again.last_stable_offset(30) == 20 and again.aborted_between(0, 30) == [(5, 10, 14)]
    again.forget_before(15)
    assert again.aborted == []
