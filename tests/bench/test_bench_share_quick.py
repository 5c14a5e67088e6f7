"""`dmq bench share --quick` runs end to end against a real broker and reports every figure
as a positive, finite number; `dmq bench share` has exactly the options of
bench/share_bench.py (the speed target, 4 members >= 3x one member, is printed by the
benchmark, not asserted here)."""

from __future__ import annotations

import argparse
import math

from bench import share_bench
from dmq import cli

FIGURES = {
    "one_member_per_s", "members_per_s", "ratio", "acks_per_s",
    "redelivery_after_expiry_ms", "redelivery_after_release_ms",
}  # fmt: skip


def test_quick_share_bench_reports_every_figure() -> None:
    theirs = argparse.ArgumentParser()
    share_bench.add_arguments(theirs)
    ours = cli.build_parser().parse_args(["bench", "share", "--quick"])
    expected = vars(theirs.parse_args(["--quick"]))
    assert {k: getattr(ours, k) for k in expected} == expected
    figures = share_bench.run(theirs.parse_args(["--quick", "--nodes", "1"]))
    assert set(figures) == FIGURES
    for name, value in figures.items():
        assert math.isfinite(value) and value > 0, name
    # A record whose member died comes again about when its lock runs out, not never.
    assert figures["redelivery_after_expiry_ms"] < 5_000
