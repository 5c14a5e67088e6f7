"""`python -m bench.txn_apply_bench --quick` applies real transactions to a real metadata
machine at each count of ids (it raises if any command is refused) and reports every
figure as a positive, finite number (the speed figures live in the benchmark's output)."""

from __future__ import annotations

import argparse
import math

from bench import txn_apply_bench


def test_quick_txn_apply_bench_reports_every_figure() -> None:
    parser = argparse.ArgumentParser()
    txn_apply_bench.add_arguments(parser)
    results = txn_apply_bench.run(parser.parse_args(["--quick"]))
    assert set(results) == {
        "ids_10_us_per_transaction",
        "ids_1000_us_per_transaction",
        "ids_1000_ratio",
    }
    for name, value in results.items():
        assert math.isfinite(value) and value > 0, name
