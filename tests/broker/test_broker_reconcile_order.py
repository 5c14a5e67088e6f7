"""Proves dmq/broker/reconcile.py's `in_turns`: the replicas a broker opens come in turns
of their preferred leaders, so that a new topic's leaders stay even while it opens.

With the placement's preferred leaders in runs of partitions (as placement.py assigns
them for one topic on an empty cluster), every prefix of the order holds, per topic, at
most one more partition preferring any broker than preferring any other (those that
still have some); nothing is lost or repeated; and the order is the same whatever order
the catalogue listed them in (every broker must compute the same one).
"""

from __future__ import annotations

import collections
import random
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from dmq.broker.reconcile import in_turns
from dmq.metadata.placement import assign_replicas

BROKERS = ["n1", "n2", "n3", "n4"]


@given(
    topics=st.lists(st.integers(1, 60), min_size=1, max_size=3),
    brokers=st.integers(2, 4),
    seed=st.integers(0, 2**32),
)
def test_every_prefix_keeps_the_preferred_leaders_even(
    topics: list[int], brokers: int, seed: int
) -> None:
    members = BROKERS[:brokers]
    missing: list[Any] = []  # (key, (TopicInfo, members)); the info is never read
    existing: dict[str, list[tuple[str, ...]]] = {}
    for t, partitions in enumerate(topics):
        placed = assign_replicas(members, partitions, min(3, brokers), existing)
        existing[f"t{t}"] = [tuple(r) for r in placed]
        missing += [((f"t{t}", p), (None, tuple(r))) for p, r in enumerate(placed)]
    order = in_turns(missing)
    assert sorted(order) == sorted(missing)
    shuffled = list(missing)
    random.Random(seed).shuffle(shuffled)
    assert [k for k, _ in in_turns(shuffled)] == [k for k, _ in order]
    totals = collections.Counter((k[0], w[1][0]) for k, w in missing)
    seen: collections.Counter[tuple[str, str]] = collections.Counter()
    for key, want in order:
        seen[(key[0], want[1][0])] += 1
        for topic in {k[0] for k, _ in missing}:
            open_counts = [
                seen[(topic, b)] for b in members if seen[(topic, b)] < totals[(topic, b)]
            ]
            if open_counts:
                assert max(open_counts) - min(open_counts) <= 1, (topic, seen)
