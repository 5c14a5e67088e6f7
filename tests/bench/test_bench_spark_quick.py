"""`dmq bench spark --quick` runs end to end (a real broker, a local Spark) and reports
every figure as a positive, finite number; `dmq bench spark` takes exactly the
benchmark's options. The speed targets are printed by the benchmark, not tested here."""

from __future__ import annotations

import argparse
import io
import math
from pathlib import Path

import pytest

from bench import spark_bench
from dmq import cli

FIGURES = (
    "dmq_rows_s", "dmq_mb_s", "parquet_rows_s", "parquet_mb_s", "dmq_vs_parquet",
    "python_source_rows_s", "python_source_mb_s", "dmq_vs_python_source", "microbatch_s",
    "batch_read_same_records_s",
)  # fmt: skip


def test_dmq_bench_spark_has_the_options_of_the_benchmark() -> None:
    theirs = argparse.ArgumentParser()
    spark_bench.add_arguments(theirs)
    ours = cli.build_parser().parse_args(["bench", "spark"])
    expected = vars(theirs.parse_args([]))
    assert {k: getattr(ours, k) for k in expected} == expected


def test_quick_spark_bench_reports_every_figure(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The JVM the benchmark starts (if this process has none yet) with the first JIT tier
    # only and the serial GC, as tests/spark_io/conftest.py starts its own: half the CPU
    # for this short run. Only the figures change, and none is compared to a target here.
    monkeypatch.setenv("JAVA_TOOL_OPTIONS", "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC")
    parser = argparse.ArgumentParser()
    spark_bench.add_arguments(parser)
    out = io.StringIO()

    result = spark_bench.run(parser.parse_args(["--quick", "--dir", str(tmp_path)]), out=out)

    for name in FIGURES:
        assert math.isfinite(result[name]) and result[name] > 0, name
    assert math.isfinite(result["microbatch_overhead_s"])
    assert result["records"] == 8 * 1024
    assert [t["name"] for t in result["targets"]] == [
        "dmq read / Python source read", "dmq read / Parquet read", "micro-batch overhead, s",
    ]  # fmt: skip
    text = out.getvalue()
    assert "broker and Spark sharing the machine" in text
    assert text.count("PASS") + text.count("FAIL") == 3
    assert "load average at start" in text and "load average at end" in text
    assert list(tmp_path.iterdir()) == [], "the work directory is left behind"
