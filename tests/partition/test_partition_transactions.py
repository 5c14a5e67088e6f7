"""Proves transactions across partitions: the coordinator (dmq/metadata/transactions.py, the
real catalogue apply) and real partition machines (dmq/partition/machine.py on real logs,
with dmq/partition/transactions.py) driven together by hypothesis.

Any interleaving of begin/produce (server-side adds, queued behind a previous transaction
still writing its markers and written once CompleteTxn opens the next one), commit and
abort (each bumping the producer's epoch, KIP-890 part 2: the producer goes on with the
identity the decision returned), timeout, fencing by a new producer instance, a
coordinator failover (the metadata machine restored from its snapshot, the driver's
progress forgotten) in the middle of writing markers, partition restarts (reopened from
disk, the journal replayed), and the two races of the epoch bump:

- a produce the network delays: its add applied, its batch reaching the partition at any
  later step, also after its own transaction's markers there, or after the producer's
  next transaction began there;
- a duplicate marker (a stale coordinator's, or a retry) of any transaction, arriving at
  any later step, also after the producer's next transaction's first batch there;

(half the examples use one producer and the steps these races need, so that they happen
often: a late batch refused in about one example in five, a duplicate marker after the
next transaction's first batch in one in nine), ends, once the driver has finished, with
every transaction either fully visible to
read_committed in every partition it wrote to, or in none; visible exactly when the
coordinator decided commit. At every step read_committed never shows a record of a
transaction that is not committed (no dirty or aborted read), stops at the LSO, and
never shows a record at or past its own transaction's marker in that partition: a late
batch never joins the next transaction (a delayed batch is refused once its
transaction's marker is there).

Also: a command the disk refuses midway (a marker that aborts, then transactional
batches) leaves the transaction state as before it and applies whole on the retry; the two
races one by one, and the same races under decisions from before the bump
(`EndTxn`, unbumped markers): the checks above catch the anomaly there, so they are no
empty promise; markers' format (bumped or not) and the state's snapshot document.
"""

from __future__ import annotations

import json
import tempfile
from dataclasses import dataclass, field, replace
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dmq.metadata.machine import (
    PRODUCER_EPOCH_MAX,
    AbortTxn,
    AddPartitionsToTxn,
    Applied,
    CompleteTxn,
    CreateTopic,
    EndTxn,
    EndTxnBumpEpoch,
    InitProducer,
    InitProducerFenceable,
    MetadataMachine,
    RegisterBroker,
    encode_command,
    transactions_to_abort,
    transactions_to_finish,
)
from dmq.partition.machine import PRODUCE_COMMAND_VERSION, PartitionStateMachine, ProduceCommand
from dmq.partition.producers import DuplicateMarkerError, ProducerFencedError
from dmq.partition.transactions import (
    MARKER_ABORT,
    MARKER_COMMIT,
    TransactionStates,
    encode_marker,
    marker_type,
    read_marker,
    visible_records,
)
from log import CorruptRecordError, FlushPolicy, LogConfig, PartitionLog, Record, encode_batch
from raft.errors import ApplyDeferred
from tests_support import file_size_cap

CONFIG = LogConfig(segment_bytes=2_000, flush=FlushPolicy(interval_records=None))
TIDS = ("t1", "t2")
PARTITIONS = 3
TIMEOUT_MS = 1_000
Key = tuple[str, int, int]  # a transaction: (transactional id, epoch, started_ms)


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

    def read_committed(self) -> tuple[list[tuple[str, int]], int]:
        """(value, offset) of every record read_committed returns; the LSO."""
        m = self.machine
        log = m.log
        end = m.last_stable_offset
        aborted = m.transactions.aborted_between(0, end)
        records, _ = visible_records(
            log.read_batches(0, 1 << 30, end_offset=end), 0, end, aborted, 1 << 30
        )
        return [(r.value.decode(), r.offset) for r in records if r.value], end


@dataclass
class Delayed:
    """A produce whose add was applied, its batch still on the network."""

    key: Key
    partition: int
    batch: bytes


