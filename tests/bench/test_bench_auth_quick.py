"""`dmq bench auth --quick` runs end to end against a broker with --auth off and one with
--auth on (a user with ACLs, bearer token) and reports every figure as a positive, finite
number; `dmq bench auth` has exactly the options of bench/auth_bench.py."""

from __future__ import annotations

import argparse
import math
from pathlib import Path

from bench import auth_bench
from dmq import cli


def test_quick_auth_bench_reports_every_figure(tmp_path: Path) -> None:
    theirs = argparse.ArgumentParser()
    auth_bench.add_arguments(theirs)
    ours = cli.build_parser().parse_args(["bench", "auth", "--quick"])
    expected = vars(theirs.parse_args(["--quick"]))
    assert {k: getattr(ours, k) for k in expected} == expected
    result = auth_bench.run(theirs.parse_args(["--quick", "--dir", str(tmp_path)]))
    for name in ("batched_produce_mb_s_off_median", "batched_produce_mb_s_on_median",
                 "batched_on_over_off", "small_produce_requests_s_off_median",
                 "small_produce_requests_s_on_median", "small_on_over_off",
                 "uncached_verification_ms_median", "cached_check_us_per_request_median"):  # fmt: skip
        assert math.isfinite(result[name]) and result[name] > 0, name
