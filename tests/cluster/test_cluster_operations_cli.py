"""Proves the operator's path end to end with the real `dmq` CLI against real brokers:

- `dmq serve --join URL` starts a fourth broker knowing only one running broker's URL: it
  learns the peers and metadata voters from it, registers, and becomes eligible;
- `dmq cluster reassign TOPIC P IDS --wait` moves a partition onto it and draws a progress
  bar until `no operation running`; the catalogue then holds exactly the target;
- `dmq cluster metadata-voters n1,n2,n4 --wait` gives n3's metadata vote to n4, and back;
- `dmq cluster decommission-broker n4 --wait` moves its replicas back and it leaves the
  catalogue; `dmq cluster operations` then says nothing is running.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable

import pytest
from cluster_harness import ROOT, DmqCluster, placements, produce, wait_for

from dmq import errors
from dmq.client import Admin


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
    for node_id in first:
        cluster[node_id].start()
    cluster.wait_ready([cluster[n] for n in first])
    joiner = cluster["n4"]
    args = joiner.args
    at = args.index("--peers")
    del args[at : at + 2]
    at = args.index("--metadata-voters")
    del args[at : at + 2]
    args += ["--join", cluster["n1"].url, "--auto-balance-replicas", "false"]
    joiner.start()
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