class World:
    """The coordinator, three partitions, the producers and the driver. `bump`: decide
    with EndTxnBumpEpoch (else EndTxn, as before the bump)."""

    def __init__(
        self, root: Path, *, bump: bool = True, first_epoch: int = 0, fenceable: bool = True
    ) -> None:
        self.bump = bump
        # Transactional ids start at this epoch (near PRODUCER_EPOCH_MAX: the boundary);
        # `fenceable`: producers start with InitProducerFenceable (as brokers), else
        # InitProducer (which hands out the last epoch).
        self.first_epoch = first_epoch
        self.fenceable = fenceable and bump
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
        # (tid, producer id, epoch, partition) -> the next sequence
        self.sequences: dict[tuple[str, int, int, int], int] = {}
        self.written: dict[Key, set[int]] = {}  # transaction -> partitions holding its batches
        self.decided: dict[Key, str] = {}  # transaction -> prepare_commit/abort
        # (tid, pid, epoch, partition): adds queued behind a prepare_*, written once the
        # CompleteTxn of that transaction opens the next one
        self.waiting: list[tuple[str, int, int, int]] = []
        self.delayed: list[Delayed] = []
        self.markers_sent: list[tuple[int, bytes]] = []  # (partition, marker) for duplicates
        self.marker_at: dict[tuple[Key, int], int] = {}  # (transaction, partition) -> offset
        self.late_refused = 0  # delayed batches refused after their transaction's marker

    def _meta(self, command: object) -> object:
        self.now += 7
        return self.meta.apply(encode_command(command))  # type: ignore[arg-type]

    def txn_key(self, tid: str) -> Key | None:
        txn = self.meta.state.transactions.get(tid)
        if txn is None:
            return None
        return (tid, txn.producer_epoch, txn.started_ms)

    def init(self, tid: str) -> None:
        state = self.meta.state
        if self.first_epoch and tid not in state.transactional_ids:
            pid = state.next_producer_id  # as if started first_epoch times before
            tids = state.transactional_ids.set(tid, (pid, self.first_epoch - 1, self.now))
            self.meta.state = replace(state, transactional_ids=tids, next_producer_id=pid + 1)
        init = InitProducerFenceable if self.fenceable else InitProducer
        result = self._meta(init(tid, self.now))
        assert isinstance(result, Applied) and result.producer is not None
        self.producers[tid] = result.producer

    def produce(self, tid: str, partition: int, delay: bool = False) -> None:
        if tid not in self.producers:
            return
        pid, epoch = self.producers[tid]
        add = AddPartitionsToTxn(tid, pid, epoch, (f"a:{partition}",), TIMEOUT_MS, self.now)
        if not isinstance(self._meta(add), Applied):
            return
        self._maybe_write(tid, pid, epoch, partition, delay)

    def _maybe_write(self, tid: str, pid: int, epoch: int, partition: int, delay: bool) -> None:
        """As the broker after an applied add: write once the transaction is ongoing with
        the partition (or put the batch on the network, `delay`); an add queued behind
        the previous transaction's markers waits (until CompleteTxn opens the next
        transaction, `markers`)."""
        txn = self.meta.state.transactions[tid]
        ongoing = txn.state == "ongoing" and (txn.producer_id, txn.producer_epoch) == (pid, epoch)
        if ongoing and f"a:{partition}" in txn.partitions:
            key = self.txn_key(tid)
            assert key is not None
            batch = self._batch(key, pid, epoch, partition)
            if delay:
                self.delayed.append(Delayed(key, partition, batch))
            else:
                self._deliver(Delayed(key, partition, batch))
        elif f"a:{partition}" in txn.next_partitions:
            self.waiting.append((tid, pid, epoch, partition))

    def _batch(self, key: Key, pid: int, epoch: int, partition: int) -> bytes:
        """The producer's next batch to `partition` (its sequence taken, as the client's)."""
        seq = self.sequences.get((key[0], pid, epoch, partition), 0)
        self.sequences[(key[0], pid, epoch, partition)] = seq + 1
        value = f"{key[0]}|{key[1]}|{key[2]}|{seq}"
        return encode_batch(
            [Record(None, value.encode(), (), self.now)], producer_id=pid,
            producer_epoch=epoch, base_sequence=seq, is_transactional=True,
        )  # fmt: skip

    def _deliver(self, sent: Delayed) -> None:
        marked = (sent.key, sent.partition) in self.marker_at
        result = self.parts[sent.partition].apply(sent.batch)
        if marked:  # its transaction ended here: the epoch its marker bumped fences it
            if self.bump:
                assert isinstance(result, ProducerFencedError), (sent, result)
            self.late_refused += isinstance(result, ProducerFencedError)
        if isinstance(result, int):
            self.written.setdefault(sent.key, set()).add(sent.partition)

    def deliver(self, i: int) -> None:
        """A delayed batch reaches its partition now."""
        if self.delayed:
            self._deliver(self.delayed.pop(i % len(self.delayed)))

    def duplicate_marker(self, i: int) -> None:
        """A marker written before arrives again (a stale coordinator's, or a retry): the
        i-th last one."""
        if self.markers_sent:
            partition, marker = self.markers_sent[-1 - i % len(self.markers_sent)]
            result = self.parts[partition].apply(marker)
            if self.bump:  # its producer has its epoch there: a duplicate, nothing written
                assert isinstance(result, ProducerFencedError), result

    def end(self, tid: str, commit: bool) -> None:
        if tid not in self.producers:
            return
        pid, epoch = self.producers[tid]
        command = (EndTxnBumpEpoch if self.bump else EndTxn)(tid, pid, epoch, int(commit), self.now)
        key = self.txn_key(tid)
        result = self._meta(command)
        if not isinstance(result, Applied):
            return
        if result.producer is not None:  # the client goes on with the bumped identity
            assert self.bump and result.producer != (pid, epoch)
            self.producers[tid] = result.producer
        if key is not None and key == self.txn_key(tid):
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

    def markers(self, tid: str, subset: int, complete: bool) -> None:
        """The driver: markers to some (a failover cuts it short) or all partitions."""
        for t, txn in transactions_to_finish(self.meta.state):
            if t != tid:
                continue
            key = self.txn_key(tid)
            assert key is not None
            commit = txn.state == "prepare_commit"
            targets = [int(p.split(":")[1]) for p in txn.partitions]
            if not complete:
                targets = [p for p in targets if subset >> p & 1]
            ended = txn.producer_epoch if txn.marker_epoch > txn.producer_epoch else None
            marker = encode_marker(txn.producer_id, txn.marker_epoch, commit, 1, ended)
            for p in targets:
                result = self.parts[p].apply(marker)
                self.markers_sent.append((p, marker))
                if isinstance(result, int):
                    self.marker_at.setdefault((key, p), result)
            if complete:
                self._meta(CompleteTxn(tid, txn.producer_epoch, txn.state, self.now))
                waiting = [w for w in self.waiting if w[0] == tid]
                self.waiting = [w for w in self.waiting if w[0] != tid]
                for _, pid, epoch, partition in waiting:
                    if self.producers.get(tid) == (pid, epoch):
                        self._maybe_write(tid, pid, epoch, partition, False)

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

    def visible(self) -> dict[Key, set[int]]:
        """Every transaction read_committed shows, and where; checks on the way that no
        record is past its own transaction's marker (a late batch in the next one)."""
        out: dict[Key, set[int]] = {}
        for p, part in enumerate(self.parts):
            records, lso = part.read_committed()
            assert lso <= part.machine.log.high_watermark
            for value, offset in records:
                tid, epoch, started, _ = value.split("|")
                key = (tid, int(epoch), int(started))
                marker = self.marker_at.get((key, p))
                assert marker is None or offset < marker, (value, offset, marker)
                out.setdefault(key, set()).add(p)
        return out

    def check_no_dirty_read(self) -> None:
        for key in self.visible():
            assert self.decided.get(key) == "prepare_commit", (key, self.decided.get(key))

    def check_atomic(self) -> None:
        visible = self.visible()
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
    st.tuples(st.just("delayed"), st.sampled_from(TIDS), st.integers(0, PARTITIONS - 1)),
    st.tuples(st.just("deliver"), st.integers(0, 7)),
    st.tuples(st.just("duplicate"), st.integers(0, 3)),
    st.tuples(st.just("commit"), st.sampled_from(TIDS)),
    st.tuples(st.just("abort"), st.sampled_from(TIDS)),
    # a decision and every marker at once: the usual case, so the producer's next
    # transaction follows often enough to meet the races above
    st.tuples(st.just("finish"), st.sampled_from(TIDS), st.booleans()),
    st.tuples(st.just("time"), st.integers(0, 2 * TIMEOUT_MS)),
    st.tuples(
        st.just("coordinator"),
    ),
    st.tuples(st.just("markers"), st.sampled_from(TIDS), st.integers(0, 7), st.booleans()),
    st.tuples(
        st.just("failover"),
    ),
    st.tuples(st.just("restart"), st.integers(0, PARTITIONS - 1)),
)


