"""Proves that the metadata state machine (dmq/metadata/machine.py) is deterministic and safe to
replicate:

- any sequence of commands (valid or not, time going forwards or backwards) applied to two
  independent MetadataMachines gives equal states and byte-equal snapshots, and a third
  machine that is snapshotted and restored at arbitrary points ends in the same state;
- a Rejected command leaves the state exactly as it was (`clock_ms` included); apply never
  raises; metadata_version, clock_ms and next_topic_id never decrease;
- every partition's replicas are distinct registered brokers, and replica counts per live
  broker stay within one while the broker set is fixed and no topic is deleted;
- decode_command(encode_command(c)) == c for every command type; an unknown version, an
  unknown type or a field of the wrong kind is refused with CommandDecodeError;
- the validation rules: names, partition counts, replication factor <= live brokers
  (liveness = heartbeat within broker_session_ms), existence, stale leader hints.
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import replace
from typing import Any

import pytest
from hypothesis import event, given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from dmq.metadata.machine import (
    AddPartitions,
    AlterTopicConfig,
    Applied,
    BrokerHeartbeat,
    Command,
    CommandDecodeError,
    CreateTopic,
    DeleteTopic,
    MetadataConfig,
    MetadataMachine,
    MetadataState,
    RegisterBroker,
    Rejected,
    ReportLeader,
    apply,
    config_items,
    decode_command,
    encode_command,
)

BROKERS = ["n1", "n2", "n3", "n4"]
TOPICS = ["orders", "clicks", "a.b-c_1", "bad name", ""]
CONFIG = MetadataConfig(broker_session_ms=1_000, topics_max=4, partitions_per_topic_max=8)

now = st.just(0)  # replaced by the machine's clock plus a drawn step, see apply_command
names = st.one_of(st.sampled_from(TOPICS[:3]), st.sampled_from(TOPICS[:3]), st.sampled_from(TOPICS))
partition_counts = st.one_of(st.integers(1, 6), st.integers(1, 6), st.integers(-1, 9))
replication_factors = st.one_of(st.integers(1, 3), st.integers(1, 3), st.integers(0, 5))
config_values = st.one_of(st.integers(-2, 10**12), st.sampled_from(["delete", "compact"]))
bad_config_values = st.one_of(st.floats(allow_nan=False), st.booleans(), st.none())
config_keys = st.sampled_from(["retention_ms", "segment_bytes", "cleanup_policy", "x"])
good_configs = st.dictionaries(config_keys, config_values, max_size=3)
configs = st.one_of(
    good_configs, good_configs, good_configs, st.dictionaries(config_keys, bad_config_values)
)
commands: st.SearchStrategy[Command] = st.one_of(
    st.builds(
        RegisterBroker,
        st.sampled_from([*BROKERS, ""]),
        st.sampled_from(["127.0.0.11:8080", "127.0.0.12:8080"]),
        st.just("127.0.0.11:9090"),
        now,
    ),
    st.builds(BrokerHeartbeat, st.sampled_from(BROKERS), now),
    st.builds(
        CreateTopic, names, partition_counts, replication_factors, configs.map(config_items), now
    ),
    st.builds(
        CreateTopic, names, partition_counts, replication_factors, configs.map(config_items), now
    ),
    st.builds(DeleteTopic, names, now),
    st.builds(
        AlterTopicConfig,
        names,
        configs.map(config_items),
        st.lists(st.sampled_from(["retention_ms", "x"]), max_size=2, unique=True).map(tuple),
        now,
    ),
    st.builds(AddPartitions, names, partition_counts, now),
    st.builds(
        ReportLeader,
        names,
        st.integers(1, 4),
        st.one_of(st.integers(0, 1), st.integers(0, 1), st.integers(-1, 6)),
        st.sampled_from(BROKERS),
        st.integers(0, 5),
        now,
    ),
)
# Time as a leader stamps it: mostly forwards, sometimes backwards (a new leader's clock).
time_steps = st.one_of(st.integers(0, 100), st.integers(0, 100), st.integers(-500, 1_500))


def _check_state(state: MetadataState) -> None:
    for topic in state.topics.values():
        assert topic.topic_id < state.next_topic_id
        for p in topic.partitions:
            assert len(p.replicas) == topic.replication_factor
            assert len(set(p.replicas)) == len(p.replicas)
            assert set(p.replicas) <= set(state.brokers)
            assert p.leader is None or p.leader in p.replicas


class ReplicatedMetadata(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.a = MetadataMachine(CONFIG)
        self.b = MetadataMachine(CONFIG)
        self.c = MetadataMachine(CONFIG)  # snapshotted and restored along the way

    @initialize()
    def register_three_brokers(self) -> None:
        self.now_ms = 0
        for broker in BROKERS[:3]:
            self.apply_command(RegisterBroker(broker, "h", "r", 0), 0)

    @rule(command=commands, step_ms=time_steps)
    def apply_command(self, command: Command, step_ms: int) -> None:
        self.now_ms = max(0, self.now_ms + step_ms)
        command = replace(command, now_ms=self.now_ms)
        data = encode_command(command)
        before = self.a.state
        result = self.a.apply(data)
        assert self.b.apply(data) == result
        assert self.c.apply(data) == result
        after = self.a.state
        event(f"{type(command).__name__}: {getattr(result, 'code', 'applied')}")
        if isinstance(result, Rejected):
            assert after is before
        else:
            assert isinstance(result, Applied)
            assert result.metadata_version == after.metadata_version
        assert after.metadata_version >= before.metadata_version
        assert after.clock_ms >= before.clock_ms
        assert after.next_topic_id >= before.next_topic_id

    @rule(data=st.data(), step_ms=time_steps)
    def touch_existing_topic(self, data: st.DataObject, step_ms: int) -> None:
        """Leader hints and partition additions aimed at a topic that exists."""
        topics = sorted(self.a.state.topics.values(), key=lambda t: t.name)
        if not topics:
            return
        topic = data.draw(st.sampled_from(topics))
        partition = data.draw(st.integers(0, len(topic.partitions) - 1))
        command: Command = data.draw(
            st.one_of(
                st.builds(
                    ReportLeader,
                    st.just(topic.name),
                    st.just(topic.topic_id),
                    st.just(partition),
                    st.sampled_from(topic.partitions[partition].replicas),
                    st.integers(0, 6),
                    now,
                ),
                st.builds(AddPartitions, st.just(topic.name), st.integers(1, 8), now),
            )
        )
        self.apply_command(command, step_ms)

    @rule(data=st.binary(max_size=40))
    def apply_garbage(self, data: bytes) -> None:
        before = self.a.state
        assert isinstance(self.a.apply(data), Rejected)
        assert isinstance(self.b.apply(data), Rejected)
        assert isinstance(self.c.apply(data), Rejected)
        assert self.a.state is before

    @rule()
    def snapshot_and_restore(self) -> None:
        restored = MetadataMachine()
        restored.restore(self.c.snapshot())
        self.c = restored

    @invariant()
    def replicas_agree(self) -> None:
        assert self.a.state == self.b.state == self.c.state
        assert self.a.snapshot() == self.b.snapshot() == self.c.snapshot()
        _check_state(self.a.state)


TestReplicatedMetadata = ReplicatedMetadata.TestCase
TestReplicatedMetadata.settings = settings(max_examples=120, stateful_step_count=80, deadline=None)


@settings(max_examples=200, deadline=None)
@given(command=commands)
def test_encode_decode_round_trip(command: Command) -> None:
    assert decode_command(encode_command(command)) == command


@settings(max_examples=100, deadline=None)
@given(command=commands, version=st.integers().filter(lambda v: v != 1))
def test_unknown_version_is_refused(command: Command, version: int) -> None:
    doc = json.loads(encode_command(command))
    doc["version"] = version
    with pytest.raises(CommandDecodeError, match=f"version {version} is not supported"):
        decode_command(json.dumps(doc).encode())
    result = MetadataMachine().apply(json.dumps(doc).encode())
    assert isinstance(result, Rejected) and result.code == "invalid_command"


@pytest.mark.parametrize(
    "doc",
    [
        {"type": "Nope", "version": 1, "fields": {}},
        {"type": "DeleteTopic", "version": 1, "fields": {"name": "t"}},
        {"type": "DeleteTopic", "version": 1, "fields": {"name": 1, "now_ms": 0}},
        {"type": "DeleteTopic", "version": True, "fields": {"name": "t", "now_ms": 0}},
        {"type": "DeleteTopic", "version": 1, "fields": {"name": "t", "now_ms": False}},
        ["DeleteTopic"],
    ],
)
def test_malformed_commands_are_refused(doc: Any) -> None:
    with pytest.raises(CommandDecodeError):
        decode_command(json.dumps(doc).encode())


def test_hand_built_command_of_unknown_version_is_rejected_not_raised() -> None:
    state = MetadataState()
    new_state, result = apply(state, DeleteTopic("t", 0, version=2))
    assert new_state is state
    assert isinstance(result, Rejected) and result.code == "invalid_command"


def _cluster(brokers: int, now_ms: int = 0) -> MetadataState:
    state = MetadataState(config=CONFIG)
    for i in range(brokers):
        state, result = apply(state, RegisterBroker(f"n{i}", f"h{i}", f"r{i}", now_ms))
        assert isinstance(result, Applied)
    return state


def _rejected(state: MetadataState, command: Command) -> Rejected:
    new_state, result = apply(state, command)
    assert new_state is state
    assert isinstance(result, Rejected), result
    return result


def test_create_topic_places_balanced_replicas() -> None:
    state, result = apply(
        _cluster(3), CreateTopic("t", 6, 2, config_items({"retention_ms": 5}), 10)
    )
    assert isinstance(result, Applied) and result.topic is not None
    topic = result.topic
    assert topic.topic_id == 1 and topic.config == (("retention_ms", 5),)
    assert Counter(p.replicas[0] for p in topic.partitions) == {"n0": 2, "n1": 2, "n2": 2}
    assert Counter(b for p in topic.partitions for b in p.replicas) == {"n0": 4, "n1": 4, "n2": 4}
    assert state.topics["t"] == topic
    assert _rejected(state, CreateTopic("t", 1, 1, (), 11)).code == "topic_exists"


def test_replication_factor_counts_only_live_brokers() -> None:
    state = _cluster(3, now_ms=0)
    state, _ = apply(state, BrokerHeartbeat("n0", 900))
    state, _ = apply(state, BrokerHeartbeat("n1", 900))
    # at 1,500 ms n2 (last heard at 0) is past its 1,000 ms session
    rejected = _rejected(state, CreateTopic("t", 1, 3, (), 1_500))
    assert (rejected.code, rejected.field) == ("not_enough_brokers", "replication_factor")
    state, result = apply(state, CreateTopic("t", 4, 2, (), 1_500))
    assert isinstance(result, Applied) and result.topic is not None
    assert all(set(p.replicas) == {"n0", "n1"} for p in result.topic.partitions)


@pytest.mark.parametrize(
    ("command", "code", "field"),
    [
        (CreateTopic("bad name", 1, 1, (), 0), "invalid_topic_name", "name"),
        (CreateTopic("..", 1, 1, (), 0), "invalid_topic_name", "name"),
        (CreateTopic("t", 0, 1, (), 0), "invalid_partitions", "partitions"),
        (CreateTopic("t", 9, 1, (), 0), "invalid_partitions", "partitions"),
        (CreateTopic("t", 1, 0, (), 0), "invalid_replication_factor", "replication_factor"),
        (CreateTopic("t", 1, 1, config_items({"x": 1.5}), 0), "invalid_config", "config.x"),
        (CreateTopic("t", 1, 1, config_items({"x": True}), 0), "invalid_config", "config.x"),
        (DeleteTopic("nope", 0), "unknown_topic", "name"),
        (AddPartitions("nope", 2, 0), "unknown_topic", "name"),
        (BrokerHeartbeat("nope", 0), "unknown_broker", "broker_id"),
        (RegisterBroker("n9", "", "r", 0), "invalid_argument", "http_addr"),
        (DeleteTopic("t", -1), "invalid_argument", "now_ms"),
    ],
)
def test_invalid_commands_are_rejected_without_change(
    command: Command, code: str, field: str
) -> None:
    rejected = _rejected(_cluster(2), command)
    assert (rejected.code, rejected.field) == (code, field)


def test_add_partitions_grows_only() -> None:
    state, _ = apply(_cluster(2), CreateTopic("t", 2, 2, (), 0))
    assert _rejected(state, AddPartitions("t", 2, 1)).code == "invalid_partitions"
    state, result = apply(state, AddPartitions("t", 5, 1))
    assert isinstance(result, Applied) and result.topic is not None
    assert len(result.topic.partitions) == 5
    assert all(len(set(p.replicas)) == 2 for p in result.topic.partitions)


def test_delete_then_recreate_gets_a_new_topic_id_and_ignores_old_hints() -> None:
    state, _ = apply(_cluster(1), CreateTopic("t", 1, 1, (), 0))
    state, _ = apply(state, DeleteTopic("t", 1))
    assert "t" not in state.topics
    state, result = apply(state, CreateTopic("t", 1, 1, (), 2))
    assert isinstance(result, Applied) and result.topic is not None
    assert result.topic.topic_id == 2
    assert _rejected(state, ReportLeader("t", 1, 0, "n0", 5, 3)).code == "unknown_topic"


def test_alter_config_sets_and_removes_keys() -> None:
    state, _ = apply(_cluster(1), CreateTopic("t", 1, 1, config_items({"a": 1, "b": "x"}), 0))
    state, result = apply(state, AlterTopicConfig("t", config_items({"c": 3}), ("a",), 1))
    assert state.topics["t"].config == (("b", "x"), ("c", 3))
    assert (
        _rejected(state, AlterTopicConfig("t", config_items({"c": 4}), ("c",), 2)).code
        == "invalid_config"
    )


def test_leader_hints_only_move_forward_in_term() -> None:
    state, _ = apply(_cluster(2), CreateTopic("t", 1, 2, (), 0))
    state, result = apply(state, ReportLeader("t", 1, 0, "n1", 3, 1))
    assert isinstance(result, Applied)
    version = state.metadata_version
    state, result = apply(state, ReportLeader("t", 1, 0, "n1", 3, 2))  # a repeat
    assert isinstance(result, Applied) and state.metadata_version == version
    assert _rejected(state, ReportLeader("t", 1, 0, "n0", 3, 3)).code == "stale_leader"
    assert _rejected(state, ReportLeader("t", 1, 0, "n0", 2, 3)).code == "stale_leader"
    assert _rejected(state, ReportLeader("t", 1, 1, "n0", 4, 3)).code == "unknown_partition"
    assert _rejected(state, ReportLeader("t", 1, 0, "n9", 4, 3)).code == "invalid_argument"
    state, _ = apply(state, ReportLeader("t", 1, 0, "n0", 4, 3))
    assert state.topics["t"].partitions[0].leader == "n0"


def test_heartbeats_do_not_bump_metadata_version_and_time_never_goes_back() -> None:
    state = _cluster(1, now_ms=100)
    version = state.metadata_version
    state, _ = apply(state, BrokerHeartbeat("n0", 50))  # a new leader with a lagging clock
    assert state.metadata_version == version
    assert state.clock_ms == 100 and state.brokers["n0"].last_heartbeat_ms == 100


def test_too_many_topics_is_rejected() -> None:
    state = _cluster(1)
    for i in range(CONFIG.topics_max):
        state, result = apply(state, CreateTopic(f"t{i}", 1, 1, (), 0))
        assert isinstance(result, Applied)
    assert _rejected(state, CreateTopic("one-more", 1, 1, (), 0)).code == "too_many_topics"


@settings(max_examples=50, deadline=None)
@given(
    brokers=st.integers(1, 5),
    steps=st.lists(st.tuples(st.booleans(), st.integers(1, 8), st.integers(1, 5)), max_size=12),
)
def test_fixed_cluster_without_deletes_keeps_replicas_within_one(
    brokers: int, steps: list[tuple[bool, int, int]]
) -> None:
    state = _cluster(brokers)
    for i, (add, partitions, rf) in enumerate(steps):
        if add and state.topics:
            name = sorted(state.topics)[i % len(state.topics)]
            total = len(state.topics[name].partitions) + partitions
            state, _ = apply(state, AddPartitions(name, total, 0))
        else:
            state, _ = apply(state, CreateTopic(f"t{i}", partitions, min(rf, brokers), (), 0))
        counts = Counter(dict.fromkeys(state.brokers, 0))
        counts.update(b for t in state.topics.values() for p in t.partitions for b in p.replicas)
        assert max(counts.values()) - min(counts.values()) <= 1, counts


def test_snapshot_of_another_format_is_refused() -> None:
    with pytest.raises(ValueError, match="not a dmq-metadata v1 snapshot"):
        MetadataMachine().restore(b'{"format": "x", "version": 1}')


def test_a_newer_snapshot_is_refused_as_newer() -> None:
    with pytest.raises(ValueError, match="metadata snapshot: format 2 was written by a dmq newer"):
        MetadataMachine().restore(b'{"format": "dmq-metadata", "version": 2}')
