"""`dmq bench tls --quick` runs end to end against a plain and a TLS broker (certificates
of dmq/dev_certs.py) and reports every figure as a positive, finite number; `dmq bench
tls` has exactly the options of bench/tls_bench.py (the >= 70% target lives in the
output and bench/README.md, not here: a 2-core CI machine is too noisy to assert it)."""

from __future__ import annotations

import argparse
import math
from pathlib import Path

from bench import tls_bench
from dmq import cli


def test_quick_tls_bench_reports_every_figure(tmp_path: Path) -> None:
    theirs = argparse.ArgumentParser()
    tls_bench.add_arguments(theirs)
    ours = cli.build_parser().parse_args(["bench", "tls", "--quick"])
    expected = vars(theirs.parse_args(["--quick"]))
    assert {k: getattr(ours, k) for k in expected} == expected
    result = tls_bench.run(theirs.parse_args(["--quick", "--dir", str(tmp_path)]))
    for name in ("produce_mb_s_plain_median", "produce_mb_s_tls_median", "tls_over_plain",
                 "broker_cpu_s_per_gb_plain_median", "broker_cpu_s_per_gb_tls_median"):  # fmt: skip
        assert math.isfinite(result[name]) and result[name] > 0, name
