"""Proves on real brokers (3 `dmq serve` processes, links cut with iptables as jepsen/'s
partition nemesis cuts them) that a broker cut off from a partition's leader answers a
send promptly, well under the 10-s request timeout (dmq/README.md, "Errors under a
partition"; issue #24's bridge requirement):

- bridge: the leader's link to one follower cut, the third broker linked to both, so the
  leader stays and no other is elected. Sends through the cut-off follower are answered
  in under 2.5 s each (503 not_leader once it gave its leader up) and none is
  acknowledged; sends through the leader are; once healed the follower's are again;
- an isolated leader: sends through a follower are answered in under 2.5 s each, and one
  is acknowledged through the new leader the other two elect, within 10 s of the cut.
Before the change such a send waited the whole request timeout (10 s) or longer.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from jepsen.cluster import Cluster, http
from jepsen.final import wait_for_leaders
from jepsen.nemesis import Net
from jepsen.run import TOPIC, create_topic

PROMPT_S = 2.5  # an election timeout (0.8 s max) plus slack on 2 shared cores
REQUEST_TIMEOUT_S = 10.0


def send(cluster: Cluster, node: str, value: str) -> tuple[int, float]:
    """One acks=all send through `node`: (HTTP status, 0 for no answer; seconds)."""
    body = {"records": [{"value": value, "partition": 0}]}
    url = f"{cluster.every[node].url}/v1/topics/{TOPIC}/records?acks=all"
    started = time.monotonic()
    try:
        status = http(url, "POST", body, timeout_s=REQUEST_TIMEOUT_S + 5).status
    except OSError:
        status = 0
    return status, time.monotonic() - started


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_broker_cut_off_from_the_leader_answers_sends_promptly(tmp_path: Path) -> None:
    cluster = Cluster(tmp_path, 3, planted_bug=None, durable_trace=False)
    net = Net(cluster.ports)
    try:
        net.setup()
        cluster.start_all()
        create_topic(cluster, 1, 3)
        wait_for_leaders(cluster)
        # One leader-balancing pass (dmq/broker/cluster.py, every 5 s) first: it may hand
        # the partition's leadership over once, never again with 1 partition on 3 brokers.
        time.sleep(6.0)
        leader = cluster.local_leader(TOPIC, 0, list(cluster.brokers))
        assert leader in cluster.brokers
        follower, bridge = sorted(n for n in cluster.brokers if n != leader)
        assert send(cluster, follower, "before")[0] == 200

        # Bridge: only leader <-> follower cut; the bridge node keeps the leader's majority.
        net.cut(cluster.hosts[leader], cluster.hosts[follower])
        answers = [send(cluster, follower, f"cut-{k}") for k in range(8)]
        through_leader = [send(cluster, leader, f"leader-{k}")[0] for k in range(3)]
        print("bridge: through the follower", answers, "through the leader", through_leader)
        assert max(took for _, took in answers) < PROMPT_S, answers
        assert all(status != 200 for status, _ in answers[1:]), answers
        assert any(status == 503 for status, _ in answers), answers
        assert through_leader == [200, 200, 200], through_leader
        net.heal()
        healed_by = time.monotonic() + 10
        while send(cluster, follower, "healed")[0] != 200:
            assert time.monotonic() < healed_by, "no send through the follower after the heal"
            time.sleep(0.1)

        # An isolated leader: the two others elect one; the follower's sends go through it.
        leader = cluster.local_leader(TOPIC, 0, list(cluster.brokers))
        assert leader in cluster.brokers
        via = sorted(n for n in cluster.brokers if n != leader)[0]
        for other in cluster.brokers:
            if other != leader:
                net.cut(cluster.hosts[leader], cluster.hosts[other])
        cut_at = time.monotonic()
        tries: list[tuple[int, float]] = []
        while not tries or tries[-1][0] != 200:
            assert time.monotonic() - cut_at < REQUEST_TIMEOUT_S, f"nothing acknowledged: {tries}"
            tries.append(send(cluster, via, f"isolated-{len(tries)}"))
        print("isolated leader: through a follower", tries)
        assert max(took for _, took in tries) < PROMPT_S, tries
        assert tries[0][0] != 200, "the isolated leader cannot have committed the first"
    finally:
        net.close()
        cluster.close()
