"""`dmq bench tiered --quick` runs end to end against a real broker with a file:// store:
every figure is a positive, finite number, part of the topic was read back from the store
and part locally; `dmq bench tiered` has exactly the options of bench/tiered_bench.py (the
figures are printed, not asserted: the machine is shared)."""

from __future__ import annotations

import argparse
import math
from pathlib import Path

from bench import tiered_bench
from dmq import cli


def test_quick_tiered_bench_reports_every_figure(tmp_path: Path) -> None:
    theirs = argparse.ArgumentParser()
    tiered_bench.add_arguments(theirs)
    ours = cli.build_parser().parse_args(["bench", "tiered", "--quick"])
    expected = vars(theirs.parse_args(["--quick"]))
    assert {k: getattr(ours, k) for k in expected} == expected
    result = tiered_bench.run(theirs.parse_args(["--quick", "--dir", str(tmp_path)]))
    for name, value in result["medians"].items():
        assert math.isfinite(value) and value > 0, name
    assert not list(tmp_path.iterdir())  # the work directory is removed
