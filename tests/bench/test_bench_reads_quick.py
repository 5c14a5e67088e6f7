"""`dmq bench reads --quick` runs end to end against 3 real brokers and reports every figure
as a positive, finite number; `dmq bench reads` has exactly the options of
bench/reads_bench.py (speed targets live in the benchmark's output, not here)."""

from __future__ import annotations

import argparse
import math

from bench import reads_bench
from dmq import cli


def test_quick_reads_bench_reports_every_figure() -> None:
    theirs = argparse.ArgumentParser()
    reads_bench.add_arguments(theirs)
    ours = cli.build_parser().parse_args(["bench", "reads", "--quick"])
    expected = vars(theirs.parse_args(["--quick"]))
    assert {k: getattr(ours, k) for k in expected} == expected
    results = reads_bench.run(theirs.parse_args(["--quick"]))
    figures = {f"{k}_ratio" for k in reads_bench.KINDS} | {
        f"{k}_{level}_{what}"
        for k in reads_bench.KINDS
        for level in reads_bench.LEVELS
        for what in ("per_s", "p50_ms", "p99_ms")
    }
    assert set(results) == figures
    for name, value in results.items():
        assert math.isfinite(value) and value > 0, name
