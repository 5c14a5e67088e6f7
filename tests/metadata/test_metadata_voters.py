"""Proves the metadata state machine's rules for the metadata group's own voters
(dmq/metadata/voters.py):

- property: whatever sequence of ChangeMetadataVoters and AlterMetadataVoters commands
  (valid or not, any sets) and broker decommissions/unregistrations is applied, once
  recorded the voter set changes by exactly one broker per record, only through a record;
  a target names registered brokers, none decommissioning unless already a recorded
  voter (a swap can be rolled back); a record reaching the
  target ends the change; a running change is only repeated or rolled back; a broker in
  the voters or the target is never unregistered; a rejected command leaves the state
  (and its snapshot) unchanged; a snapshot restores byte-identically;
- liveness of the rules: a driver that adds one missing target broker at a time, then
  removes one extra, reaches any accepted target in |target ^ voters| records and ends it;
- a snapshot from before voter changes (no `voters` fields) loads with none recorded, and
  the first record (the bootstrap) is accepted whatever its size; the sets travel in the
  catalogue observers follow (state_to_json).
"""

from __future__ import annotations

import json

from hypothesis import given, settings
from hypothesis import strategies as st

from dmq.metadata.machine import (
    AlterMetadataVoters,
    Applied,
    ChangeMetadataVoters,
    DecommissionBroker,
    MetadataMachine,
    RegisterBroker,
    Rejected,
    UnregisterBroker,
    decode_command,
    encode_command,
    state_from_json,
    state_to_json,
)
from dmq.metadata.voters import METADATA_VOTERS_MAX

BROKERS = tuple(f"n{k}" for k in range(1, 9))  # one more than METADATA_VOTERS_MAX
BOOT = ("n1", "n2", "n3")


def _machine(record: tuple[str, ...] | None = BOOT) -> MetadataMachine:
    machine = MetadataMachine()
    for b in BROKERS:
        machine.apply(encode_command(RegisterBroker(b, f"{b}:1", f"{b}:2", 1000)))
    if record is not None:
        assert isinstance(_apply(machine, AlterMetadataVoters(record, 1000)), Applied)
    return machine


def _apply(
    machine: MetadataMachine,
    command: ChangeMetadataVoters | AlterMetadataVoters | DecommissionBroker | UnregisterBroker,
) -> Applied | Rejected:
    result = machine.apply(encode_command(command))
    assert isinstance(result, Applied | Rejected)
    return result


def _driver_record(voters: tuple[str, ...], target: tuple[str, ...]) -> tuple[str, ...]:
    """The driver's next Raft change, as its record: add a missing target broker first,
    then remove one the target does not name (dmq/broker/operations.py's order)."""
    missing = [b for b in target if b not in voters]
    if missing:
        return tuple(sorted((*voters, missing[0])))
    extra = [b for b in voters if b not in target]
    return tuple(b for b in voters if b != extra[0]) if extra else voters


def _command(
    kind: str, members: tuple[str, ...], now: int
) -> ChangeMetadataVoters | AlterMetadataVoters | DecommissionBroker | UnregisterBroker:
    if kind == "change":
        return ChangeMetadataVoters(members, now)
    if kind == "alter":
        return AlterMetadataVoters(members, now)
    broker = members[0] if members else "n9"
    return (
        DecommissionBroker(broker, now) if kind == "decommission" else UnregisterBroker(broker, now)
    )


sets = st.lists(st.sampled_from((*BROKERS, "zz", "")), max_size=9).map(tuple)
steps = st.lists(
    st.tuples(st.sampled_from(("change", "alter", "drive", "decommission", "unregister")), sets),
    min_size=1,
    max_size=40,
)


