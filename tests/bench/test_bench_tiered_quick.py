"""`dmq bench tiered --quick` runs end to end against a real broker with a file:// store:
every figure is a positive, finite number, part of the topic was read back from the store
and part locally; `dmq bench tiered` has exactly the options of bench/tiered_bench.py (the
figures are printed, not asserted: the machine is shared). `--proof` at 8 MB on 3 nodes:
every offset read back from the wiped follower, part of it from the store, each broker's
partition directory back within local retention and two segments once uploads caught up
(at 8 MB the peak is all of it: the uploads' 0.5 s rounds outlast the writes)."""

from __future__ import annotations

import argparse
import math
from pathlib import Path

import pytest

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


@pytest.mark.slow
def test_the_proof_on_three_nodes_reads_every_offset_back_from_a_wiped_follower(
    tmp_path: Path,
) -> None:
    parser = argparse.ArgumentParser()
    tiered_bench.add_arguments(parser)
    # 8 MB is ~32 Raft entries: without a snapshot the wiped follower replays the whole
    # journal, all of it local, and may read nothing from the store (a full run saw 0).
    proof = ["--proof", "--total-mb", "8", "--local-retention-mb", "2", "--snapshot-entries", "8"]
    args = parser.parse_args([*proof, "--dir", str(tmp_path)])
    found = tiered_bench.run(args)
    assert found["records"] == 8 * 1024 and found["read_bytes"] >= found["sent_bytes"] * 0.9
    assert found["read_from_store_bytes"] > 0  # the wiped follower served the remote part
    assert found["wiped"] in found["max_log_bytes"] and found["restore_s"] > 0
    bound = found["local_retention_bytes"] + 2 * found["segment_bytes"]
    for node, (log_bytes, _) in found["at_rest"].items():  # 8 MB written, 2 MiB kept
        assert log_bytes <= bound < found["sent_bytes"], (node, log_bytes)
    assert not list(tmp_path.iterdir())  # the work directory is removed