# One producer, and mostly what the two races need: its transactions follow each other
# in the same partitions, batches and markers arrive late.
RACE_STEP = st.one_of(
    st.tuples(st.just("produce"), st.just("t1"), st.integers(0, 1)),
    st.tuples(st.just("delayed"), st.just("t1"), st.integers(0, 1)),
    st.tuples(st.just("deliver"), st.integers(0, 3)),
    st.tuples(st.just("duplicate"), st.integers(0, 3)),
    st.tuples(st.just("finish"), st.just("t1"), st.booleans()),
    st.tuples(st.just("markers"), st.just("t1"), st.integers(0, 3), st.booleans()),
    st.tuples(st.just("commit"), st.just("t1")),
    st.tuples(
        st.just("failover"),
    ),
    st.tuples(st.just("restart"), st.integers(0, 1)),
)


def run(world: World, steps: list[tuple]) -> None:  # type: ignore[type-arg]
    for step in steps:
        match step:
            case ("init", tid):
                world.init(tid)
            case ("produce", tid, partition):
                world.produce(tid, partition)
            case ("delayed", tid, partition):
                world.produce(tid, partition, delay=True)
            case ("deliver", i):
                world.deliver(i)
            case ("duplicate", i):
                world.duplicate_marker(i)
            case ("commit", tid):
                world.end(tid, True)
            case ("abort", tid):
                world.end(tid, False)
            case ("finish", tid, commit):
                world.end(tid, commit)
                world.markers(tid, 0, complete=True)
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
        world.check_no_dirty_read()


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.one_of(
        st.lists(STEP, min_size=8, max_size=40), st.lists(RACE_STEP, min_size=15, max_size=40)
    )
)
def test_every_transaction_is_visible_everywhere_or_nowhere(steps: list[tuple]) -> None:  # type: ignore[type-arg]
    with tempfile.TemporaryDirectory() as root:
        world = World(Path(root))
        for tid in TIDS:  # started: most steps then do something ("init" fences them)
            world.init(tid)
        run(world, steps)
        world.settle()
        for i in range(len(world.delayed)):  # whatever is still on the network arrives
            world.deliver(i)
            world.check_no_dirty_read()
        world.settle()
        world.check_no_dirty_read()
        world.check_atomic()
        for part in world.parts:  # nothing open is left: the LSO is the high watermark
            assert part.machine.last_stable_offset == part.machine.log.high_watermark
            part.restart()
            assert part.machine.last_stable_offset == part.machine.log.high_watermark
        world.check_atomic()


