"""Proves the operator's path end to end with the real `dmq` CLI against real brokers:

- `dmq serve --join DEAD_URL,URL` starts a fourth broker before the cluster it names is
  up: it asks both URLs in turn until n1 answers, learns the peers and metadata voters
  from it, registers, and becomes eligible; a `--join` nobody answers ends within its
  `--join-timeout-ms`, exit 1, naming each URL;
- `dmq cluster reassign TOPIC P IDS --wait` moves a partition onto it and draws a progress
  bar until `no operation running`; the catalogue then holds exactly the target;
- `dmq cluster metadata-voters n1,n2,n4 --wait` gives n3's metadata vote to n4, and back;
- `dmq cluster decommission-broker n4 --wait` moves its replicas back and it leaves the
  catalogue; `dmq cluster operations` then says nothing is running.
"""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from cluster_harness import ROOT, DmqCluster, placements, produce, wait_for

from dmq import errors
from dmq.client import Admin
from tests_support import free_port


def dmq(*args: str, timeout_s: float = 120.0) -> str:
    proc = subprocess.run(
        [sys.executable, "-m", "dmq", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout_s,
    )
    assert proc.returncode == 0, f"dmq {' '.join(args)}: {proc.returncode}\n{proc.stderr}"
    return proc.stdout


def test_join_reassign_and_decommission_through_the_cli(
    dmq_cluster: Callable[..., DmqCluster],
) -> None:
    cluster = dmq_cluster(4, metadata_voters=["n1", "n2", "n3"])
    first = ["n1", "n2", "n3"]
    cluster.limit_peers(first, first)
    joiner = cluster["n4"]
    dead = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    cluster.use_join("n4", f"{dead},{cluster['n1'].url}")
    joiner.args += ["--auto-balance-replicas", "false"]
    joiner.start()  # before the cluster it joins: it asks again until n1 answers
    wait_for(lambda: "asking again" in joiner.log_path.read_text(), 30.0, "n4 waiting")
    assert joiner.alive
    for node_id in first:
        cluster[node_id].start()
    cluster.wait_ready([cluster[n] for n in first])
    cluster.wait_ready([joiner])
    brokers = cluster["n2"].json("GET", "/v1/cluster")["brokers"]
    assert sorted(b["node_id"] for b in brokers) == ["n1", "n2", "n3", "n4"]
    assert cluster["n1"].json("GET", "/v1/cluster")["metadata_voters"] == first
    # The voter set: n4 takes n3's vote, then gives it back (one Raft change at a time).
    url = cluster["n1"].url
    out = dmq("cluster", "metadata-voters", "n1,n2,n4", "--wait", "--url", url)
    assert "n1,n2,n3 -> n1,n2,n4" in out and "no operation running" in out, out
    assert cluster["n2"].json("GET", "/v1/cluster")["metadata_voters"] == ["n1", "n2", "n4"]
    dmq("cluster", "metadata-voters", "n1,n2,n3", "--wait", "--url", url)
    # n4, removed, serves its idle group-0 copy until it asks the leader (2 s checks).
    wait_for(lambda: cluster["n4"].json("GET", "/v1/cluster")["metadata_voters"] == first,
             10.0, "n4 an observer again")  # fmt: skip
    assert "metadata voters n1,n2,n3" in dmq("cluster", "status", "--url", url)

    cluster.create_topic("cli", partitions=1, replication_factor=3)
    offsets = produce(cluster["n1"], "cli", [{"value": f"v{i}", "partition": 0} for i in range(50)])
    [before] = placements(cluster["n1"], "cli")
    assert "n4" not in before  # auto balancing off; placement ties go by broker id
    target = ["n4", *before[1:]]
    out = dmq("cluster", "reassign", "cli", "0", ",".join(target), "--wait", "--url", url)
    assert "[" in out and "%" in out and "no operation running" in out, out
    assert placements(cluster["n1"], "cli") == [target]

    out = dmq("cluster", "decommission-broker", "n4", "--wait", "--url", url)
    assert "no operation running" in out, out
    [after] = placements(cluster["n1"], "cli")
    assert "n4" not in after and len(after) == 3
    wait_for(
        lambda: (
            "n4" not in [b["node_id"] for b in cluster["n1"].json("GET", "/v1/cluster")["brokers"]]
        ),
        30.0,
        "n4 unregistered",
    )
    assert "no operation running" in dmq("cluster", "operations", "--url", url)
    with Admin(url) as admin:  # the Python client's view of the same
        assert admin.operations() == {
            "reassignments": [],
            "decommissions": [],
            "partition_decommissions": [],
            "metadata_voters": {
                "voters": first,
                "target": None,
                "step": "done",
                "progress": 1.0,
            },
        }
        with pytest.raises(errors.NotFound):
            admin.decommission_broker("n4")  # gone
    records = cluster["n1"].json("GET", "/v1/topics/cli/partitions/0/records?offset=0")["records"]
    assert [r["value"] for r in records] == [f"v{i}" for i in range(50)]
    assert [o for _, o in offsets] == list(range(50))


def test_a_join_no_broker_answers_ends_naming_each_url(tmp_path: Path) -> None:
    dead = [f"http://127.0.0.1:{free_port()}", f"127.0.0.1:{free_port()}"]
    started = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "-m", "dmq", "serve", "--data-dir", str(tmp_path / "n9"),
         "--node-id", "n9", "--http-addr", f"127.0.0.1:{free_port()}",
         "--raft-addr", f"127.0.0.1:{free_port()}",
         "--join", ",".join(dead), "--join-timeout-ms", "1500"],
        cwd=ROOT, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    took = time.monotonic() - started
    assert proc.returncode == 1, proc.stderr
    last = proc.stderr.strip().splitlines()[-1]
    assert "no broker answered with the cluster" in last, proc.stderr
    assert dead[0] in last and f"http://{dead[1]}" in last, last
    assert "asking again" in proc.stderr  # it did wait, then gave up
    assert took < 30, took  # 1.5 s of patience plus one round and interpreter start
    assert not (tmp_path / "n9" / "meta" / "joined_cluster.json").exists()
