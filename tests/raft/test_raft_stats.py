"""Proves raft/stats.py's LatencyBuckets: an observation lands in the first bucket whose
bound is at least its value (+Inf past the last), the count is the buckets' sum, and
bounds must increase."""

from __future__ import annotations

import pytest

from raft.stats import LatencyBuckets


def test_observations_land_in_their_bucket() -> None:
    buckets = LatencyBuckets((0.001, 0.01))
    for seconds in (0.0005, 0.001, 0.005, 2.0):
        buckets.observe(seconds)
    snap = buckets.snapshot()
    assert snap.counts == (2, 1, 1)
    assert snap.count == 4
    assert snap.sum_s == pytest.approx(2.0065)


def test_bounds_must_increase() -> None:
    with pytest.raises(ValueError):
        LatencyBuckets((0.01, 0.001))
