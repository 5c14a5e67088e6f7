"""`bench.writeback_bench --quick` and `bench.stall_bench --quick` run and print every figure
(log/writeback.py's early write-back: the seal's fdatasync with and without it; a probe
partition's latency beside a heavy one on a real broker). They check no speed: a busy
machine must not fail a test.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from bench import stall_bench, writeback_bench
from log.writeback import Writeback


def test_writeback_bench_quick_measures_both_modes(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    if not Writeback().available:
        pytest.skip("no sync_file_range here (not Linux)")
    assert writeback_bench.main(["--quick", "--dir", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    rows = re.findall(r"^(without|with)\s+([0-9.]+)\s+([0-9.]+)\s+([0-9]+)\s+([0-9]+)$", out, re.M)
    assert [r[0] for r in rows] == ["without", "with"], out
    assert all(float(r[1]) > 0 and float(r[4]) > 0 for r in rows), out
    assert list(tmp_path.iterdir()) == []  # its work directory is gone


def test_stall_bench_quick_probes_beside_a_heavy_load(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert stall_bench.main(["--quick", "--dir", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    medians = dict(re.findall(r"(\w+) ([0-9.]+)", out.split("medians:")[1].splitlines()[0]))
    assert float(medians["heavy_mb_s"]) > 0 and float(medians["probe_p50_ms"]) > 0, out
    assert list(tmp_path.iterdir()) == []
