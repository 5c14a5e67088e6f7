"""Proves how consumer groups ride the metadata state machine (dmq/metadata/consumer_groups.py):

- a group command goes through the same envelope and apply, moves clock_ms but never
  metadata_version (observers' catalogue long-polls are not woken by commits);
- creating or growing a topic hands its new partitions to subscribed members in the same
  apply, and deleting it drops the group's offsets for it;
- the snapshot keeps the groups and restores them; the catalogue JSON leaves them out;
- UpdateTopics cannot be proposed from outside (it is derived from the catalogue);
- ExpireTransactionalIds forgets exactly the transactional ids unused for retention_ms
  at the stamped time (a forgotten id starts again at a new producer id, epoch 0; one
  used since keeps its id and epoch), and the last use survives the snapshot.
"""

from __future__ import annotations

import json

from dmq.metadata.machine import (
    AddPartitions,
    Applied,
    CreateTopic,
    DeleteTopic,
    ExpireTransactionalIds,
    InitProducer,
    MetadataMachine,
    RegisterBroker,
    Rejected,
    encode_command,
    state_to_json,
)
from groups.commands import CommitOffsets, JoinGroup, UpdateTopics


def _machine() -> MetadataMachine:
    m = MetadataMachine()
    assert isinstance(m.apply(encode_command(RegisterBroker("n1", "h:1", "r:1", 1))), Applied)
    assert isinstance(m.apply(encode_command(CreateTopic("t", 2, 1, (), 2))), Applied)
    return m


def test_groups_follow_topics_and_stay_out_of_the_catalogue() -> None:
    m = _machine()
    version = m.state.metadata_version
    join = JoinGroup("g", "a", "", ("t", "later"), "", 10_000, "sticky", 3)
    result = m.apply(encode_command(join))
    assert isinstance(result, Applied) and result.metadata_version == version
    assert m.state.groups.groups["g"].members["a"].assigned == (("t", 0), ("t", 1))
    commit = CommitOffsets("g", "a", 1, (("t", 1, 7),), 4)
    assert isinstance(m.apply(encode_command(commit)), Applied)
    assert m.state.metadata_version == version and m.state.clock_ms == 4
    m.apply(encode_command(AddPartitions("t", 3, 5)))
    m.apply(encode_command(CreateTopic("later", 1, 1, (), 6)))
    assert m.state.groups.groups["g"].members["a"].assigned == (
        ("later", 0), ("t", 0), ("t", 1), ("t", 2),
    )  # fmt: skip
    assert "groups" not in json.dumps(state_to_json(m.state))
    restored = MetadataMachine()
    restored.restore(m.snapshot())
    assert restored.state == m.state and restored.snapshot() == m.snapshot()
    m.apply(encode_command(DeleteTopic("t", 7)))
    assert m.state.groups.groups["g"].committed == {}
    assert m.state.groups.groups["g"].members["a"].assigned == (("later", 0),)


def test_update_topics_is_internal_and_group_refusals_are_rejected_results() -> None:
    m = _machine()
    before = m.snapshot()
    result = m.apply(encode_command(UpdateTopics((("t", 9),), 3)))
    assert isinstance(result, Rejected) and result.code == "invalid_command"
    stale = m.apply(encode_command(CommitOffsets("g", "nobody", 1, (("t", 0, 1),), 3)))
    assert isinstance(stale, Rejected) and stale.code == "unknown_member"
    assert m.snapshot() == before


def _producer(m: MetadataMachine, tid: str, now_ms: int) -> tuple[int, int] | None:
    result = m.apply(encode_command(InitProducer(tid, now_ms)))
    assert isinstance(result, Applied)
    return result.producer


def test_idle_transactional_ids_expire_and_used_ones_stay() -> None:
    m = _machine()
    assert _producer(m, "old", 10) == (0, 0)
    assert _producer(m, "busy", 10) == (1, 0)
    assert _producer(m, "busy", 900) == (1, 1)  # used again: its clock restarts
    restored = MetadataMachine()
    restored.restore(m.snapshot())
    assert restored.state == m.state
    assert isinstance(m.apply(encode_command(ExpireTransactionalIds(1_000, 1_500))), Applied)
    assert set(m.state.transactional_ids) == {"busy"}
    assert _producer(m, "busy", 1_600) == (1, 2)
    assert _producer(m, "old", 1_600) == (2, 0)  # forgotten: a new id, not fenced by the old
    bad = m.apply(encode_command(ExpireTransactionalIds(-1, 1_700)))
    assert isinstance(bad, Rejected) and bad.field == "retention_ms"
