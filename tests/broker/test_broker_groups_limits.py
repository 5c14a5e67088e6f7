"""Proves the consumer-group limits in dmq/limits.py (what the HTTP layer checks and the
docs state) equal the ones the replicated state machine applies (groups.state.GroupsConfig):
a difference would let the API accept what apply refuses, or document wrong bounds."""

from __future__ import annotations

from dmq import limits
from groups.state import GroupsConfig


def test_group_limits_match_the_state_machine() -> None:
    c = GroupsConfig()
    assert (c.groups_max, c.members_per_group_max) == (
        limits.GROUPS_MAX, limits.MEMBERS_PER_GROUP_MAX)  # fmt: skip
    assert (c.session_timeout_ms_min, c.session_timeout_ms_max) == (
        limits.SESSION_TIMEOUT_MS_MIN, limits.SESSION_TIMEOUT_MS_MAX)  # fmt: skip
    assert c.offsets_per_commit_max == limits.OFFSETS_PER_COMMIT_MAX
    assert c.committed_offsets_per_group_max == limits.COMMITTED_OFFSETS_PER_GROUP_MAX
    assert c.subscription_topics_max == limits.SUBSCRIPTION_TOPICS_MAX
    assert c.topic_pattern_chars_max == limits.TOPIC_PATTERN_CHARS_MAX
    assert c.name_chars_max == limits.GROUP_NAME_CHARS_MAX
    assert c.session_timeout_ms_min <= limits.SESSION_TIMEOUT_MS_DEFAULT <= c.session_timeout_ms_max
