"""The brokers domain's storage reports (ReportStorage, issue #28).

Proves: a ReportStorage encodes and decodes to itself and to the same bytes; applied, it
sets the broker's free bytes and level and moves neither metadata_version nor the clock;
an unknown broker, an unknown level or negative free bytes are Rejected with the state
unchanged; a snapshot with reports restores them, one without any is the same JSON older
code wrote (no storage keys); placement puts no replica on a broker reported full while
enough others can take them, and still places on it when it is the only one.
"""

from __future__ import annotations

import json

from hypothesis import given
from hypothesis import strategies as st

from dmq.metadata.machine import (
    Applied,
    CreateTopic,
    MetadataState,
    RegisterBroker,
    Rejected,
    ReportStorage,
    apply,
    decode_command,
    encode_command,
    state_from_json,
    state_to_json,
)


def cluster(brokers: int) -> MetadataState:
    state = MetadataState()
    for i in range(brokers):
        state, result = apply(state, RegisterBroker(f"n{i}", f"h{i}", f"r{i}", 1_000))
        assert isinstance(result, Applied)
    return state


@given(
    free=st.integers(0, 2**62),
    level=st.sampled_from(["ok", "alert", "full"]),
    now=st.integers(0, 2**52),
)
def test_reports_round_trip_and_apply_without_moving_version_or_clock(
    free: int, level: str, now: int
) -> None:
    command = ReportStorage("n1", free, level, now)
    data = encode_command(command)
    assert decode_command(data) == command and encode_command(decode_command(data)) == data
    state = cluster(2)
    new_state, result = apply(state, command)
    assert isinstance(result, Applied)
    broker = new_state.brokers["n1"]
    assert (broker.free_bytes, broker.storage_level) == (free, level)
    assert new_state.metadata_version == state.metadata_version
    assert new_state.clock_ms == state.clock_ms
    restored = state_from_json(json.loads(json.dumps(state_to_json(new_state))))
    assert restored.brokers == new_state.brokers


def test_bad_reports_are_rejected_without_change() -> None:
    state = cluster(1)
    for command in (
        ReportStorage("stranger", 10, "ok", 5),
        ReportStorage("n0", 10, "nearly", 5),
        ReportStorage("n0", -2, "ok", 5),
    ):
        new_state, result = apply(state, command)
        assert new_state is state and isinstance(result, Rejected), command


def test_a_catalogue_without_reports_snapshots_without_storage_keys() -> None:
    doc = state_to_json(cluster(2))
    for broker in doc["brokers"].values():
        assert "free_bytes" not in broker and "storage_level" not in broker


def test_placement_avoids_a_broker_reported_full_while_others_can_take_replicas() -> None:
    state = cluster(3)
    state, _ = apply(state, ReportStorage("n1", 0, "full", 1_500))
    state, result = apply(state, CreateTopic("t", 6, 2, (), 2_000))
    assert isinstance(result, Applied)
    replicas = [p.replicas for p in state.topics["t"].partitions]
    assert all("n1" not in r for r in replicas), replicas
    # Three replicas need every broker: the full one still takes its share.
    state, result = apply(state, CreateTopic("u", 2, 3, (), 2_100))
    assert isinstance(result, Applied)
    assert all("n1" in p.replicas for p in state.topics["u"].partitions)
