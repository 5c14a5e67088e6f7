"""`python -m bench.compare_nats --quick` runs a 3-node NATS JetStream cluster and a
3-node dmq cluster on loopback and reports every figure as a positive, finite number.

Needs the Debian package nats-server (the Makefile installs it); skipped only when it
is missing. The nats-py client is a dev dependency, so its absence is a failure."""

from __future__ import annotations

import argparse
import math
from pathlib import Path

import pytest

from bench import compare_nats


def test_quick_nats_comparison_reports_every_figure(tmp_path: Path) -> None:
    if compare_nats.nats_server_path() is None:
        pytest.skip("nats-server is not installed (apt-get install -y nats-server)")
    parser = argparse.ArgumentParser()
    compare_nats.add_arguments(parser)
    result = compare_nats.run(parser.parse_args(["--quick", "--dir", str(tmp_path)]))
    medians = result["medians"]
    dmq_figures = ("msgs_s_linger5", "msgs_s_linger0", "p50_ms", "p99_ms")
    expected = {f"nats_{k}" for k in ("msgs_s", "p50_ms", "p99_ms")} | {
        f"dmq_{d}_{k}" for d in ("fsync", "none") for k in dmq_figures
    }
    assert set(medians) == expected
    for name, value in medians.items():
        assert math.isfinite(value) and value > 0, (name, value)
    assert len(result["checks"]) == 6  # per durability: records/s at each linger, p99
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("value", ["", "5,5", "-1", "5,x", "1001"])
def test_linger_values_are_checked(value: str) -> None:
    parser = argparse.ArgumentParser()
    compare_nats.add_arguments(parser)
    with pytest.raises(SystemExit):
        parser.parse_args(["--linger-ms", value])
