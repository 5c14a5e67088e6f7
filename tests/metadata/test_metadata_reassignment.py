"""Proves the metadata state machine's rules for moving replicas (dmq/metadata/reassignment.py):

- property: whatever sequence of ReassignPartition and AlterPartitionReplicas commands
  (valid or not, any replica lists) is applied, a partition always holds at least its
  replication factor of distinct, registered replicas; a step only adds a broker of the
  target or, once every target broker is in, removes one that is not; a running
  reassignment's target differs from the replicas and is cleared exactly when they
  reach its set; a rejected command leaves the state (and its snapshot) unchanged; and a
  snapshot restores to a byte-identical state;
- decommission and unregister: a decommissioning broker gets no new replica (placement,
  targets), keeps its flag across a re-registration, and leaves only once it holds none.
"""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from dmq.metadata.machine import (
    AlterPartitionReplicas,
    Applied,
    CreateTopic,
    DecommissionBroker,
    MetadataMachine,
    ReassignPartition,
    RegisterBroker,
    Rejected,
    UnregisterBroker,
    encode_command,
)

BROKERS = ("a", "b", "c", "d", "e")
RF = 3


def _machine(brokers: tuple[str, ...] = BROKERS) -> MetadataMachine:
    machine = MetadataMachine()
    for b in brokers:
        machine.apply(encode_command(RegisterBroker(b, f"{b}:1", f"{b}:2", 1000)))
    assert isinstance(machine.apply(encode_command(CreateTopic("t", 1, RF, (), 1000))), Applied)
    return machine


replica_lists = st.lists(st.sampled_from((*BROKERS, "zz")), min_size=0, max_size=6).map(tuple)
# "add" and "remove" build a step from the state at that moment (the driver's moves, with
# `pick` choosing the broker), so that valid steps are common; "step" sends any list.
commands = st.lists(
    st.tuples(
        st.sampled_from(("reassign", "step", "add", "remove")), replica_lists, st.integers(0, 9)
    ),
    min_size=1,
    max_size=40,
)


def _driver_step(machine: MetadataMachine, kind: str, pick: int) -> tuple[str, ...]:
    partition = machine.state.topics["t"].partitions[0]
    replicas, target = partition.replicas, partition.target or ()
    if kind == "add":
        missing = [b for b in BROKERS if b not in replicas]
        return (*replicas, missing[pick % len(missing)]) if missing else replicas
    leaving = [b for b in replicas if b not in target] or list(replicas)
    gone = leaving[pick % len(leaving)]
    return tuple(b for b in replicas if b != gone)


@settings(max_examples=300, deadline=None)
@given(commands)
def test_any_command_sequence_keeps_the_replica_invariants(
    sequence: list[tuple[str, tuple[str, ...], int]],
) -> None:
    machine = _machine()
    for k, (kind, replicas, pick) in enumerate(sequence):
        if kind in ("add", "remove"):
            replicas, kind = _driver_step(machine, kind, pick), "step"
        before_snapshot = machine.snapshot()
        old = machine.state.topics["t"].partitions[0]
        cls = ReassignPartition if kind == "reassign" else AlterPartitionReplicas
        result = machine.apply(encode_command(cls("t", 1, 0, replicas, 2000 + k)))
        new = machine.state.topics["t"].partitions[0]
        if isinstance(result, Rejected):
            assert machine.snapshot() == before_snapshot
            continue
        assert len(new.replicas) >= RF and len(set(new.replicas)) == len(new.replicas)
        assert set(new.replicas) <= set(BROKERS)
        if new.target is not None:
            assert set(new.target) != set(new.replicas) and len(new.target) == RF
        if kind == "step":
            assert old.target is not None
            added, removed = (
                set(new.replicas) - set(old.replicas),
                set(old.replicas) - set(new.replicas),
            )
            assert (len(added), len(removed)) in ((1, 0), (0, 1))
            assert added <= set(old.target)
            if removed:
                assert set(old.target) <= set(old.replicas) and not removed & set(old.target)
            assert (new.target is None) == (set(new.replicas) == set(old.target))
        restored = MetadataMachine()
        restored.restore(machine.snapshot())
        assert restored.snapshot() == machine.snapshot()


def test_a_reassignment_runs_to_its_target_one_step_at_a_time() -> None:
    machine = _machine()
    [start] = [p.replicas for p in machine.state.topics["t"].partitions]
    new = next(b for b in BROKERS if b not in start)
    target = (new, *start[1:])
    assert isinstance(
        machine.apply(encode_command(ReassignPartition("t", 1, 0, target, 2))), Applied
    )
    # Removing before the new broker is in is refused: never fewer than the target.
    early = AlterPartitionReplicas("t", 1, 0, start[1:], 3)
    assert isinstance(machine.apply(encode_command(early)), Rejected)
    added = AlterPartitionReplicas("t", 1, 0, (*start, new), 4)
    assert isinstance(machine.apply(encode_command(added)), Applied)
    done = AlterPartitionReplicas("t", 1, 0, (*start[1:], new), 5)
    assert isinstance(machine.apply(encode_command(done)), Applied)
    partition = machine.state.topics["t"].partitions[0]
    assert partition.replicas == target and partition.target is None


def test_decommissioned_broker_takes_nothing_and_leaves_once_empty() -> None:
    machine = _machine(("a", "b", "c", "d"))
    holder = machine.state.topics["t"].partitions[0].replicas[0]
    spare = next(
        b for b in ("a", "b", "c", "d") if b not in machine.state.topics["t"].partitions[0].replicas
    )
    assert isinstance(machine.apply(encode_command(DecommissionBroker(spare, 2))), Applied)
    # Not enough brokers would stay for a replication factor of 3.
    refused = machine.apply(encode_command(DecommissionBroker(holder, 2)))
    assert isinstance(refused, Rejected) and refused.code == "not_enough_brokers"
    again = machine.apply(encode_command(RegisterBroker(spare, "x:1", "x:2", 3)))
    assert isinstance(again, Applied) and machine.state.brokers[spare].decommissioning
    created = machine.apply(encode_command(CreateTopic("u", 4, 3, (), 4)))
    assert isinstance(created, Applied) and created.topic is not None
    assert all(spare not in p.replicas for p in created.topic.partitions)
    to_spare = (spare, *machine.state.topics["t"].partitions[0].replicas[1:])
    refused = machine.apply(encode_command(ReassignPartition("t", 1, 0, to_spare, 5)))
    assert isinstance(refused, Rejected) and refused.field == "replicas"
    assert isinstance(machine.apply(encode_command(UnregisterBroker(spare, 6))), Applied)
    assert spare not in machine.state.brokers
    busy = machine.apply(encode_command(UnregisterBroker(holder, 7)))
    assert isinstance(busy, Rejected) and busy.code == "broker_in_use"
