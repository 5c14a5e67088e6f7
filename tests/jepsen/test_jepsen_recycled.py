"""Proves, with `python -m jepsen.run` on real `dmq serve` processes, that recycled Raft
journal files (raft/journal.py: every compaction writes the kept tail over the file the
one before retired) keep the acks=all contract under whole-cluster power losses.

The brokers compact every 64 entries (`--snapshot-entries 64`), so each partition's
journal file is recycled again and again; the power nemesis kills every broker at once
and cuts each journal and segment at a length drawn between its last traced durable
length and its end (a torn write, which in a recycled file lands in the old life's
records). The run must be valid (no acknowledged record lost or duplicated, no stale
read) with writes acknowledged and power cuts done; the same run with the planted bug
no-fsync (journals never fdatasync'ed) must be caught by the log checker: the cut then
drops acknowledged records (offsets acknowledged past what the partitions hold).
"""

from __future__ import annotations

from pathlib import Path

import pytest
from test_jepsen_live import run_harness

SETUP = ("--nodes", "3", "--nemesis", "power", "--time-limit-s", "20", "--snapshot-entries", "64")


@pytest.mark.slow
@pytest.mark.timeout(400)
@pytest.mark.parametrize("planted_bug", [None, "no-fsync"])
def test_power_cuts_over_recycled_journals(tmp_path: Path, planted_bug: str | None) -> None:
    bug = ("--planted-bug", planted_bug) if planted_bug else ()
    code, doc, out, _ = run_harness(
        tmp_path, *SETUP, "--seed", "7", "--group-workers", "0", *bug, timeout_s=380
    )
    journals = list(tmp_path.glob("n*/raft/groups/*/journal.spare"))
    assert journals, "no journal was compacted: nothing was recycled"
    if planted_bug is None:
        assert code == 0, out
        assert doc["valid"] == "valid", doc.get("anomalies")
    else:  # acknowledged records gone: offsets acknowledged above the high watermark
        assert code == 1, out
        assert doc["valid"] == "invalid" and any(a.startswith("log:") for a in doc["anomalies"])
