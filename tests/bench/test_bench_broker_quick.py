"""`dmq bench broker --quick` runs end to end against a real broker and reports every
figure as a positive, finite number (speed targets live in the benchmark's output,
not in tests)."""

from __future__ import annotations

import argparse
import math
from pathlib import Path

from bench import broker_bench

FIGURES = {
    "log_append_mb_s",
    "binary_produce_mb_s",
    "binary_produce_records_s",
    "json_produce_records_s",
    "json_produce_mb_s",
    "binary_fetch_mb_s",
    "latency_p50_ms",
    "latency_p99_ms",
    "relaxed_latency_p50_ms",
    "relaxed_latency_p99_ms",
}


def test_quick_broker_bench_reports_every_figure(tmp_path: Path) -> None:
    parser = argparse.ArgumentParser()
    broker_bench.add_arguments(parser)
    args = parser.parse_args(["--quick", "--dir", str(tmp_path / "bench")])
    result = broker_bench.run(args)
    assert set(result["medians"]) == FIGURES
    for name, value in result["medians"].items():
        assert math.isfinite(value) and value > 0, name
    assert len(result["checks"]) == 5