# Epoch 32,767 (PRODUCER_EPOCH_MAX): producers start a few epochs below it, so inits and
# decisions cross it; the same checks (a late batch refused after its marker, every
# transaction all or nothing) hold at the boundary.
BOUNDARY_STEP = st.one_of(
    st.tuples(st.just("init"), st.sampled_from(TIDS)),
    st.tuples(st.just("produce"), st.sampled_from(TIDS), st.integers(0, PARTITIONS - 1)),
    st.tuples(st.just("delayed"), st.sampled_from(TIDS), st.integers(0, PARTITIONS - 1)),
    st.tuples(st.just("deliver"), st.integers(0, 5)),
    st.tuples(st.just("commit"), st.sampled_from(TIDS)),
    st.tuples(st.just("abort"), st.sampled_from(TIDS)),
    st.tuples(
        st.just("coordinator"),
    ),
    st.tuples(st.just("markers"), st.sampled_from(TIDS), st.integers(0, 7), st.booleans()),
    st.tuples(st.just("time"), st.integers(0, 2 * TIMEOUT_MS)),
)


def _run_at_the_boundary(steps: list[tuple], first_epoch: int, fenceable: bool) -> World:  # type: ignore[type-arg]
    with tempfile.TemporaryDirectory() as root:
        world = World(Path(root), first_epoch=first_epoch, fenceable=fenceable)
        for tid in TIDS:
            world.init(tid)
        run(world, steps)
        world.settle()
        for _ in range(len(world.delayed)):
            world.deliver(0)
            world.check_no_dirty_read()
        world.settle()
        world.check_atomic()
        for part in world.parts:
            part.machine.close()
            part.machine.log.close()
        return world


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(BOUNDARY_STEP, min_size=8, max_size=30), st.integers(32_760, 32_767))
def test_at_the_last_epoch_every_transaction_still_fences_its_late_batches(
    steps: list[tuple],
    first_epoch: int,  # type: ignore[type-arg]
) -> None:
    world = _run_at_the_boundary(steps, first_epoch, fenceable=True)
    assert all(e < PRODUCER_EPOCH_MAX for _, e in world.producers.values())


