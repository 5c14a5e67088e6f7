"""Proves dmq/partition/delay.py through the partition machine (dmq/partition/machine.py).

- Delay commands round-trip their binary encoding; decode refuses cut or padded frames.
- Property: over arbitrary interleavings of schedule, release (due ones, re-proposed old
  ones, ones proposed before their time), cancel, snapshot, clean restart, crash restart
  that loses the tail of the applied checkpoint (the store and the log are cut back and
  the journal replays), and a new replica restored from the last snapshot plus the
  journal after it: every scheduled record that is not cancelled reaches the log exactly
  once, none before its time (the releasing command's now_ms), a cancelled one never;
  the restored replica holds the same store as the primary had at the snapshot (copied
  from the primary, which has moved on: no snapshot carries the records), then the same
  log records and the same pending set.
- A bucket file is deleted one snapshot late: a copy at the previous snapshot's position
  is still served, one before it is refused (DelayCopyError), and a copy cut short or
  counting other than the snapshot says leaves the store as it was.
- A schedule with an idempotent producer that repeats one of its last schedules (a
  client's retry, any number of Raft positions later, across a crash restart and in a
  replica restored from a snapshot) is answered with the first one's schedule ids and
  schedules nothing; an older epoch is refused (fenced).
- A snapshot of the previous version (the records in it, as JSON) still restores them.
- A write the disk refuses (a file-size cap: EFBIG, as a full disk) while a schedule or
  a release applies is undone, store, log and checkpoint (ApplyDeferred), and the same
  command applied again gives what a replica that never failed holds.
"""

from __future__ import annotations

import base64
import dataclasses
import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dmq.partition.delay import (
    BUCKET_MS,
    KIND_CANCEL,
    KIND_RELEASE,
    KIND_SCHEDULE,
    DelayCommand,
    DelayCommandError,
    DelayCopyError,
)
from dmq.partition.machine import (
    APPLIED_CHECKPOINT,
    CopiedChunk,
    PartitionSnapshot,
    PartitionStateMachine,
)
from dmq.partition.producers import ProducerFencedError
from log import FlushPolicy, LogConfig, PartitionLog, Record, encode_batch
from raft.errors import ApplyDeferred
from tests_support import file_size_cap

CONFIG = LogConfig(segment_bytes=2_000, flush=FlushPolicy(interval_records=None))
CHECKPOINT_RECORD_BYTES = 24


def one(value: str) -> bytes:
    return encode_batch([Record(b"k", value.encode(), (), 1_000)])


@given(
    st.lists(st.tuples(st.integers(0, 2**62), st.binary(max_size=30)), min_size=1, max_size=5),
    st.lists(st.tuples(st.integers(0, 2**63 - 1), st.integers(0, 2**62)), max_size=5),
    st.integers(0, 2**62),
)
def test_delay_commands_round_trip(
    scheduled: list[tuple[int, bytes]], targets: list[tuple[int, int]], now: int
) -> None:
    s = DelayCommand(KIND_SCHEDULE, now, scheduled=tuple(scheduled))
    assert DelayCommand.decode(s.encode()) == s
    for kind in (KIND_RELEASE, KIND_CANCEL):
        c = DelayCommand(kind, now, targets=tuple(targets))
        assert DelayCommand.decode(c.encode()) == c
    data = s.encode()
    for bad in (data[:-1], data + b"x", data[:5]):
        with pytest.raises(DelayCommandError):
            DelayCommand.decode(bad)


# ------------------------------------------------------------------ the property

ops = st.lists(
    st.one_of(
        st.tuples(st.just("schedule"), st.lists(st.integers(0, 25_000), min_size=1, max_size=4)),
        st.tuples(st.just("advance"), st.integers(0, 9_000)),
        st.tuples(st.just("release"), st.integers(1, 5)),
        st.tuples(st.just("release_again"), st.integers(0, 10)),
        st.tuples(st.just("release_early"), st.integers(1, 3)),
        st.tuples(st.just("cancel"), st.integers(0, 50)),
        st.tuples(
            st.just("schedule_idempotent"), st.lists(st.integers(0, 25_000), min_size=1, max_size=3)
        ),
        st.tuples(st.just("retry"), st.integers(0, 4)),
        st.tuples(st.just("snapshot"), st.just(0)),
        st.tuples(st.just("restart"), st.just(0)),
        st.tuples(st.just("crash"), st.integers(0, 6)),
    ),
    max_size=30,
)


