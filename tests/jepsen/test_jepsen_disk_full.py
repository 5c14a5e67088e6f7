"""The `disk-full` nemesis (jepsen/diskfull.py, issue #28) on real `dmq serve` processes.

Proves: a short run (3 nodes, each data directory on its own tmpfs, a node's, a leader's
or a minority's filled below the floor and freed again) is valid: no acknowledged record
lost or duplicated, no stale read, the group checkers valid; the full brokers did refuse
produce (507, definite failures in the history) and never exited (the run ends with every
broker alive and caught up); every tmpfs is unmounted at the end.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from test_jepsen_live import run_harness


def mounts_under(path: Path) -> list[str]:
    table = subprocess.run(["mount"], capture_output=True, text=True).stdout
    return [line for line in table.splitlines() if str(path) in line]


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_runs_with_full_disks_stay_valid(tmp_path: Path) -> None:
    probe = tmp_path / "probe"
    probe.mkdir()
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(probe)],
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        pytest.skip(f"the disk-full nemesis mounts tmpfs (root only): {done.stderr.strip()}")
    subprocess.run(["umount", str(probe)], check=True)
    code, doc, out, _ = run_harness(
        tmp_path,
        *("--nodes", "3", "--nemesis", "disk-full", "--time-limit-s", "18"),
        *("--seed", "4", "--fault-interval-s", "4", "5"),
        timeout_s=280,
    )
    assert code == 0, out
    assert doc["valid"] == "valid" and doc["anomalies"] == {}, doc["anomalies"]
    stats = doc["checkers"]["log"]["stats"]
    assert stats["sends_ok"] > 100, stats
    history = [json.loads(line) for line in (tmp_path / "history.jsonl").read_text().splitlines()]
    strikes = [e for e in history if e.get("f") == "start-disk-full"]
    assert strikes, "the nemesis must have filled a disk"
    refused = [
        e
        for e in history
        if e.get("type") == "fail" and isinstance(e.get("value"), dict)
        and e["value"].get("status") == 507
    ]  # fmt: skip
    assert refused, "no produce met a full disk: nothing was proven"
    assert not mounts_under(tmp_path), "the run left a tmpfs mounted"
