"""Proves the feature-level rules (dmq/metadata/features.py, dmq/compat.py): the finalized
level only grows whatever commands arrive, a repeat is a no-op, it survives a snapshot,
a catalogue never finalized snapshots without the `features` key (0.1.0 reads it as its
own), and finalize's laggards are exactly the brokers whose range excludes the target,
brokers not heard from included."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from dmq import compat
from dmq.metadata.machine import FinalizeFeatureLevel, MetadataMachine, apply, encode_command
from dmq.metadata.state import Applied, MetadataState, Rejected


@given(st.lists(st.integers(min_value=-2, max_value=5), max_size=12))
def test_finalized_level_is_the_running_maximum_of_valid_levels(levels: list[int]) -> None:
    state = MetadataState()
    highest = 0
    for level in levels:
        before = state
        state, result = apply(state, FinalizeFeatureLevel(level, now_ms=1))
        if level < highest:
            assert isinstance(result, Rejected) and state is before
        else:
            assert isinstance(result, Applied)
            highest = level
        assert state.finalized_level == highest


def test_a_repeated_finalize_changes_nothing_visible() -> None:
    state, _ = apply(MetadataState(), FinalizeFeatureLevel(1, now_ms=5))
    again, result = apply(state, FinalizeFeatureLevel(1, now_ms=9))
    assert isinstance(result, Applied) and again is state


def test_the_finalized_level_survives_a_snapshot_and_is_absent_until_set() -> None:
    machine = MetadataMachine()
    assert b'"features"' not in machine.snapshot()  # byte-compatible with 0.1.0's
    machine.apply(encode_command(FinalizeFeatureLevel(1, now_ms=3)))
    snapshot = machine.snapshot()
    assert b'"features":{"finalized_level":1}' in snapshot
    restored = MetadataMachine()
    restored.restore(snapshot)
    assert restored.state.finalized_level == 1


@given(
    st.dictionaries(
        st.sampled_from(["n1", "n2", "n3", "n4"]),
        st.one_of(
            st.none(),
            st.tuples(st.integers(0, 3), st.integers(0, 3)).map(lambda r: (min(r), max(r))),
        ),
    ),
    st.integers(0, 3),
)
def test_laggards_are_the_brokers_whose_range_excludes_the_level(
    ranges: dict[str, tuple[int, int] | None], level: int
) -> None:
    brokers = {node: ("0.x", levels) for node, levels in ranges.items()}
    refused = compat.laggards(level, brokers)
    expected = {n for n, r in ranges.items() if r is None or not r[0] <= level <= r[1]}
    assert set(refused) == expected
    common = compat.highest_common_level([r for r in ranges.values() if r is not None])
    if common is not None and None not in ranges.values():
        assert compat.laggards(common, brokers) == {}


def test_an_answer_without_the_header_is_0_1_0s_level_0_only() -> None:
    assert compat.feature_range_of({}) == (0, 0)
    assert compat.feature_range_of({compat.FEATURES_HEADER: "0-1"}) == (0, 1)
    assert compat.feature_range_of({compat.FEATURES_HEADER: "2-1"}) is None
    refused = compat.laggards(1, {"n3": ("0.1.0", (0, 0))})
    assert refused == {"n3": "runs dmq 0.1.0, which supports feature levels 0 to 0"}
