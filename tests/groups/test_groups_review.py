"""Proves the consumer-group state machine (groups/state.py) safe against hostile or odd
inputs that a metadata replica applies:

- a topic_pattern is matched in linear time (RE2): a catastrophic-backtracking pattern
  against long topic names applies at once on every join and topic change, and a
  pattern RE2 cannot run (a backreference) is refused at join naming topic_pattern.
"""

from __future__ import annotations

import pytest

from groups.commands import JoinGroup, UpdateTopics
from groups.state import GroupsState, Rejected, apply


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
