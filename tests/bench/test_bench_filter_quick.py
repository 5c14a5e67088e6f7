"""`dmq bench filter --quick` runs end to end against a real broker: the filtered reads
return exactly the 1% that match and every figure is a positive, finite number; `dmq bench
filter` has exactly the options of bench/filter_bench.py (the bytes and CPU targets are
printed by the benchmark, not asserted here)."""

from __future__ import annotations

import argparse
import math
from pathlib import Path

from bench import filter_bench
from dmq import cli


def test_quick_filter_bench_returns_the_matches_and_every_figure(tmp_path: Path) -> None:
    theirs = argparse.ArgumentParser()
    filter_bench.add_arguments(theirs)
    ours = cli.build_parser().parse_args(["bench", "filter", "--quick"])
    expected = vars(theirs.parse_args(["--quick"]))
    assert {k: getattr(ours, k) for k in expected} == expected
    result = filter_bench.run(theirs.parse_args(["--quick", "--dir", str(tmp_path / "b")]))
    assert result["hits"] == {"unfiltered": 10_000, "tags": 100, "selector": 100}
    for name, value in result["medians"].items():
        assert math.isfinite(value) and value > 0, name
