"""Proves the metadata state machine's rules for decommissioning partitions
(dmq/metadata/reassignment.py, `apply_partition_lifecycle`):

- property: whatever sequence of DecommissionPartition, RemovePartition, ReassignPartition
  and AddPartitions commands is applied, a partition's status only moves forward (active ->
  decommissioned -> gone), a topic always keeps an active partition, only a decommissioned
  partition that is not being moved goes, a gone one has no replicas and no command brings
  it back, partition numbers are never reused (the count never shrinks), a rejected
  command leaves the snapshot unchanged, and the snapshot restores byte-identically;
- consumer groups learn gone partitions in the same apply: a member's assignment drops a
  gone partition (the others still spread evenly) and its committed offset is forgotten,
  for every assignor; a commit naming it is refused.
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dmq.metadata.machine import (
    PARTITION_ACTIVE,
    PARTITION_DECOMMISSIONED,
    PARTITION_GONE,
    AddPartitions,
    Applied,
    Command,
    CreateTopic,
    DecommissionPartition,
    MetadataMachine,
    ReassignPartition,
    RegisterBroker,
    Rejected,
    RemovePartition,
    encode_command,
)
from groups.commands import CommitOffsets, JoinGroup

BROKERS = ("a", "b", "c", "d")
ORDER = {PARTITION_ACTIVE: 0, PARTITION_DECOMMISSIONED: 1, PARTITION_GONE: 2}


def _machine(partitions: int = 3) -> MetadataMachine:
    machine = MetadataMachine()
    for b in BROKERS:
        machine.apply(encode_command(RegisterBroker(b, f"{b}:1", f"{b}:2", 1000)))
    created = machine.apply(encode_command(CreateTopic("t", partitions, 2, (), 1000)))
    assert isinstance(created, Applied)
    return machine


commands = st.lists(
    st.tuples(st.sampled_from(("decommission", "remove", "reassign", "add")), st.integers(0, 5)),
    min_size=1,
    max_size=30,
)


def _command(machine: MetadataMachine, kind: str, n: int, now_ms: int) -> Command:
    partitions = machine.state.topics["t"].partitions
    if kind == "decommission":
        return DecommissionPartition("t", 1, n, now_ms)
    if kind == "remove":
        return RemovePartition("t", 1, n, now_ms)
    if kind == "reassign":
        current = partitions[n].replicas if n < len(partitions) else ()
        spare = [b for b in BROKERS if b not in current][:1]
        return ReassignPartition("t", 1, n, (*current[:1], *spare), now_ms)
    return AddPartitions("t", len(partitions) + 1, now_ms)


@settings(max_examples=300, deadline=None)
@given(commands)
def test_partition_status_only_moves_forward(sequence: list[tuple[str, int]]) -> None:
    machine = _machine()
    for k, (kind, n) in enumerate(sequence):
        old = machine.state.topics["t"].partitions
        before = machine.snapshot()
        command = _command(machine, kind, n, 2000 + k)
        result = machine.apply(encode_command(command))
        new = machine.state.topics["t"].partitions
        if isinstance(result, Rejected):
            assert machine.snapshot() == before
            continue
        assert len(new) >= len(old)  # numbers are never reused or dropped
        assert any(p.status == PARTITION_ACTIVE for p in new)
        for was, now in zip(old, new, strict=False):
            assert ORDER[now.status] >= ORDER[was.status]
            if now.status == PARTITION_GONE:
                assert now.replicas == () and now.target is None and now.leader is None
                if was.status != PARTITION_GONE:
                    assert was.status == PARTITION_DECOMMISSIONED and was.target is None
        restored = MetadataMachine()
        restored.restore(machine.snapshot())
        assert restored.snapshot() == machine.snapshot()


def test_the_last_active_partition_cannot_be_decommissioned() -> None:
    machine = _machine(2)
    assert isinstance(machine.apply(encode_command(DecommissionPartition("t", 1, 0, 2))), Applied)
    refused = machine.apply(encode_command(DecommissionPartition("t", 1, 1, 3)))
    assert isinstance(refused, Rejected) and refused.field == "partition"
    early = machine.apply(encode_command(RemovePartition("t", 1, 1, 4)))  # still active
    assert isinstance(early, Rejected)
    assert isinstance(machine.apply(encode_command(RemovePartition("t", 1, 0, 5))), Applied)
    again = machine.apply(encode_command(DecommissionPartition("t", 1, 0, 6)))
    assert isinstance(again, Rejected) and again.code == "partition_gone"


@pytest.mark.parametrize("assignor", ["range", "roundrobin", "sticky"])
def test_groups_stop_assigning_a_gone_partition(assignor: str) -> None:
    machine = _machine(5)
    for member in ("m1", "m2"):
        join = JoinGroup("g", member, "", ("t",), "", 30_000, assignor, 2000)
        assert isinstance(machine.apply(encode_command(join)), Applied)
    group = machine.state.groups.groups["g"]
    assert sorted(group.target) == [("t", p) for p in range(5)]
    owner = group.target[("t", 2)]
    commit = CommitOffsets("g", owner, group.generation, (("t", 2, 7),), 2001)
    assert isinstance(machine.apply(encode_command(commit)), Applied)
    assert machine.state.groups.groups["g"].committed[("t", 2)] == 7
    retire = DecommissionPartition("t", 1, 2, 3000)
    assert isinstance(machine.apply(encode_command(retire)), Applied)
    assert isinstance(machine.apply(encode_command(RemovePartition("t", 1, 2, 3001))), Applied)
    group = machine.state.groups.groups["g"]
    assert sorted(group.target) == [("t", 0), ("t", 1), ("t", 3), ("t", 4)]
    per_member = sorted(list(group.target.values()).count(m) for m in ("m1", "m2"))
    assert per_member == [2, 2]  # the four left still spread evenly
    assert ("t", 2) not in group.committed
    refused = machine.apply(
        encode_command(CommitOffsets("g", owner, group.generation, (("t", 2, 1),), 4000))
    )
    assert isinstance(refused, Rejected) and refused.field == "offsets[0].partition", refused