class Cluster:
    """One replica driven through its Raft positions, with the journal kept for replay."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.dir = root / "primary"
        self.machine = self.open(self.dir)
        self.journal: list[tuple[tuple[int, int], bytes]] = []
        self.index = 0
        self.now = 1_000_000
        self.snap: tuple[bytes, int] | None = None  # (snapshot, journal length at it)
        self.snap_pending: set[tuple[int, int, bytes]] = set()  # the store at the snapshot
        self.deliver_at: dict[str, int] = {}  # value -> deliver_at
        self.sid_of: dict[str, int] = {}
        self.cancelled: set[str] = set()
        self.releases: list[DelayCommand] = []
        self.counter = 0
        self.idempotent: list[tuple[DelayCommand, list[int]]] = []  # its last schedules
        self.sequence = 0
        # The broker's registry of stores holding records (dmq/broker/replicas.py
        # `delay_pending`): each store's hook adds its directory's name.
        self.registry: set[str] = set()

    def open(
        self, directory: Path, fetch: object = None, fetch_delayed: object = None
    ) -> PartitionStateMachine:
        machine = PartitionStateMachine(
            "t-0",
            PartitionLog.open(directory, CONFIG),
            fetch,
            fetch_delayed,  # type: ignore[arg-type]
        )
        # As PartitionReplica and ReplicaSet.add wire it: the hook, and what it holds now.
        machine.delay.on_pending = lambda: self.registry.add(directory.name)
        if machine.delay.due_hint_ms is not None:
            self.registry.add(directory.name)
        return machine

    def propose(self, command: DelayCommand) -> list[int] | None:
        self.index += 1
        data = command.encode()
        self.journal.append(((self.index, 0), data))
        return self.machine.apply_at(self.index, 0, data)  # type: ignore[return-value]

    def schedule(self, delays: list[int], idempotent: bool = False) -> None:
        values = []
        for delay in delays:
            self.counter += 1
            value = f"r{self.counter}"
            self.deliver_at[value] = self.now + delay
            values.append(value)
        producer = (7, 0, self.sequence) if idempotent else None
        cmd = DelayCommand(
            KIND_SCHEDULE, self.now, scheduled=tuple((self.deliver_at[v], one(v)) for v in values),
            producer=producer,
        )  # fmt: skip
        sids = self.propose(cmd)
        assert sids is not None and len(sids) == len(values)
        if idempotent:
            self.sequence += len(values)
            self.idempotent = [*self.idempotent, (cmd, sids)][-5:]
        self.sid_of.update(zip(values, sids, strict=True))

    def release(self, targets: list[tuple[int, int]]) -> None:
        cmd = DelayCommand(KIND_RELEASE, self.now, targets=tuple(targets))
        self.releases.append(cmd)
        self.propose(cmd)

    def restart(self, lose_records: int = 0) -> None:
        """Reopen; a crash first drops the last checkpoint records (never the durable
        first one), then the whole journal is replayed (applied positions are skipped)."""
        if lose_records:
            path = self.dir / APPLIED_CHECKPOINT
            raw = path.read_bytes()
            keep = max(CHECKPOINT_RECORD_BYTES, len(raw) - lose_records * CHECKPOINT_RECORD_BYTES)
            path.write_bytes(raw[:keep])
            self.machine.log.close()
        else:
            self.machine.close()
            self.machine.log.close()
        self.machine = self.open(self.dir)
        for (index, k), data in self.journal:
            self.machine.apply_at(index, k, data)

    def values_in_log(self, machine: PartitionStateMachine) -> list[str]:
        log = machine.log
        return [
            (r.value or b"").decode()
            for r in log.read_records(log.log_start_offset, 1 << 30, end_offset=log.log_end_offset)
        ]

    def fetch_from_primary(self, start: int, end: int) -> Iterator[CopiedChunk]:
        data, covered = self.machine.log.read_for_copy(start, end, 1 << 30)
        from log.records import iter_batches

        view = memoryview(data)
        batches = tuple(bytes(view[p : p + h.size_bytes]) for p, h in iter_batches(view))
        yield CopiedChunk(batches, covered)

    def fetch_delayed(self, position: tuple[int, int]) -> Iterator[Iterator[bytes]]:
        """A source that fails part-way first (the next one is tried), then the primary's
        copy in 13-byte pieces (entries split across chunks)."""

        def broken() -> Iterator[bytes]:
            yield b"".join(self.machine.export_delay(position))[:20]
            raise OSError("connection reset")

        def pieces() -> Iterator[bytes]:
            whole = b"".join(self.machine.export_delay(position))
            for i in range(0, len(whole), 13):
                yield whole[i : i + 13]

        yield broken()
        yield pieces()


def pending_of(machine: PartitionStateMachine) -> set[tuple[int, int, bytes]]:
    return set(machine.delay.pending())


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ops)
def test_each_record_released_once_never_early_across_restarts_and_restores(
    tmp_path_factory: pytest.TempPathFactory, plan: list[tuple[str, object]]
) -> None:
    c = Cluster(tmp_path_factory.mktemp("delay"))
    for op, arg in plan:
        if op == "schedule":
            c.schedule(arg)  # type: ignore[arg-type]
        elif op == "advance":
            c.now += arg  # type: ignore[operator]
        elif op == "release":
            c.release(c.machine.delay.due(c.now, arg, 1 << 20))  # type: ignore[arg-type]
        elif op == "release_again" and c.releases:
            old = c.releases[arg % len(c.releases)]  # type: ignore[operator]
            c.release(list(old.targets))  # a new leader proposes what an old one did
        elif op == "release_early":
            future = sorted(
                (at, v) for v, at in c.deliver_at.items() if at > c.now and v not in c.cancelled
            )[: int(arg)]  # type: ignore[call-overload]
            c.release([(c.sid_of[v], at) for at, v in future])  # a leader whose clock lags
        elif op == "cancel" and c.sid_of:
            value = sorted(c.sid_of)[arg % len(c.sid_of)]  # type: ignore[operator]
            cmd = DelayCommand(
                KIND_CANCEL, c.now, targets=((c.sid_of[value], c.deliver_at[value]),)
            )
            result = c.propose(cmd)
            assert result is not None
            if result == [1]:
                assert value not in c.values_in_log(c.machine)
                c.cancelled.add(value)
            else:  # not pending: released before, or cancelled before
                assert value in c.cancelled or value in c.values_in_log(c.machine)
        elif op == "schedule_idempotent":
            c.schedule(arg, idempotent=True)  # type: ignore[arg-type]
        elif op == "retry" and c.idempotent:
            cmd, sids = c.idempotent[arg % len(c.idempotent)]  # type: ignore[operator]
            assert c.propose(cmd) == sids, "a retried schedule answered other ids"
        elif op == "snapshot":
            c.snap = (c.machine.snapshot(), len(c.journal))
            c.snap_pending = pending_of(c.machine)
        elif op == "restart":
            c.restart()
        elif op == "crash":
            c.restart(lose_records=int(arg))  # type: ignore[call-overload]
        check_never_early_and_once(c)
        check_registered(c, c.machine, "primary")
    # Everything due at the end is released exactly once; a replica restored from the
    # last snapshot and the journal after it agrees.
    c.now += 100_000
    for _ in range(len(c.deliver_at)):
        if c.machine.delay.pending_count:
            c.release(c.machine.delay.due(c.now, 3, 1 << 20))
    check_never_early_and_once(c)
    delivered = c.values_in_log(c.machine)
    assert sorted(delivered) == sorted(set(c.deliver_at) - c.cancelled)
    if c.snap is not None:
        snapshot, at = c.snap
        # The snapshot names the store; the replica copies it as it was then from the
        # primary, which has moved on since (and compacted at later snapshots).
        replica = c.open(c.root / "replica", c.fetch_from_primary, c.fetch_delayed)
        replica.restore(snapshot)
        assert pending_of(replica) == c.snap_pending
        for (index, k), data in c.journal[at:]:
            replica.apply_at(index, k, data)
        assert c.values_in_log(replica) == delivered
        assert pending_of(replica) == pending_of(c.machine) == set()
        assert c.snap_pending == set() or "replica" in c.registry  # its restore's hook ran


def check_registered(c: Cluster, machine: PartitionStateMachine, key: str) -> None:
    """The release duty's view (dmq/broker/delay.py): it drops the key of a store whose
    hint is None; a store holding records must then still be in the registry, or its
    records would never be released."""
    if machine.delay.due_hint_ms is None:
        c.registry.discard(key)
    if machine.delay.pending_count:
        assert machine.delay.due_hint_ms is not None
        assert key in c.registry, "a store holding records is not in the release registry"
    else:
        assert machine.delay.due_hint_ms is None, "an empty store keeps the duty looking"


def test_every_replica_says_empty_once_nothing_is_pending(tmp_path: Path) -> None:
    """A release or a cancel that empties the store sets its hint to None on every
    replica, a follower's included (it never calls `due`), so the release duty drops the
    partition at its next tick; undoing that release (its checkpoint write failed) puts
    the hint back and the partition back in the registry."""
    c = Cluster(tmp_path)
    c.schedule([10, 20])
    assert "primary" in c.registry
    c.now += 30
    # As a follower applies the leader's release: the targets are named, `due` not called.
    c.release([(c.sid_of[v], at) for v, at in c.deliver_at.items()])
    assert c.machine.delay.pending_count == 0 and c.machine.delay.due_hint_ms is None
    check_registered(c, c.machine, "primary")
    assert c.registry == set()
    c.machine.delay.undo()  # the machine's path when a later write of the apply fails
    assert c.machine.delay.due_hint_ms is not None and c.registry == {"primary"}
    d = Cluster(tmp_path / "cancel")
    d.schedule([50])
    ((value, at),) = d.deliver_at.items()
    assert d.propose(DelayCommand(KIND_CANCEL, d.now, targets=((d.sid_of[value], at),))) == [1]
    assert d.machine.delay.due_hint_ms is None


def check_never_early_and_once(c: Cluster) -> None:
    values = c.values_in_log(c.machine)
    assert len(values) == len(set(values)), "a record delivered twice"
    assert not set(values) & c.cancelled, "a cancelled record delivered"
    released_by: dict[str, int] = {}
    for cmd in c.releases:
        for sid, at in cmd.targets:
            if at <= cmd.now_ms:
                released_by.setdefault(str(sid), cmd.now_ms)
    for v in values:
        first_legal = released_by.get(str(c.sid_of[v]))
        assert first_legal is not None and c.deliver_at[v] <= first_legal, f"{v} released early"
    pending = {sid for sid, _, _ in c.machine.delay.pending()}
    assert c.machine.delay.pending_count == len(pending)
    expected = {c.sid_of[v] for v in c.deliver_at} - {c.sid_of[v] for v in c.cancelled}
    expected -= {c.sid_of[v] for v in values}
    assert pending == expected


def test_buckets_are_deleted_one_snapshot_late_and_copies_say_which_positions(
    tmp_path: Path,
) -> None:
    c = Cluster(tmp_path)
    c.schedule([10, 20])  # bucket A
    c.schedule([5 * BUCKET_MS])  # bucket B, pending throughout
    c.now += 30
    c.release(c.machine.delay.due(c.now, 10, 1 << 20))  # A is empty now
    first = c.machine.applied
    c.machine.snapshot()  # marks A
    assert len(list((c.dir / "delay").glob("*.bucket"))) == 2
    c.schedule([6 * BUCKET_MS])
    second = c.machine.applied
    c.machine.snapshot()  # deletes A (empty at the first, untouched since)
    assert not (c.dir / "delay" / f"{1_000_000:020d}.bucket").exists()
    assert len(list((c.dir / "delay").glob("*.bucket"))) == 2
    stream = list(c.machine.export_delay(first))
    assert sum(len(x) for x in stream) > 0
    whole = b"".join(c.machine.export_delay(second))
    c.schedule([7 * BUCKET_MS])
    c.machine.snapshot()  # nothing more to delete: the first stays servable
    list(c.machine.export_delay(first))
    c.now += 10 * BUCKET_MS
    c.release(c.machine.delay.due(c.now, 10, 1 << 20))
    assert c.machine.delay.pending_count == 0
    c.machine.snapshot()
    c.machine.snapshot()  # deletes the emptied buckets: compacted to the previous one
    with pytest.raises(DelayCopyError):
        c.machine.export_delay(first)
    with pytest.raises(DelayCopyError):
        c.machine.export_delay((c.machine.applied[0] + 1, 0))  # not applied yet
    # A copy cut short, or counting wrong, leaves the receiving store as it was.
    other = Cluster(tmp_path / "other")
    other.schedule([1, 2, 3])
    before = pending_of(other.machine)
    for bad, count in ((whole[:-3], 2), (whole, 5)):
        with pytest.raises(DelayCopyError):
            other.machine.delay.restore_stream([bad], second, count)
        assert pending_of(other.machine) == before
    other.machine.delay.restore_stream([whole[:7], whole[7:]], second, 2)
    assert {at for _, at, _ in pending_of(other.machine)} == {
        1_000_000 + 5 * BUCKET_MS, 1_000_030 + 6 * BUCKET_MS,
    }  # fmt: skip


@pytest.mark.parametrize("cut", [0.0, 0.5, 0.99])
@pytest.mark.parametrize("files", ["delay", "all"])  # the store's write, or a later one
def test_a_refused_delay_write_is_undone_and_applies_whole_later(
    tmp_path: Path, cut: float, files: str
) -> None:
    failing, healthy = Cluster(tmp_path / "a"), Cluster(tmp_path / "b")
    for c in (failing, healthy):
        c.schedule([10, 20, 2 * BUCKET_MS])
        c.now += 30
    release = DelayCommand(
        KIND_RELEASE, failing.now, targets=tuple(failing.machine.delay.due(failing.now, 9, 1 << 20))
    )
    schedule = DelayCommand(
        KIND_SCHEDULE, failing.now, scheduled=((failing.now + 40, one("late")),) * 3
    )
    for command in (release, schedule):
        failing.index += 1
        healthy.index += 1
        data = command.encode()
        files = [p for p in failing.dir.rglob("*") if p.is_file()]
        sizes = {p: p.stat().st_size for p in files}
        # Each file may grow by a part of what the command writes, then EFBIG.
        capped = [s for p, s in sizes.items() if files == "all" or p.parent.name == "delay"]
        cap = max(capped) + int(len(data) * cut) + 1
        with file_size_cap(cap), pytest.raises(ApplyDeferred) as refused:
            failing.machine.apply_at(failing.index, 0, data)
        assert refused.value.no_space
        assert {p: p.stat().st_size for p in files if p.exists()} == {
            p: s for p, s in sizes.items() if p.exists()
        }, "a file kept part of the refused command"
        assert failing.machine.applied == (failing.index - 1, 0)
        assert failing.machine.apply_at(failing.index, 0, data) == healthy.machine.apply_at(
            healthy.index, 0, data
        )
        assert pending_of(failing.machine) == pending_of(healthy.machine)
        assert failing.values_in_log(failing.machine) == healthy.values_in_log(healthy.machine)
    failing.restart()
    assert pending_of(failing.machine) == pending_of(healthy.machine)


def test_an_idempotent_schedule_retried_is_answered_with_its_first_ids(tmp_path: Path) -> None:
    c = Cluster(tmp_path)

    def idempotent(seq: int, values: list[str], epoch: int = 0) -> list[object] | None:
        scheduled = tuple((c.now + 100, one(v)) for v in values)
        return c.propose(DelayCommand(KIND_SCHEDULE, c.now, scheduled=scheduled,
                                      producer=(7, epoch, seq)))  # fmt: skip

    assert DelayCommand.decode(
        DelayCommand(KIND_SCHEDULE, 1, scheduled=((5, one("a")),), producer=(7, 1, 9)).encode()
    ).producer == (7, 1, 9)
    first = idempotent(0, ["a", "b"])
    c.schedule([50])  # another command in between
    assert idempotent(0, ["a", "b"]) == first  # the retry
    assert c.machine.delay.pending_count == 3
    second = idempotent(2, ["c"])
    assert second != first and c.machine.delay.pending_count == 4
    snapshot = (c.machine.snapshot(), len(c.journal))
    c.restart(lose_records=2)  # the journal replays: the retry is recognised again
    assert idempotent(0, ["a", "b"]) == first and c.machine.delay.pending_count == 4
    replica = c.open(c.root / "replica", c.fetch_from_primary, c.fetch_delayed)
    replica.restore(snapshot[0])
    c.index += 1
    retry = DelayCommand(KIND_SCHEDULE, c.now, scheduled=((c.now + 100, one("c")),),
                         producer=(7, 0, 2)).encode()  # fmt: skip
    assert replica.apply_at(c.index, 0, retry) == second
    assert replica.delay.pending_count == 4
    assert idempotent(3, ["d"], epoch=1) is not None  # a new epoch starts afresh
    (fenced,) = idempotent(4, ["e"], epoch=0) or []
    assert isinstance(fenced, ProducerFencedError)
    c.now += 1_000
    c.release(c.machine.delay.due(c.now, 100, 1 << 20))
    assert sorted(c.values_in_log(c.machine)) == ["a", "b", "c", "d", "r1"]


def test_a_snapshot_written_before_the_copy_still_restores_its_records(tmp_path: Path) -> None:
    """Snapshots of the previous version carried the pending records as JSON."""
    c = Cluster(tmp_path)
    c.schedule([10, 2 * BUCKET_MS, 3 * BUCKET_MS])
    wanted = PartitionSnapshot.decode(c.machine.snapshot())
    legacy = [
        [sid, at, base64.b64encode(batch).decode()] for sid, at, batch in pending_of(c.machine)
    ]
    old = dataclasses.replace(wanted, delayed=json.dumps(legacy), delay_pending=0)
    replica = c.open(c.root / "replica", c.fetch_from_primary)  # no fetch_delayed needed
    replica.restore(old.encode())
    assert pending_of(replica) == pending_of(c.machine)
