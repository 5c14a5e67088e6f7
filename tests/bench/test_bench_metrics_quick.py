"""`dmq bench metrics --quick` runs end to end against a real broker and reports every
figure as a positive, finite number, with scrapes seen; `dmq bench metrics` has exactly
the options of bench/metrics_bench.py (the < 2% target lives in the output, not here)."""

from __future__ import annotations

import argparse
import math

from bench import metrics_bench
from dmq import cli


def test_quick_metrics_bench_reports_every_figure() -> None:
    theirs = argparse.ArgumentParser()
    metrics_bench.add_arguments(theirs)
    ours = cli.build_parser().parse_args(["bench", "metrics", "--quick"])
    expected = vars(theirs.parse_args(["--quick"]))
    assert {k: getattr(ours, k) for k in expected} == expected
    result = metrics_bench.run(theirs.parse_args(["--quick"]))
    assert result["scrapes"] >= 1
    for name in ("produce_mb_s_median", "produce_mb_s_scraped_median", "scraped_over_plain",
                 "scrape_ms_median", "scrape_bytes_median", "broker_cpu_s_per_gb_median",
                 "broker_cpu_s_per_gb_scraped_median", "broker_cpu_ms_per_scrape",
                 "broker_cpu_s_per_s_producing_median", "scrape_cost_share", "scrape_share_of_one_core"):  # fmt: skip
        assert math.isfinite(result[name]) and result[name] > 0, name