# A producer started at the last epoch it can be given (32,766; InitProducer: 32,767)
# opens a transaction, a batch is delayed, a new instance starts (the coordinator aborts
# the old transaction), the batch arrives.
LAST_EPOCH_FENCE = [
    ("produce", "t1", 0), ("delayed", "t1", 1), ("init", "t1"), ("coordinator",),
    ("markers", "t1", 0, True), ("deliver", 0),
]  # fmt: skip


def test_a_new_instance_at_the_last_epoch_moves_to_a_new_id_and_fences_the_old() -> None:
    world = _run_at_the_boundary(LAST_EPOCH_FENCE, PRODUCER_EPOCH_MAX - 1, fenceable=True)
    assert world.late_refused == 1
    assert world.producers["t1"][1] == 0  # a new producer id, epoch 0
    # InitProducer (older journals) hands out the last epoch: the abort's marker cannot
    # be bumped, and the late batch is taken (a transaction nothing closes).
    with pytest.raises(AssertionError, match="Delayed"):
        _run_at_the_boundary(LAST_EPOCH_FENCE, PRODUCER_EPOCH_MAX, fenceable=False)


# The two races, one by one: a produce of transaction N delayed past N's markers, and a
# duplicate marker of N after N + 1's first batch.
LATE_BATCH = [
    ("init", "t1"), ("produce", "t1", 0), ("delayed", "t1", 1), ("commit", "t1"),
    ("markers", "t1", 0, True), ("deliver", 0), ("produce", "t1", 1),
]  # fmt: skip
DUPLICATE_MARKER = [
    ("init", "t1"), ("produce", "t1", 0), ("produce", "t1", 1), ("abort", "t1"),
    ("markers", "t1", 0, True), ("produce", "t1", 1), ("duplicate", 0),
]  # fmt: skip


def test_a_delayed_batch_is_refused_after_its_transactions_marker() -> None:
    with tempfile.TemporaryDirectory() as root:
        world = World(Path(root))
        run(world, LATE_BATCH)
        assert world.late_refused == 1
        world.end("t1", False)
        world.markers("t1", 0, complete=True)
        world.settle()
        world.check_atomic()
        # The first transaction committed where its batch arrived in time (0), the
        # second aborted: partition 1 shows nothing.
        assert world.parts[1].read_committed()[0] == []
        assert len(world.parts[0].read_committed()[0]) == 1


