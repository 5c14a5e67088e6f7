"""The `upgrade` nemesis (jepsen/upgrade.py) on real `dmq serve` processes of two releases.

Proves: a short run whose brokers are restarted, one at a time, on the other release (this
tree's back to 0.1.0 from git history, 0.1.0's forward to this tree) is valid: no
acknowledged record lost or duplicated, no stale read; the first strike did send a broker
to 0.1.0, which then ran 0.1.0 (its log's start line is 0.1.0's), and the next strike
brought it forward again; if the run finalized (it may, at random, from the third strike
on), no strike after that went to 0.1.0; no worktree is left behind.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from test_jepsen_live import ROOT, run_harness

from jepsen.upgrade import RELEASE_FROM


def old_release_worktrees() -> list[str]:
    """The worktrees of jepsen/upgrade.py's runs (other worktrees come and go meanwhile)."""
    listing = subprocess.run(
        ["git", "-C", str(ROOT), "worktree", "list"], capture_output=True, text=True, check=False
    ).stdout
    return [line for line in listing.splitlines() if "dmq-jepsen-release-from-" in line]


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_runs_across_two_releases_stay_valid(tmp_path: Path) -> None:
    probe = subprocess.run(
        ["git", "-C", str(ROOT), "cat-file", "-e", f"{RELEASE_FROM}^{{commit}}"], check=False
    )
    if probe.returncode != 0:
        pytest.skip(f"git history does not hold {RELEASE_FROM} (a shallow clone?)")
    before = old_release_worktrees()
    code, doc, out, _ = run_harness(
        tmp_path,
        *("--nodes", "3", "--nemesis", "upgrade", "--time-limit-s", "30"),
        *("--seed", "6", "--fault-interval-s", "3", "4"),
        timeout_s=280,
    )
    assert code == 0, out
    assert doc["valid"] == "valid" and doc["anomalies"] == {}, doc["anomalies"]
    assert doc["checkers"]["log"]["stats"]["sends_ok"] > 100, doc["checkers"]["log"]["stats"]
    history = [json.loads(line) for line in (tmp_path / "history.jsonl").read_text().splitlines()]
    strikes = [e["value"] for e in history if e.get("f") == "start-upgrade"]
    assert strikes and RELEASE_FROM in strikes[0]["releases"].values(), strikes
    old = next(n for n, release in strikes[0]["releases"].items() if release == RELEASE_FROM)
    log = (tmp_path / f"{old}.log").read_text()
    assert f"INFO dmq.server: starting broker {old} (data dir" in log  # 0.1.0's start line
    # The broker sent back comes forward at the next strike: the run went both ways.
    assert len(strikes) >= 2 and strikes[1]["releases"] == {old: "this tree"}, strikes
    finalized = [i for i, s in enumerate(strikes) if s.get("finalize") == 200]
    if finalized:
        after = strikes[finalized[0] :]
        assert all(RELEASE_FROM not in s["releases"].values() for s in after), strikes
    assert old_release_worktrees() == before, "the run left a worktree of the old release"
