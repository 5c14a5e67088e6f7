"""Proves the invariants dmq/metadata/placement.py states in its docstring:

- every partition gets `replication_factor` distinct brokers, all from `brokers`;
- on a fixed broker set, any sequence of placements (topics of any replication factor and
  partition count, starting from an empty cluster) keeps the replica counts per broker
  within 1 of each other after every step;
- for one topic on an empty cluster with `partitions` a multiple of the broker count, every
  broker is the preferred leader of exactly `partitions / len(brokers)` partitions;
- replicas on brokers outside `brokers` (dead ones) are ignored; the answer is
  deterministic; more replicas than brokers is a PlacementError.
"""

from __future__ import annotations

from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dmq.metadata.placement import PlacementError, assign_replicas


def _brokers(count: int) -> list[str]:
    return [f"b{i:02d}" for i in range(count)]


@st.composite
def topic_sequences(draw: st.DrawFn) -> tuple[list[str], list[tuple[int, int]]]:
    ids = draw(st.sets(st.integers(0, 99), min_size=1, max_size=9))
    brokers = sorted(f"n{i}" for i in ids)
    topics = draw(
        st.lists(
            st.tuples(st.integers(0, 40), st.integers(1, len(brokers))), min_size=1, max_size=10
        )
    )
    return brokers, topics


@settings(max_examples=150, deadline=None)
@given(case=topic_sequences())
def test_replicas_distinct_and_balanced_within_one_after_every_topic(
    case: tuple[list[str], list[tuple[int, int]]],
) -> None:
    brokers, topics = case
    existing: dict[str, list[tuple[str, ...]]] = {}
    for i, (partitions, rf) in enumerate(topics):
        placed = assign_replicas(brokers, partitions, rf, existing)
        assert len(placed) == partitions
        for replicas in placed:
            assert len(replicas) == rf
            assert len(set(replicas)) == rf
            assert set(replicas) <= set(brokers)
        existing[f"t{i}"] = placed
        counts = Counter(dict.fromkeys(brokers, 0))
        counts.update(b for parts in existing.values() for r in parts for b in r)
        assert max(counts.values()) - min(counts.values()) <= 1, counts


@settings(max_examples=150, deadline=None)
@given(
    broker_count=st.integers(1, 10),
    rf_fraction=st.floats(0, 1),
    multiple=st.integers(1, 8),
)
def test_one_topic_leaders_exactly_balanced(
    broker_count: int, rf_fraction: float, multiple: int
) -> None:
    brokers = _brokers(broker_count)
    rf = 1 + int(rf_fraction * (broker_count - 1))
    placed = assign_replicas(brokers, multiple * broker_count, rf, {})
    leaders = Counter(r[0] for r in placed)
    assert leaders == Counter(dict.fromkeys(brokers, multiple))


def test_dead_brokers_replicas_are_not_counted() -> None:
    existing = {"old": [("gone", "b00"), ("gone", "b01")]}
    placed = assign_replicas(_brokers(2), 2, 1, existing)
    assert sorted(r[0] for r in placed) == ["b00", "b01"]


def test_existing_replicas_steer_new_ones_to_emptier_brokers() -> None:
    existing = {"t": [("b00", "b01")]}
    assert assign_replicas(_brokers(3), 1, 1, existing) == [("b02",)]


def test_deterministic() -> None:
    existing = {"t": assign_replicas(_brokers(5), 7, 3, {})}
    assert assign_replicas(_brokers(5), 11, 2, existing) == assign_replicas(
        _brokers(5), 11, 2, existing
    )


def test_more_replicas_than_brokers_is_refused() -> None:
    with pytest.raises(PlacementError, match="replication_factor 4 is more than the 3"):
        assign_replicas(_brokers(3), 1, 4, {})


@pytest.mark.parametrize(
    ("brokers", "partitions", "rf"),
    [(["b", "a"], 1, 1), (["a", "a"], 1, 1), (["a"], -1, 1), (["a"], 1, 0)],
)
def test_bad_arguments_are_refused(brokers: list[str], partitions: int, rf: int) -> None:
    with pytest.raises(PlacementError):
        assign_replicas(brokers, partitions, rf, {})
