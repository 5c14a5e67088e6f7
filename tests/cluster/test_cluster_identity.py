"""Proves, on real `dmq serve` processes, the cluster identity (dmq/README.md, "Cluster
identity"):

- three brokers started together and two that join later report one cluster id
  (`GET /v1/cluster`, `dmq cluster status`, each data directory's meta.properties), and
  the same one after every broker is killed and started again;
- a broker whose data directory belongs to cluster A, holding acknowledged records, is
  refused, each time with exit status 1, one line naming both ids and the remedy, every
  file of its data directory unchanged and cluster B's broker list unchanged: started
  with another --node-id; asked to --join cluster B (B answers its request 409 and logs
  it); and, started with B's brokers as Raft peers, each side drops the other's Raft
  connection (logged with both ids) while it serves its own records on its own;
- a broker whose own metadata group names another cluster than its `meta.properties`
  stops (exit 1, both ids) with its partition data unchanged, and serves it again once
  its own file is back;
- `--join` with a directory that holds data but no identity (from before cluster ids)
  is refused, nothing changed;
- `dmq storage reset` refuses while the broker runs, and once it is stopped empties the
  directory, which then joins cluster B as a new broker (the explicit move);
- stray partition data (A's partition copied into a broker of B, under the name and
  topic id of a topic B deleted) is set aside at start with its Raft directory, listed by
  `GET /v1/storage/set-aside` byte for byte, never deleted nor opened: a topic of the
  same name created in B afterwards starts empty.
"""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from cluster_harness import ROOT, DmqCluster, Node, fetch_all, produce, wait_for

from dmq import meta_file

RECORDS = [{"key": f"k{i}", "value": f"v{i}"} for i in range(3)]


def _files(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in root.rglob("*") if p.is_file()}


def _cluster_id(node: Node) -> str:
    return str(node.json("GET", "/v1/cluster")["cluster_id"])


def _brokers(node: Node) -> list[str]:
    return [b["node_id"] for b in node.json("GET", "/v1/cluster")["brokers"]]


def _stop(node: Node) -> None:
    """SIGTERM and wait: a clean stop (flushes, releases the lock)."""
    assert node.proc is not None
    node.proc.send_signal(signal.SIGTERM)
    assert node.proc.wait(20) == 0, node.log_tail()


def _dmq(*args: str, timeout_s: float = 30.0) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "dmq", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout_s,
        check=False,
    )


def _one_error_line(result: subprocess.CompletedProcess[str]) -> str:
    assert result.returncode == 1, (result.returncode, result.stdout, result.stderr)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and result.stdout == "", (result.stdout, result.stderr)
    return lines[0]


def test_one_cluster_id_on_every_broker_after_joins_and_a_restart_of_all(
    dmq_cluster: Any,
) -> None:
    cluster: DmqCluster = dmq_cluster(5)
    first = ["n1", "n2", "n3"]
    cluster.limit_peers(first, first)
    for node_id in first:
        cluster[node_id].start()
    cluster.wait_ready([cluster[n] for n in first])
    cluster.use_join("n4", cluster["n1"].url)
    cluster.use_join("n5", f"{cluster['n2'].url},{cluster['n3'].url}")
    cluster["n4"].start()
    cluster["n5"].start()
    cluster.wait_ready()

    def one_id_everywhere(via_cli: bool) -> str:
        ids = {node.node_id: _cluster_id(node) for node in cluster.nodes.values()}
        assert len(set(ids.values())) == 1 and meta_file.read(cluster["n1"].data_dir), ids
        (cluster_id,) = set(ids.values())
        for node in cluster.nodes.values():
            assert meta_file.read(node.data_dir) == meta_file.DataDirMeta(cluster_id, node.node_id)
            assert _brokers(node) == ["n1", "n2", "n3", "n4", "n5"]
        if via_cli:
            status = _dmq("cluster", "status", "--url", cluster["n5"].url)
            assert status.returncode == 0, status.stderr
            assert status.stdout.startswith(f"cluster {cluster_id},"), status.stdout
        return cluster_id

    cluster_id = one_id_everywhere(via_cli=True)
    cluster.kill_all()
    for node in cluster.nodes.values():
        node.start()
    cluster.wait_ready()
    assert one_id_everywhere(via_cli=False) == cluster_id


