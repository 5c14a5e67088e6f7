"""An observer whose catalogue names only voters that have all left since finds the
current voters (dmq/broker/routing.py `voter_http_addrs`, dmq/broker/cluster.py
`metadata_state_after`), on real `dmq serve` processes.

Found by the jepsen campaign (seed 1026397559): three voters were decommissioned at once;
two observers knew only those three, long-polled them (or each other's equally old
catalogue) for ever, never saw the new voters nor a broker that registered meanwhile,
and refused that broker's Raft connections as "not a broker of this cluster".

Here with one voter: n1 the only voter, n3 an observer paused (SIGSTOP) while the voters
become [n2]; n1, now an observer itself, is killed; n3 resumes knowing only n1. It must
reach n2 (every registered broker is asked after the voters; a broker that is not a
voter refuses at once) and follow the catalogue again: the new voters, a topic created
after it resumed.

And restarted observers, whose catalogue is empty at start (jepsen campaign seed 1129, run
5, seed 1873972910): n1 and n2, demoted voters, restarted by a power fault while the
voters were n4-n6 and n3 (a configured voter) had been decommissioned. They asked only
their configured voters n1-n3 for the catalogue, never registered, never opened their
partition replicas, and jepsen-0's group (members n1, n2, n4, n5) had no leader for the
rest of the run, so n1's leave never finished. A restarted broker also asks its
`--peers`, where a current voter answers.
"""

from __future__ import annotations

from collections.abc import Callable

from cluster_harness import DmqCluster, retry, wait_for
from test_cluster_metadata_voters import change_voters, wait_voters


def test_an_observer_that_knows_only_departed_voters_finds_the_new_ones(
    dmq_cluster: Callable[..., DmqCluster],
) -> None:
    cluster = dmq_cluster(3, metadata_voters=["n1"]).start_all()
    n1, n2, n3 = cluster["n1"], cluster["n2"], cluster["n3"]
    assert n3.json("GET", "/v1/cluster")["metadata_voters"] == ["n1"]
    n3.sigstop()
    change_voters(n2, ["n2"])
    wait_voters(n2, ["n2"], [])
    wait_for(lambda: not n1.group_dir(0).exists(), 20.0, "n1 demoted")
    n1.kill9()
    n3.sigcont()
    # One replica: n3 may not count as live yet (a full run's load), and n1 is gone.
    topic = {"name": "after", "replication_factor": 1}
    created = retry(lambda: n2.request("POST", "/v1/topics", topic), 20.0)
    assert created.status == 201, created
    version = n2.json("GET", "/v1/cluster")["metadata_version"]

    def n3_caught_up() -> bool:
        doc = n3.json("GET", "/v1/cluster")
        return doc["metadata_voters"] == ["n2"] and doc["metadata_version"] >= version

    wait_for(n3_caught_up, 30.0, "n3 following the catalogue of the new voter")
    topics = [t["name"] for t in n3.json("GET", "/v1/topics")["topics"]]
    assert "after" in topics, topics


def test_restarted_observers_whose_configured_voters_all_left_register_through_peers(
    dmq_cluster: Callable[..., DmqCluster],
) -> None:
    cluster = dmq_cluster(3, metadata_voters=["n1"]).start_all()
    n1, n2, n3 = cluster["n1"], cluster["n2"], cluster["n3"]
    cluster.create_topic("t", partitions=1, replication_factor=3)
    change_voters(n2, ["n2"])
    wait_voters(n2, ["n2"], [])
    wait_for(lambda: not n1.group_dir(0).exists(), 20.0, "n1 demoted")
    # Both restart with their first flags (--metadata-voters n1, --peers n1-n3) and an
    # empty catalogue: n1 has no other configured voter, n3 only n1, an observer now.
    n1.kill9()
    n3.kill9()
    n1.start()
    n3.start()
    cluster.wait_ready([n1, n3], timeout_s=30.0)  # before the fix: never registered
    assert n3.json("GET", "/v1/cluster")["metadata_voters"] == ["n2"]
    # t's replicas opened again on n1 and n3 (the broker is ready once they have a leader).
    for node in (n1, n3):
        groups = [r for r in node.json("GET", "/v1/internal/status")["replicas"] if r["topic"]]
        assert [(r["topic"], r["partition"]) for r in groups] == [("t", 0)], groups
    body = {"records": [{"value": "after"}]}
    resp = retry(lambda: n3.request("POST", "/v1/topics/t/records?acks=all", body), 20.0)
    assert resp.status == 200, resp
