"""`python -m bench.ceiling_bench --quick` runs both trees against real brokers: the copy
really leaves the segment's write out (its brokers' segment files stay empty while the
as-is brokers' hold what was produced), and every figure is a positive, finite number.
How much faster the copy is lives in the output (bench/README.md), not here."""

from __future__ import annotations

import argparse
import math
from pathlib import Path

import pytest

from bench import ceiling_bench


def test_quick_ceiling_bench_measures_a_tree_that_never_writes_segments() -> None:
    parser = argparse.ArgumentParser()
    ceiling_bench.add_arguments(parser)
    result = ceiling_bench.run(parser.parse_args(["--quick"]))
    assert result["segment_bytes"]["as-is"] and all(n > 0 for n in result["segment_bytes"]["as-is"])
    assert result["segment_bytes"]["one-write"] == [0, 0]
    for tree in ceiling_bench.TREES:
        for figure, value in result["medians_mb_s"][tree].items():
            assert math.isfinite(value) and value > 0, (tree, figure)
        ratio = result[f"{tree}_ratios"]["binary_of_baseline"]
        assert math.isfinite(ratio) and ratio > 0, tree


def test_the_copy_refuses_a_tree_whose_write_line_changed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    copy = ceiling_bench.copy_tree(tmp_path / "plain", one_write=False)
    assert ceiling_bench.WRITE_LINE in (copy / "log" / "segment.py").read_text()
    patched = ceiling_bench.copy_tree(tmp_path / "patched", one_write=True)
    text = (patched / "log" / "segment.py").read_text()
    assert ceiling_bench.WRITE_LINE not in text and ceiling_bench.NO_WRITE_LINE in text
    # Measuring a copy that still writes would report no ceiling at all: refused instead.
    monkeypatch.setattr(ceiling_bench, "WRITE_LINE", "a line no tree holds")
    with pytest.raises(RuntimeError, match="the line to change is gone"):
        ceiling_bench.copy_tree(tmp_path / "stale", one_write=True)


def test_segment_bytes_counts_segments_not_the_brokers_own_output(tmp_path: Path) -> None:
    (tmp_path / "n1" / "partitions").mkdir(parents=True)
    (tmp_path / "n1" / "partitions" / ("0" * 20 + ".log")).write_bytes(b"x" * 100)
    (tmp_path / "n1.log").write_text("a broker's warning\n")
    assert ceiling_bench.segment_bytes(tmp_path) == 100
