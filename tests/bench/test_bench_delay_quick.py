"""`dmq bench delay --quick` runs end to end against a real broker: every delayed record
arrives (none early), every figure is a positive, finite number and the pending records
are counted before and after the restart; `dmq bench delay` has exactly the options of
bench/delay_bench.py (the lateness and memory figures are printed, not asserted)."""

from __future__ import annotations

import argparse
import math
from pathlib import Path

from bench import delay_bench
from dmq import cli


def test_quick_delay_bench_reports_every_figure(tmp_path: Path) -> None:
    theirs = argparse.ArgumentParser()
    delay_bench.add_arguments(theirs)
    ours = cli.build_parser().parse_args(["bench", "delay", "--quick"])
    expected = vars(theirs.parse_args(["--quick"]))
    assert {k: getattr(ours, k) for k in expected} == expected
    result = delay_bench.run(theirs.parse_args(["--quick", "--dir", str(tmp_path / "b")]))
    assert result["pending_counted"] == [5_000, 5_000]
    medians = result["medians"]
    assert medians["early_records"] == 0
    for name, value in medians.items():
        if name != "early_records":
            assert math.isfinite(value) and value > 0, name
