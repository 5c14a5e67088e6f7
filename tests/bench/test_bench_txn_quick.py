"""`dmq bench txn --quick` runs end to end against 3 real brokers and reports every figure
as a positive, finite number; `dmq bench txn` has exactly the options of
bench/txn_bench.py (speed targets live in the benchmark's output, not here)."""

from __future__ import annotations

import argparse
import math

from bench import txn_bench
from dmq import cli

FIGURES = {
    "idempotent_records_per_s", "txn_records_per_s", "ratio", "commit_p50_ms",
    "commit_p99_ms", "transactions", "complete_records_per_s", "complete_ratio",
    "complete_commit_p50_ms", "complete_commit_p99_ms", "idempotent_cpu_ms_per_unit",
    "txn_cpu_ms_per_unit", "txn_metadata_entries_per_unit", "txn_partition_entries_per_unit",
    "idempotent_partition_entries_per_unit",
}  # fmt: skip


def test_quick_txn_bench_reports_every_figure() -> None:
    theirs = argparse.ArgumentParser()
    txn_bench.add_arguments(theirs)
    ours = cli.build_parser().parse_args(["bench", "txn", "--quick"])
    expected = vars(theirs.parse_args(["--quick"]))
    assert {k: getattr(ours, k) for k in expected} == expected
    results = txn_bench.run(theirs.parse_args(["--quick"]))
    assert set(results) == FIGURES
    for name, value in results.items():
        assert math.isfinite(value) and value > 0, name
