"""Proves the share-groups domain (dmq/metadata/share_groups.py) in the catalogue, over
random sequences of share commands sent as bytes through a real MetadataMachine (a topic
created, grown and deleted among them):

- every command round-trips through its wire form; a refused one leaves the state
  unchanged, `clock_ms` included; `metadata_version` never moves for a share command;
- an AcquireRecords naming a partition the catalogue does not have is refused;
- deleting a topic drops its share-partitions (a topic created again starts over);
- snapshot and restore give the same bytes, and two replicas given the same commands
  reach byte-identical snapshots; a snapshot without share groups has no `share_groups`
  key (older snapshots keep their bytes).
"""

from __future__ import annotations

import json
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from dmq.metadata.machine import (
    AddPartitions,
    Applied,
    CreateTopic,
    DeleteTopic,
    MetadataMachine,
    RegisterBroker,
    Rejected,
    decode_command,
    encode_command,
)
from groups.share_commands import (
    AckRecords,
    AcquireRecords,
    ExpireShareLocks,
    JoinShareGroup,
    LeaveShareGroup,
    MarkDeadLettered,
    PutShareGroup,
)

MEMBERS = ("a", "b")


def _machine() -> MetadataMachine:
    m = MetadataMachine()
    m.apply(encode_command(RegisterBroker("n1", "h:1", "r:1", 1)))
    m.apply(encode_command(CreateTopic("t", 2, 1, (), 1)))
    return m


def commands() -> st.SearchStrategy[Any]:
    now = st.integers(0, 20_000)
    member = st.sampled_from(MEMBERS)
    part = st.integers(0, 3)
    offsets = st.lists(st.integers(0, 12), max_size=6, unique=True).map(lambda o: tuple(sorted(o)))
    acquire = st.builds(
        lambda m, items, n, t: AcquireRecords("g", m, tuple(items), n, t),
        member,
        st.lists(
            st.builds(
                lambda p, s, f: ("t", p, s, f, (f[-1] + 1) if f else s),
                part,
                st.integers(0, 3),
                offsets,
            ),  # fmt: skip
            max_size=2,
            unique_by=lambda i: i[1],
        ),  # fmt: skip
        st.integers(0, 8),
        now,
    )
    ack = st.builds(
        lambda m, items, t: AckRecords("g", m, tuple(items), t),
        member,
        st.lists(
            st.tuples(
                st.just("t"),
                part,
                st.integers(0, 12),
                st.sampled_from(["accept", "release", "reject", "bogus"]),
                st.sampled_from([0, 500, -1]),
            ),
            max_size=3,
        ),  # fmt: skip
        now,
    )
    return st.one_of(
        st.builds(
            lambda ms, n, t: PutShareGroup("g", ms, n, "", 10, 45_000, t),
            st.sampled_from([500, 1_000, 5_000]),
            st.integers(0, 4),
            now,
        ),  # fmt: skip
        st.builds(lambda m, t: JoinShareGroup("g", m, ("t",), t), member, now),
        st.builds(lambda m, t: LeaveShareGroup("g", (m,), t), member, now),
        acquire,
        acquire,
        ack,
        ack,
        st.builds(ExpireShareLocks, now),
        st.builds(
            lambda p, o, t: MarkDeadLettered("g", (("t", p, o),), t), part, st.integers(0, 12), now
        ),  # fmt: skip
        st.builds(lambda t: AddPartitions("t", 3, t), now),
        st.builds(lambda t: DeleteTopic("t", t), now),
        st.builds(lambda t: CreateTopic("t", 2, 1, (), t), now),
    )


@settings(max_examples=60, deadline=None)
@given(cmds=st.lists(commands(), max_size=40))
def test_share_commands_in_the_catalogue_keep_its_rules(cmds: list[Any]) -> None:
    m, twin = _machine(), _machine()
    assert "share_groups" not in json.loads(m.snapshot())
    for cmd in cmds:
        data = encode_command(cmd)
        assert decode_command(data) == cmd
        before = m.state
        result = m.apply(data)
        twin.apply(data)
        if isinstance(result, Rejected):
            assert m.state is before, result
            continue
        assert isinstance(result, Applied)
        is_share = not isinstance(cmd, (AddPartitions, DeleteTopic, CreateTopic))
        if is_share:
            assert m.state.metadata_version == before.metadata_version
        if isinstance(cmd, AcquireRecords) and cmd.partitions:
            known = m.state.topics.get("t")
            assert known is not None
            assert all(p < len(known.partitions) for _, p, *_ in cmd.partitions)
        topic = m.state.topics.get("t")
        for group in m.state.share_groups.groups.values():
            for name, p in group.partitions:
                assert topic is not None and p < len(topic.partitions), (name, p)
    snapshot = m.snapshot()
    assert snapshot == twin.snapshot()
    restored = MetadataMachine()
    restored.restore(snapshot)
    assert restored.snapshot() == snapshot
    assert restored.state.share_groups == m.state.share_groups


def test_deleting_the_topic_drops_its_share_partitions() -> None:
    m = _machine()
    for cmd in (
        JoinShareGroup("g", "a", ("t",), 2),
        AcquireRecords("g", "a", (("t", 0, 0, (0, 1), 2),), 5, 3),
    ):
        assert isinstance(m.apply(encode_command(cmd)), Applied)
    assert ("t", 0) in m.state.share_groups.groups["g"].partitions
    missing = m.apply(encode_command(AcquireRecords("g", "a", (("t", 7, 0, (), 0),), 5, 4)))
    assert isinstance(missing, Rejected) and missing.code == "unknown_partition"
    m.apply(encode_command(DeleteTopic("t", 5)))
    assert m.state.share_groups.groups["g"].partitions == {}