def test_a_duplicate_marker_after_the_next_transactions_first_batch_changes_nothing() -> None:
    with tempfile.TemporaryDirectory() as root:
        world = World(Path(root))
        run(world, DUPLICATE_MARKER)
        machine = world.parts[1].machine
        assert list(machine.transactions.open_transactions) == [world.producers["t1"][0]]
        before = machine.log.log_end_offset
        world.duplicate_marker(0)  # again: still nothing written
        assert machine.log.log_end_offset == before
        world.end("t1", True)
        world.markers("t1", 0, complete=True)
        world.settle()
        world.check_atomic()
        assert len(world.parts[1].read_committed()[0]) == 1


@pytest.mark.parametrize("steps", [LATE_BATCH, DUPLICATE_MARKER], ids=["late", "duplicate"])
def test_without_the_bump_the_same_races_break_atomicity(steps: list[tuple]) -> None:  # type: ignore[type-arg]
    """The known gap of decisions from before the bump (EndTxn, unbumped markers): the
    checks of the property above catch it, so they prove something."""
    with tempfile.TemporaryDirectory() as root:
        world = World(Path(root), bump=False)
        with pytest.raises(AssertionError):
            run(world, steps)
            world.end("t1", True)
            world.markers("t1", 0, complete=True)
            world.settle()
            world.check_atomic()


def test_markers_round_trip_and_the_state_survives_a_snapshot_document() -> None:
    for commit, kind in ((True, MARKER_COMMIT), (False, MARKER_ABORT)):
        assert marker_type(encode_marker(7, 3, commit, 1)) == kind
        assert read_marker(encode_marker(7, 3, commit, 1)) == (kind, None)
        assert read_marker(encode_marker(7, 3, commit, 1, 2)) == (kind, 2)
    with pytest.raises(ValueError):
        encode_marker(7, 3, True, 1, 3)  # a bumped marker is above its transaction
    states = TransactionStates()
    header = type("H", (), {"is_transactional": True, "producer_id": 5, "producer_epoch": 2})()
    states.on_data(header, 10)  # type: ignore[arg-type]
    states.on_marker(5, MARKER_ABORT, 14)
    states.on_data(header, 20)  # type: ignore[arg-type]
    doc = json.loads(json.dumps(states.to_doc()))
    again = TransactionStates.from_doc(doc)
    assert again.to_doc() == states.to_doc() and again.open_epoch(5) == 2
    assert again.last_stable_offset(30) == 20 and again.aborted_between(0, 30) == [(5, 10, 14)]
    again.trim(15, clean_below=15)  # a TrimCommand past its marker, the records gone here
    assert again.aborted == [] and again.trim_horizon == 15
    # A state stored before the epoch bump: open transactions without their epoch.
    old = TransactionStates.from_doc({"open": [[5, 20]], "aborted": []})
    assert old.open_transactions == {5: 20} and old.open_epoch(5) == -1


def test_unbumped_markers_close_as_before_and_bumped_ones_check_their_epochs() -> None:
    with tempfile.TemporaryDirectory() as root:
        log = PartitionLog.open(Path(root) / "p", CONFIG)
        part = Partition(Path(root) / "p", PartitionStateMachine("t-0", log))

        def batch(epoch: int, seq: int) -> bytes:
            return encode_batch(
                [Record(None, b"v", (), 1)], producer_id=4, producer_epoch=epoch,
                base_sequence=seq, is_transactional=True,
            )  # fmt: skip

        # Before the bump: the producer's own epoch on its markers; a second one is written
        # and closes nothing; the same epoch goes on.
        assert isinstance(part.apply(batch(0, 0)), int)
        assert isinstance(part.apply(encode_marker(4, 0, True, 1)), int)
        assert isinstance(part.apply(encode_marker(4, 0, True, 1)), int)
        assert isinstance(part.apply(batch(0, 1)), int)
        assert isinstance(part.apply(encode_marker(4, 0, False, 1)), int)
        # Bumped: closes, fences epoch 0; again, it is a duplicate; an older one is fenced.
        assert isinstance(part.apply(batch(0, 2)), int)
        assert isinstance(part.apply(encode_marker(4, 1, True, 1, 0)), int)
        assert isinstance(part.apply(batch(0, 3)), ProducerFencedError)
        assert isinstance(part.apply(encode_marker(4, 1, True, 1, 0)), DuplicateMarkerError)
        assert isinstance(part.apply(batch(1, 0)), int)  # the next transaction, epoch 1
        end = part.machine.log.log_end_offset
        assert isinstance(part.apply(encode_marker(4, 1, False, 1, 0)), DuplicateMarkerError)
        assert part.machine.log.log_end_offset == end
        assert part.machine.transactions.open_epoch(4) == 1
        assert isinstance(part.apply(encode_marker(4, 0, True, 1)), ProducerFencedError)
        # A bumped marker must be above the epoch it ends.
        header = type("H", (), {"producer_id": 4, "producer_epoch": 2})()
        with pytest.raises(CorruptRecordError):
            part.machine.transactions.check_marker(header, 2)  # type: ignore[arg-type]
        assert isinstance(part.apply(encode_marker(4, 2, True, 1, 1)), int)
        assert part.machine.transactions.open_epoch(4) is None
        part.restart()
        assert part.machine.transactions.open_transactions == {}


