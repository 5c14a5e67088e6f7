"""`dmq bench groups --quick` runs end to end against real brokers (3 nodes and 1 node) and
reports every figure as a positive, finite number; `dmq bench groups` has exactly the
options of bench/groups_bench.py (speed targets live in the benchmark's output, not here)."""

from __future__ import annotations

import argparse
import math

from bench import groups_bench
from dmq import cli

FIGURES = {
    "commit_p50_ms", "commit_p99_ms", "produce_p50_ms", "produce_p99_ms",
    "commits_per_s", "produces_per_s", "death_to_served_s",
}  # fmt: skip


def test_quick_groups_bench_reports_every_figure() -> None:
    theirs = argparse.ArgumentParser()
    groups_bench.add_arguments(theirs)
    ours = cli.build_parser().parse_args(["bench", "groups", "--quick"])
    expected = vars(theirs.parse_args(["--quick"]))
    assert {k: getattr(ours, k) for k in expected} == expected
    results = groups_bench.run(theirs.parse_args(["--quick"]))
    assert set(results) == {3, 1}
    for figures in results.values():
        assert set(figures) == FIGURES
        for name, value in figures.items():
            assert math.isfinite(value) and value > 0, name
    # A dead member's partitions are served again after about one session (1 s), not never.
    assert all(r["death_to_served_s"] < 10 for r in results.values())
