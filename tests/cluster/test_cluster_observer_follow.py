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