@settings(max_examples=300, deadline=None)
@given(steps)
def test_any_command_sequence_keeps_the_voter_invariants(
    sequence: list[tuple[str, tuple[str, ...]]],
) -> None:
    machine = _machine()
    for k, (kind, members) in enumerate(sequence):
        now = 2000 + k
        old = machine.state
        before_snapshot = machine.snapshot()
        if kind == "drive":
            kind, members = "alter", _driver_record(old.voters, old.voters_target)
        command = _command(kind, members, now)
        result = _apply(machine, command)
        new = machine.state
        if isinstance(result, Rejected):
            assert machine.snapshot() == before_snapshot
            continue
        assert len(set(new.voters) ^ set(old.voters)) <= 1
        assert new.voters == tuple(sorted(new.voters)) and new.voters
        if kind != "alter":
            assert new.voters == old.voters
        if new.voters_target:
            assert set(new.voters_target) <= set(new.brokers)
            assert len(new.voters_target) <= METADATA_VOTERS_MAX
        if kind == "change" and old.voters_target and new.voters_target != old.voters_target:
            assert new.voters_target == old.voters  # only a rollback replaces a target
        if kind == "change" and new.voters_target != old.voters_target:
            joining = [b for b in new.voters_target if b not in new.voters]
            assert not any(new.brokers[b].decommissioning for b in joining)
        if kind == "alter" and old.voters_target:
            reached = set(new.voters) == set(old.voters_target)
            assert (new.voters_target == ()) == reached
        for gone in set(old.brokers) - set(new.brokers):
            assert gone not in old.voters and gone not in old.voters_target
        restored = MetadataMachine()
        restored.restore(machine.snapshot())
        assert restored.snapshot() == machine.snapshot()


@settings(max_examples=200, deadline=None)
@given(st.lists(st.sampled_from(BROKERS[:METADATA_VOTERS_MAX]), min_size=1, unique=True))
def test_the_driver_reaches_any_accepted_target_one_broker_at_a_time(
    wanted: list[str],
) -> None:
    machine = _machine()
    target = tuple(sorted(wanted))
    assert isinstance(_apply(machine, ChangeMetadataVoters(target, 2000)), Applied)
    distance = len(set(target) ^ set(BOOT))
    for k in range(distance):
        state = machine.state
        assert state.voters_target == (target if target != BOOT else ())
        step = _driver_record(state.voters, target)
        assert isinstance(_apply(machine, AlterMetadataVoters(step, 2001 + k)), Applied)
        # Never fewer voters than the smaller of the two sets: adds come first.
        assert len(machine.state.voters) >= min(len(target), len(BOOT))
    assert machine.state.voters == target and machine.state.voters_target == ()


def test_a_change_is_refused_before_the_bootstrap_record_and_the_first_record_is_any_set() -> None:
    machine = _machine(record=None)
    refused = _apply(machine, ChangeMetadataVoters(BOOT, 1))
    assert isinstance(refused, Rejected) and refused.code == "metadata_voters_unknown"
    five = ("n1", "n2", "n3", "n4", "n5")
    assert isinstance(_apply(machine, AlterMetadataVoters(five, 2)), Applied)
    assert machine.state.voters == five
    # From then on a record moves one broker at a time.
    jump = _apply(machine, AlterMetadataVoters(BOOT, 3))
    assert isinstance(jump, Rejected) and jump.field == "voters"


def test_a_running_change_can_be_repeated_or_rolled_back_but_not_replaced() -> None:
    machine = _machine()
    five = ("n1", "n2", "n3", "n4", "n5")
    version = _apply(machine, ChangeMetadataVoters(five, 2))
    assert isinstance(version, Applied) and machine.state.voters_target == five
    again = _apply(machine, ChangeMetadataVoters(five, 3))
    assert isinstance(again, Applied) and again.metadata_version == version.metadata_version
    other = _apply(machine, ChangeMetadataVoters(("n1", "n2", "n4"), 4))
    assert isinstance(other, Rejected) and other.code == "metadata_voters_change_running"
    # The driver added n4, then the operator rolls back: the target becomes the record,
    # and the driver's record of the Raft configuration ends it.
    assert isinstance(_apply(machine, AlterMetadataVoters(("n1", "n2", "n3", "n4"), 5)), Applied)
    assert isinstance(_apply(machine, ChangeMetadataVoters(("n1", "n2", "n3", "n4"), 6)), Applied)
    assert machine.state.voters_target == ("n1", "n2", "n3", "n4")
    assert isinstance(_apply(machine, AlterMetadataVoters(("n1", "n2", "n3", "n4"), 7)), Applied)
    assert machine.state.voters_target == ()


