"""Proves the consumer-group state machine (groups/state.py) safe against hostile or odd
inputs that a metadata replica applies:

- a topic_pattern is matched in linear time (RE2): a catastrophic-backtracking pattern
  against long topic names applies at once on every join and topic change, and a
  pattern RE2 cannot run (a backreference) is refused at join naming topic_pattern;
- a group is deleted only when it has no members (group_not_empty otherwise), and
  ExpireGroups forgets exactly the empty groups unchanged for retention_ms at the
  command's time (a commit or a member leaving restarts the clock);
- names with a trailing newline ("g\\n") are refused (group, member, instance and topic
  names in groups/, topic names in the metadata catalogue).
"""

from __future__ import annotations

import pytest

from dmq.metadata.machine import CreateTopic, MetadataMachine, RegisterBroker, encode_command
from dmq.metadata.machine import Rejected as MetadataRejected
from groups.commands import (
    CommitOffsets,
    DeleteGroup,
    ExpireGroups,
    JoinGroup,
    LeaveGroup,
    UpdateTopics,
)
from groups.state import GroupDeleted, GroupsState, Rejected, apply


@pytest.mark.timeout(60)
def test_a_backtracking_pattern_applies_in_linear_time() -> None:
    topics = tuple((("a" * n), 1) for n in range(40, 240, 20))
    state, _ = apply(GroupsState(), UpdateTopics(topics, 0))
    # Python's re takes 2^n steps for (a+)+c against n a's: this would never finish.
    state, events = apply(state, JoinGroup("g", "m1", "", (), "(a+)+c", 10_000, "sticky", 1))
    assert not any(isinstance(e, Rejected) for e in events), events
    state, events = apply(state, JoinGroup("g", "m2", "", (), "(a+)+", 10_000, "sticky", 2))
    state, _ = apply(state, UpdateTopics((*topics, ("a" * 249, 2)), 3))
    held = {tp for m in state.groups["g"].members.values() for tp in m.assigned}
    assert {tp[0] for tp in held} == {name for name, _ in topics} | {"a" * 249}


def test_a_pattern_that_needs_backtracking_is_refused_naming_the_field() -> None:
    state, events = apply(
        GroupsState(), JoinGroup("g", "m1", "", (), r"(a)\1", 10_000, "sticky", 1)
    )
    assert state == GroupsState()
    (rejected,) = events
    assert isinstance(rejected, Rejected) and rejected.field == "topic_pattern"
    assert "RE2" in rejected.message


def test_only_empty_groups_are_deleted_and_idle_empty_groups_expire() -> None:
    state, _ = apply(GroupsState(), UpdateTopics((("t", 2),), 0))
    state, _ = apply(state, JoinGroup("busy", "m1", "", ("t",), "", 10_000, "sticky", 10))
    state, _ = apply(state, CommitOffsets("idle", "", -1, (("t", 0, 5),), 20))
    state, _ = apply(state, CommitOffsets("fresh", "", -1, (("t", 0, 7),), 20))
    state, events = apply(state, DeleteGroup("busy", 30))
    assert isinstance(events[0], Rejected) and events[0].code == "group_not_empty"
    state, events = apply(state, DeleteGroup("nope", 30))
    assert isinstance(events[0], Rejected) and events[0].code == "group_not_found"
    state, _ = apply(state, CommitOffsets("fresh", "", -1, (("t", 0, 8),), 500))  # restarts
    state, events = apply(state, ExpireGroups(1_000, 1_100))
    assert events == (GroupDeleted("idle", "expired"),)
    assert set(state.groups) == {"busy", "fresh"}  # busy has a member, fresh changed at 500
    generation = state.groups["busy"].generation
    state, events = apply(state, CommitOffsets("busy", "m1", generation, (("t", 1, 3),), 1_150))
    assert not any(isinstance(e, Rejected) for e in events), events
    state, _ = apply(state, LeaveGroup("busy", "m1", 1_200))
    state, events = apply(state, ExpireGroups(1_000, 2_100))
    assert events == (GroupDeleted("fresh", "expired"),)
    state, events = apply(state, DeleteGroup("busy", 2_100))
    assert events == (GroupDeleted("busy", "deleted"),) and state.groups == {}


def test_a_trailing_newline_is_not_part_of_a_valid_name() -> None:
    state, _ = apply(GroupsState(), UpdateTopics((("t", 1),), 0))
    for join in (
        JoinGroup("g\n", "m", "", ("t",), "", 10_000, "sticky", 1),
        JoinGroup("g", "m\n", "", ("t",), "", 10_000, "sticky", 1),
        JoinGroup("g", "m", "i\n", ("t",), "", 10_000, "sticky", 1),
        JoinGroup("g", "m", "", ("t\n",), "", 10_000, "sticky", 1),
    ):
        after, events = apply(state, join)
        assert after == state and isinstance(events[0], Rejected), join
    m = MetadataMachine()
    m.apply(encode_command(RegisterBroker("n1", "h:1", "r:1", 1)))
    assert isinstance(m.apply(encode_command(CreateTopic("t\n", 1, 1, (), 2))), MetadataRejected)