def test_a_broker_of_another_cluster_is_refused_and_keeps_its_data(dmq_cluster: Any) -> None:
    cluster: DmqCluster = dmq_cluster(2)  # cluster B: n1 alone (its one metadata voter)
    n1, n2 = cluster["n1"], cluster["n2"]
    b_args = list(n2.args)
    # Cluster A: n2 alone, with a topic and three acknowledged records.
    cluster.limit_peers(["n2"], ["n2"])
    n2.start()
    cluster.wait_ready([n2])
    cluster.create_topic("ledger", 1, 1, via=n2)
    assert produce(n2, "ledger", RECORDS) == [(0, 0), (0, 1), (0, 2)]
    a_id = _cluster_id(n2)
    _stop(n2)
    n1.start()
    cluster.wait_ready([n1])
    b_id = _cluster_id(n1)
    assert a_id != b_id
    before = _files(n2.data_dir)

    # 1. Another node id on A's directory.
    other = [*n2.args[n2.args.index("--data-dir") : n2.args.index("--peers")], "--node-id", "n9"]
    line = _one_error_line(_dmq("serve", *other))
    assert f"belongs to broker n2 of cluster {a_id}, not to --node-id n9" in line, line
    assert "start it with --node-id n2" in line
    assert _files(n2.data_dir) == before

    # 2. --join cluster B with A's directory: B answers 409 and logs it.
    line = _one_error_line(_dmq("serve", *n2.args, "--join", n1.url))
    assert f"belongs to cluster {a_id}, --join {n1.url} is cluster {b_id}" in line, line
    assert "dmq storage reset" in line and "start it without --join" in line
    assert _files(n2.data_dir) == before
    assert f"this request comes from cluster {a_id}: refused" in n1.log_tail()
    assert _brokers(n1) == ["n1"]

    # 3. Started with B's brokers as Raft peers: each drops the other's connections, and
    #    n2 serves its own records, on its own.
    n2.args = [*b_args, "--metadata-voters", "n2"]  # its own group 0, as before
    n2.start()
    cluster.wait_ready([n2])
    dropped = f"of cluster {a_id}, this node is of cluster {b_id}: a broker of another cluster"
    wait_for(lambda: dropped in n1.log_tail(), 20, "n1 dropping n2's Raft connection")
    wait_for(
        lambda: f"of cluster {b_id}, this node is of cluster {a_id}" in n2.log_tail(),
        20,
        "n2 dropping n1's",
    )
    assert fetch_all(n2, "ledger", 0) == [(i, f"k{i}", f"v{i}") for i in range(3)]
    assert _cluster_id(n2) == a_id and _brokers(n1) == ["n1"] and _brokers(n2) == ["n2"]
    request = urllib.request.Request(
        n2.url + "/v1/internal/status", headers={"X-Dmq-Cluster-Id": b_id}
    )
    try:
        urllib.request.urlopen(request, timeout=10)  # noqa: S310 - a loopback test URL
        raise AssertionError("an internal call of another cluster was served")
    except urllib.error.HTTPError as refused:
        assert refused.code == 409
        assert json.loads(refused.read())["error"]["code"] == "cluster_id_mismatch"

    # 4. Reset refuses while n2 runs; once n2 stopped it empties the directory.
    busy = _dmq("storage", "reset", "--data-dir", str(n2.data_dir), "--yes")
    assert busy.returncode == 1 and "runs on" in busy.stderr, busy.stderr
    _stop(n2)
    a_partition = _files(n2.partition_dir("ledger", 0))
    a_group = _files(n2.group_dir(1 * 1024))  # topic id 1, partition 0
    a_copy = n1.data_dir.parent / "a-copy"
    shutil.copytree(n2.data_dir, a_copy)

    # 5. A's partition copied into B's broker: set aside at start, never opened nor
    #    deleted, although B's own `ledger` had the same name and topic id 1 (every
    #    cluster numbers topics from 1) and B deleted it: judged by topic id alone, the
    #    copy would be removed as the orphan of B's deleted topic.
    cluster.create_topic("ledger", 1, 1, via=n1)  # topic id 1 in B too
    n1.json("DELETE", "/v1/topics/ledger")
    _stop(n1)
    shutil.copytree(a_copy / "partitions" / "ledger-0", n1.partition_dir("ledger", 0))
    shutil.copytree(a_copy / "raft" / "groups" / "1024", n1.group_dir(1024))
    n1.start()
    cluster.wait_ready([n1])
    aside = n1.json("GET", "/v1/storage/set-aside")["set_aside"]
    assert sorted(e["original"] for e in aside) == ["partitions/ledger-0", "raft/groups/1024"]
    reason = f"written by cluster {a_id}, this is cluster {b_id}"
    for entry in aside:
        assert entry["reason"] == reason
        expected = a_partition if entry["original"].startswith("partitions") else a_group
        assert _files(Path(entry["path"])) == expected
    listed = _dmq("storage", "set-aside", "--url", n1.url)
    assert listed.stdout.count(reason) == 2, listed
    cluster.create_topic("ledger", 1, 1, via=n1)  # topic id 2 in B: starts empty
    assert fetch_all(n1, "ledger", 0) == []

    # 6. The explicit move: reset, then join B as a new broker.
    reset = _dmq("storage", "reset", "--data-dir", str(n2.data_dir), "--yes")
    assert reset.returncode == 0, reset.stderr
    assert [p.name for p in n2.data_dir.iterdir()] == [".lock"]
    cluster.use_join("n2", n1.url)
    n2.start()
    cluster.wait_ready([n2])
    assert _cluster_id(n2) == b_id and _brokers(n1) == ["n1", "n2"]
    assert meta_file.read(n2.data_dir) == meta_file.DataDirMeta(b_id, "n2")
    shown = _dmq("storage", "show", "--data-dir", str(n2.data_dir))
    assert shown.stdout == f"{n2.data_dir}: cluster {b_id}, broker n2\n", shown


