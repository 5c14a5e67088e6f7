"""`bench.arrow_decode_bench --quick --against FILE` runs and prints every figure.

Proves that the spark_io decoder's micro-benchmark decodes every answer shape in each mode
(vectorised, scalar, and an older _arrow.py loaded beside the current one: here the
current file itself), that the modes decode to the same batch (the benchmark checks it),
and prints a positive time for each. It checks no speed: a busy machine must not fail a
test.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from bench import arrow_decode_bench

ROOT = Path(__file__).resolve().parents[2]


def test_arrow_decode_bench_quick_prints_every_case(capsys: pytest.CaptureFixture[str]) -> None:
    against = str(ROOT / "spark_io" / "_arrow.py")
    assert arrow_decode_bench.main(["--quick", "--against", against]) == 0
    out = capsys.readouterr().out
    for mode in ("vectorised", "scalar", "--against"):
        figures = [float(m) for m in re.findall(rf"  {re.escape(mode)}\s+([0-9.]+) ms", out)]
        assert len(figures) == 6, (mode, out)
        assert all(f > 0 for f in figures), (mode, out)
