"""Proves the membership nemesis end to end on real `dmq serve` processes:

- a short run (3 metadata voters n1-n3 + two more brokers, ~35 s of partitions, kill -9,
  joins, leaves and metadata voter changes) of `python -m jepsen.run` is valid (log and
  group checkers), and at least one broker really joined (`dmq serve --join`,
  registered, ready), one really left (decommissioned, gone from the catalogue, stopped,
  its data directory deleted) and one voter change really completed (202, then no
  change running, with the voters it asked for); the final phase checked the voters
  (catalogue = group 0's members on the metadata leader, every broker agreeing), 3 or
  5 of them; every join, leave and voter change is in the history
  with its start and its end, and in results.json;
- the first start of a joining broker uses `--join` and its restarts name the current
  brokers and the voters (a `--join` whose broker is down at restart would not start),
  on the next loopback address, never a reused id, never naming a departed broker.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from test_jepsen_live import run_harness

from jepsen.cluster import Cluster


@pytest.mark.slow
@pytest.mark.timeout(480)
def test_joins_leaves_and_voter_changes_during_faults_keep_the_run_valid(
    tmp_path: Path,
) -> None:
    code, doc, out, _ = run_harness(
        tmp_path,
        *("--nodes", "5", "--nemesis", "join,leave,voters,partition,kill"),
        *("--time-limit-s", "35", "--seed", "14", "--fault-interval-s", "4", "6"),
        timeout_s=460,
    )
    assert code == 0, out
    assert doc["valid"] == "valid" and doc["anomalies"] == {}
    assert doc["checkers"]["log"]["stats"]["sends_ok"] > 200
    outcomes = {(m["kind"], m["outcome"]) for m in doc["membership"]}
    assert ("join", "joined") in outcomes and ("leave", "left") in outcomes, doc["membership"]
    changes = [m for m in doc["membership"] if (m["kind"], m["outcome"]) == ("voters", "changed")]
    assert changes, doc["membership"]
    assert all(m["status"] == 202 for m in changes)
    assert any(m["final"] == sorted(m["targets"]) for m in changes), changes
    left = [m["node"] for m in doc["membership"] if m["outcome"] == "left"]
    for node in left:
        assert not (tmp_path / node).exists(), f"{node} left but its data directory stays"
    events = [json.loads(line) for line in (tmp_path / "history.jsonl").read_text().splitlines()]
    nemesis = [e for e in events if e["process"] == "nemesis"]
    checked = [e["value"] for e in nemesis if e["f"] == "final-voters"]
    assert len(checked) == 1 and len(checked[0]) in (3, 5), checked  # a voter leave swaps
    for kind in ("join", "leave", "voters"):
        starts = [e for e in nemesis if e["f"] == f"start-{kind}"]
        stops = [e for e in nemesis if e["f"] == f"stop-{kind}"]
        assert len(starts) == len(stops) >= 1, kind
        assert all("outcome" in e["value"] for e in stops)
    joined = [m["node"] for m in doc["membership"] if m["outcome"] == "joined"]
    served = {e["node"] for e in events if e["type"] == "ok" and e["f"] in ("send", "poll")}
    assert set(joined) & served, "clients never talked to a joined broker"


def test_a_joining_broker_joins_once_then_restarts_with_its_peers(tmp_path: Path) -> None:
    cluster = Cluster(tmp_path, 3, planted_bug=None, durable_trace=False, metadata_voters=["n1"])
    assert cluster.brokers["n2"].args[-2:] == ["--metadata-voters", "n1"]
    joiner = cluster.add_broker(cluster.brokers["n1"].url, ["n1"])
    assert (joiner.node_id, joiner.host) == ("n4", "127.0.0.14")
    assert joiner.first_args is not None
    assert joiner.first_args[-2:] == ["--join", cluster.brokers["n1"].url]
    assert "--peers" not in joiner.first_args
    peers = joiner.args[joiner.args.index("--peers") + 1].split(",")
    assert peers == [f"n{k}=127.0.0.1{k}:{cluster.raft_port}" for k in range(1, 5)]
    assert joiner.args[-2:] == ["--metadata-voters", "n1"]
    assert list(cluster.brokers) == ["n1", "n2", "n3", "n4"]
    cluster.retire("n2")  # never started: nothing to stop
    assert list(cluster.brokers) == ["n1", "n3", "n4"] and "n2" in cluster.every
    later = cluster.add_broker(cluster.brokers["n1"].url, ["n1"])
    assert later.node_id == "n5"  # n2's id and address are not reused, nor named a peer
    peers = later.args[later.args.index("--peers") + 1].split(",")
    assert [p.split("=")[0] for p in peers] == ["n1", "n3", "n4", "n5"]
