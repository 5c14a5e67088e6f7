"""Proves the feature-level commands end to end with the real `dmq` CLI on a real broker
(README.md, "Releases and upgrading"):

- every answer names the levels its broker supports (`X-Dmq-Feature-Levels: 0-1`);
- `dmq cluster features` shows the finalized level (0 on a new cluster) and each
  broker's release and range;
- `dmq cluster upgrade --finalize` raises it to this release's highest (1), shown by
  `dmq cluster features` and GET /v1/cluster/features afterwards, and kept over a restart
  (it is replicated state, in the journal);
- a lower level is refused (exit 1, naming the finalized level), nothing changed;
- at level 1 an internal call signed in the plain form is refused (401 `plain`).
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable

from cluster_harness import ROOT, DmqCluster

import dmq as dmq_package
from dmq.compat import FEATURES_HEADER


def dmq(*args: str, ok: bool = True) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(
        [sys.executable, "-m", "dmq", *args], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert (proc.returncode == 0) == ok, f"dmq {' '.join(args)}: {proc.returncode}\n{proc.stderr}"
    return proc


def test_features_shown_finalized_and_never_lowered(
    dmq_cluster: Callable[..., DmqCluster],
) -> None:
    cluster = dmq_cluster(1, secret=os.urandom(32))
    cluster.start_all()
    n1 = cluster["n1"]
    assert n1.request("GET", "/healthz").headers[FEATURES_HEADER] == "0-1"
    shown = dmq("cluster", "features", "--url", n1.url).stdout
    assert "finalized feature level 0:" in shown
    row = next(line.split() for line in shown.splitlines() if line.startswith("n1"))
    assert row == ["n1", dmq_package.__version__, "0", "1"], shown
    assert "finalizable now: 1" in shown

    done = dmq("cluster", "upgrade", "--finalize", "--url", n1.url).stdout
    assert "finalized feature level 1" in done
    assert "finalized feature level 1:" in dmq("cluster", "features", "--url", n1.url).stdout

    lower = dmq("cluster", "upgrade", "--finalize", "--level", "0", "--url", n1.url, ok=False)
    assert "finalized at feature level 1" in lower.stderr and "never lowered" in lower.stderr

    plain = n1.request("GET", "/v1/internal/status")  # the harness signs plainly
    assert plain.status == 401 and plain.json()["error"]["details"]["reason"] == "plain"

    assert n1.proc is not None
    n1.proc.terminate()
    n1.proc.wait(30)
    n1.start()
    cluster.wait_ready([n1])
    assert n1.json("GET", "/v1/cluster/features")["finalized_level"] == 1