def test_targets_name_live_members_only_and_voters_are_never_unregistered() -> None:
    machine = _machine()
    for bad, field_code in (
        ((), "invalid_argument"),
        (("n1", "n1"), "invalid_argument"),
        (("n1", "zz"), "unknown_broker"),
        (BROKERS, "invalid_argument"),  # 8 > METADATA_VOTERS_MAX
    ):
        refused = _apply(machine, ChangeMetadataVoters(bad, 2))
        assert isinstance(refused, Rejected) and refused.code == field_code
        assert refused.field == "voters"
    assert isinstance(_apply(machine, DecommissionBroker("n3", 3)), Applied)
    assert isinstance(_apply(machine, DecommissionBroker("n5", 3)), Applied)
    refused = _apply(machine, ChangeMetadataVoters(("n1", "n3", "n5"), 4))
    assert isinstance(refused, Rejected) and "decommissioned" in refused.message
    refused = _apply(machine, UnregisterBroker("n3", 5))
    assert isinstance(refused, Rejected) and refused.code == "broker_in_use"
    # n3's swap for n4 can be rolled back (say n4 died): n3, decommissioning, is a
    # recorded voter, so a target may still name it.
    assert isinstance(_apply(machine, ChangeMetadataVoters(("n1", "n2", "n4"), 6)), Applied)
    assert isinstance(_apply(machine, ChangeMetadataVoters(BOOT, 6)), Applied)
    assert machine.state.voters_target == BOOT
    assert isinstance(_apply(machine, AlterMetadataVoters(BOOT, 6)), Applied)
    # Swapped out of the voters (n4 added, then n3 removed), n3 may leave.
    assert isinstance(_apply(machine, ChangeMetadataVoters(("n1", "n2", "n4"), 6)), Applied)
    refused = _apply(machine, UnregisterBroker("n4", 7))
    assert isinstance(refused, Rejected)  # n4 is in the target (and not decommissioning)
    assert isinstance(_apply(machine, AlterMetadataVoters(("n1", "n2", "n3", "n4"), 8)), Applied)
    assert isinstance(_apply(machine, AlterMetadataVoters(("n1", "n2", "n4"), 9)), Applied)
    assert isinstance(_apply(machine, UnregisterBroker("n3", 10)), Applied)
    assert "n3" not in machine.state.brokers


def test_old_snapshots_load_without_voters_and_observers_see_the_sets() -> None:
    machine = _machine()
    _apply(machine, ChangeMetadataVoters(("n1", "n2", "n3", "n4"), 2))
    catalogue = state_to_json(machine.state)
    assert catalogue["voters"] == list(BOOT)
    assert catalogue["voters_target"] == ["n1", "n2", "n3", "n4"]
    assert state_from_json(json.loads(json.dumps(catalogue))) == machine.state
    old = json.loads(machine.snapshot())
    del old["voters"], old["voters_target"]
    restored = MetadataMachine()
    restored.restore(json.dumps(old).encode())
    assert restored.state.voters == () and restored.state.voters_target == ()
    assert restored.state.topics == machine.state.topics


@given(sets, st.integers(0, 2**53))
def test_voter_commands_round_trip_through_their_encoding(
    members: tuple[str, ...], now_ms: int
) -> None:
    for command in (ChangeMetadataVoters(members, now_ms), AlterMetadataVoters(members, now_ms)):
        assert decode_command(encode_command(command)) == command
