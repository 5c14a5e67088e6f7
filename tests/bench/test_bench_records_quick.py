"""The #22 micro-benchmarks run in their quick modes and print every figure.

Proves that `bench.records_bench --quick --against FILE` measures validate_batch, its CRC,
both record walks (scalar and numpy arrays, uncompressed batches) and decode_batch for each
of the five batch shapes, against an older records.py loaded beside
the current one (here the current file itself, so both validate the same batches), and
that `bench.request_bench --chain` measures the middleware chain of the application
`make_app` builds. It checks no speed: a busy machine must not fail a test.
"""

from __future__ import annotations

import math
import re
from pathlib import Path

import pytest

from bench import records_bench, request_bench

ROOT = Path(__file__).resolve().parents[2]


def _figures(text: str, label: str) -> list[float]:
    return [float(m) for m in re.findall(rf"{re.escape(label)}\s+(-?[0-9.]+)", text)]


def test_records_bench_quick_prints_every_case(capsys: pytest.CaptureFixture[str]) -> None:
    assert records_bench.main(["--quick", "--against", str(ROOT / "log" / "records.py")]) == 0
    out = capsys.readouterr().out
    for label in ("validate_batch", "CRC-32C alone", "decode_batch", "validate_batch, --against"):
        figures = _figures(out, label)
        assert len(figures) == 5, (label, out)  # every batch shape
        assert all(f > 0 for f in figures), (label, out)
    for walk in ("record walk alone, scalar", "record walk alone, arrays"):
        figures = _figures(out, walk)
        assert len(figures) == 4 and all(f > 0 for f in figures), (walk, out)  # uncompressed


def test_request_bench_chain_measures_the_middlewares(capsys: pytest.CaptureFixture[str]) -> None:
    assert request_bench.main(["--chain", "--rounds", "1"]) == 0
    out = capsys.readouterr().out
    # A difference of two timings: on a busy machine it may come out at or below zero.
    (figure,) = _figures(out, "this")
    assert math.isfinite(figure) and "CPU us per request" in out, out
