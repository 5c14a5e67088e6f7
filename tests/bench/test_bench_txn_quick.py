"""`dmq bench txn --quick` runs end to end against 3 real brokers and reports every figure
as a positive, finite number; `dmq bench txn` has exactly the options of
bench/txn_bench.py (speed targets live in the benchmark's output, not here)."""

from __future__ import annotations

import argparse
import math

import pytest

from bench import txn_bench
from dmq import cli

# Each producer count's figures (prefixed p2_ and p4_ in a quick run) ...
PER_COUNT = {
    "idempotent_records_per_s", "txn_records_per_s", "ratio", "commit_p50_ms",
    "commit_p99_ms", "transactions", "complete_records_per_s", "complete_ratio",
    "complete_commit_p50_ms", "complete_commit_p99_ms", "idempotent_cpu_ms_per_unit",
    "idempotent_client_cpu_ms_per_unit", "txn_cpu_ms_per_unit", "txn_client_cpu_ms_per_unit",
    "txn_metadata_entries_per_unit", "txn_partition_entries_per_unit",
    "idempotent_partition_entries_per_unit", "cpu_ratio",
}  # fmt: skip
# ... and the saturated throughput: each mode's best over the counts.
SATURATED = {
    "idempotent_records_per_s", "txn_records_per_s", "ratio", "complete_records_per_s",
    "complete_ratio",
}  # fmt: skip
FIGURES = {f"p{n}_{k}" for n in (2, 4) for k in PER_COUNT} | SATURATED


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
    for mode in ("idempotent", "txn", "complete"):  # the best count's, not another figure
        best = max(results[f"p{n}_{mode}_records_per_s"] for n in (2, 4))
        assert results[f"{mode}_records_per_s"] == best
    assert results["ratio"] == results["txn_records_per_s"] / results["idempotent_records_per_s"]


def test_producer_counts_refuses_what_it_cannot_run() -> None:
    assert txn_bench.producer_counts("4,16,64") == [4, 16, 64]
    for bad in ("", "4,x", "0,4", "4,4"):
        with pytest.raises(SystemExit, match="--producers"):
            txn_bench.producer_counts(bad)