def test_a_broker_whose_catalogue_names_another_cluster_stops_and_keeps_its_data(
    dmq_cluster: Any,
) -> None:
    """A voter whose own group 0 names another cluster than its `meta.properties` (a meta
    file copied from another broker's directory): refused, exit 1, with both ids (before
    it registers: `IdentityService.check_catalogue`); no partition directory nor
    `meta.properties` changed (its group-0 Raft journal
    may: Raft writes its term as it opens, before any catalogue can be read). With its
    own file back it serves its records."""
    cluster: DmqCluster = dmq_cluster(1)
    (n1,) = cluster.nodes.values()
    n1.start()
    cluster.wait_ready()
    cluster.create_topic("ledger", 1, 1, via=n1)
    assert produce(n1, "ledger", RECORDS) == [(0, 0), (0, 1), (0, 2)]
    own_id = _cluster_id(n1)
    _stop(n1)
    own_meta = (n1.data_dir / meta_file.META_FILE).read_bytes()
    other_id = "f" * 32
    meta_file.write(n1.data_dir, meta_file.DataDirMeta(other_id, "n1"))
    before = {k: v for k, v in _files(n1.data_dir).items() if not k.startswith("raft/")}

    refused = _dmq("serve", *n1.args)
    assert refused.returncode == 1, refused.stderr
    line = f"belongs to cluster {other_id}, the metadata group it reached is cluster {own_id}"
    assert line in refused.stderr, refused.stderr
    after = {k: v for k, v in _files(n1.data_dir).items() if not k.startswith("raft/")}
    before.pop(".lock"), after.pop(".lock")  # it holds the pid of the last broker
    assert after == before

    (n1.data_dir / meta_file.META_FILE).write_bytes(own_meta)
    n1.start()
    cluster.wait_ready()
    assert fetch_all(n1, "ledger", 0) == [(i, f"k{i}", f"v{i}") for i in range(3)]


def test_join_refuses_a_directory_with_data_and_no_identity(tmp_path: Path) -> None:
    """A directory from before cluster ids (records, no meta.properties) of a broker that
    never joined (no meta/joined_cluster.json) is refused by `--join`, before any broker
    is asked: its cluster is unknown. Nothing changes."""
    data_dir = tmp_path / "old"
    (data_dir / "partitions" / "ledger-0").mkdir(parents=True)
    (data_dir / "partitions" / "ledger-0" / "topic_id").write_text("1\n")
    (data_dir / "meta").mkdir()
    (data_dir / "meta" / "cluster_id").write_text("0123456789abcdef0123456789abcdef\n")
    before = _files(data_dir)
    result = _dmq(
        "serve", "--data-dir", str(data_dir), "--node-id", "n1", "--join", "http://127.0.0.1:9"
    )
    line = _one_error_line(result)
    assert f"data directory {data_dir} holds data" in line, line
    assert "start it once without --join" in line and "dmq storage reset" in line, line
    assert _files(data_dir) == before
