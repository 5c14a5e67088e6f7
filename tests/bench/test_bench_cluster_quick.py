"""`python -m bench.cluster_bench --quick` runs end to end against real 3-node and
1-node `dmq serve` clusters and reports every figure as a positive, finite number (the
targets live in the benchmark's output, not in tests), and leaves no broker running."""

from __future__ import annotations

import argparse
import math
from pathlib import Path

from bench import cluster_bench

PRODUCE_FIGURES = {
    "batched_mb_s",
    "batched_records_s",
    "single_records_s",
    "latency_p50_ms",
    "latency_p99_ms",
}
OTHER_FIGURES = {
    "failover_unavailable_s",
    "partitions_created_s",
    "partitions_all_led_s",
    "leaders_balanced_s",
    "leaders_most_per_broker",
    "idle_cpu_percent_max",
}


def test_quick_cluster_bench_reports_every_figure(tmp_path: Path) -> None:
    parser = argparse.ArgumentParser()
    cluster_bench.add_arguments(parser)
    # fsync only: the "none" level runs the same code with one flag flipped, and the quick run
    # is the suite's longest benchmark.
    args = ["--quick", "--durability", "fsync", "--dir", str(tmp_path)]
    result = cluster_bench.run(parser.parse_args(args))
    medians = result["medians"]
    expected = {
        f"{system}_{durability}_{figure}"
        for system in ("cluster", "single")
        for durability in ("fsync",)
        for figure in PRODUCE_FIGURES
    } | OTHER_FIGURES
    assert expected <= set(medians), sorted(expected - set(medians))
    for name in expected:
        assert math.isfinite(medians[name]) and medians[name] > 0, (name, medians[name])
    assert len(result["checks"]) == 4
    # (f): the leaders' wait ran after they were all led, and the counts are a split of
    # the partitions among the brokers that is at least as even as they can be.
    partitions, brokers = 100, 3
    assert medians["leaders_balanced_s"] >= medians["partitions_all_led_s"]
    fewest, most = medians["leaders_fewest_per_broker"], medians["leaders_most_per_broker"]
    assert fewest <= math.ceil(partitions / brokers) <= most <= partitions
    assert list(tmp_path.iterdir()) == []  # the work directory is removed