def _txn_batch(producer_id: int, epoch: int = 0, seq: int = 0) -> bytes:
    return encode_batch(
        [Record(None, b"v" * 150, (), 1)], producer_id=producer_id, producer_epoch=epoch,
        base_sequence=seq, is_transactional=True,
    )  # fmt: skip


@pytest.mark.parametrize("stop", ["marker", "first batch", "last batch"])
def test_a_refused_transactional_write_puts_the_transaction_state_back(
    tmp_path: Path, stop: str
) -> None:
    """The disk refuses a write in the middle of a command that aborts producer 5's open
    transaction (an aborted range added, its open entry gone) and opens two more: the
    transaction state is as before (TransactionStates.save/restore_saved, not a copy), and
    the retry gives what a replica whose disk took it gives."""
    failing, healthy = (
        Partition(d, PartitionStateMachine("t-0", PartitionLog.open(d, CONFIG)))
        for d in (tmp_path / "a", tmp_path / "b")
    )
    setup = [_txn_batch(4), encode_marker(4, 1, False, 1, 0), _txn_batch(5)]
    for part in (failing, healthy):
        for batch in setup:
            assert isinstance(part.apply(batch), int)
    marker, first, last = encode_marker(5, 1, False, 1, 0), _txn_batch(6), _txn_batch(7)
    command = ProduceCommand(PRODUCE_COMMAND_VERSION, (marker, first, last), None).encode()
    machine = failing.machine
    before = (machine.transactions.to_doc(), machine.last_stable_offset, machine.applied)
    assert before[0]["open"] and before[0]["aborted"]  # one of each before the command
    (segment,) = (tmp_path / "a").glob("*.log")
    sizes = {p: p.stat().st_size for p in (tmp_path / "a").rglob("*") if p.is_file()}
    assert max(sizes.values()) == sizes[segment]  # the cap stops the segment's write first
    written = {"marker": 0, "first batch": len(marker), "last batch": len(marker) + len(first)}
    cap = sizes[segment] + written[stop] + 40
    failing.journal.append(command)
    with file_size_cap(cap), pytest.raises(ApplyDeferred) as refused:
        machine.apply_at(len(failing.journal), 0, command)
    assert refused.value.no_space
    assert (machine.transactions.to_doc(), machine.last_stable_offset, machine.applied) == before
    assert machine.transactions.aborted_between(0, 1 << 30) == [(4, 0, 1)]
    healthy.journal.append(command)
    expected = healthy.machine.apply_at(len(healthy.journal), 0, command)
    assert machine.apply_at(len(failing.journal), 0, command) == expected
    assert machine.transactions.to_doc() == healthy.machine.transactions.to_doc()
    assert machine.transactions.open_transactions == {6: 4, 7: 5}
    assert failing.read_committed() == healthy.read_committed()
    failing.restart()
    assert failing.machine.transactions.to_doc() == healthy.machine.transactions.to_doc()
