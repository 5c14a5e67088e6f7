"""Proves, on real `dmq serve` processes, that the metadata group's voter set grows from 3
to 5 and shrinks back while the cluster serves (dmq/broker/operations.py, dmq/metadata/service.py):

- three voters start a cluster, two brokers join it with `dmq serve --join` as observers;
  `POST /v1/cluster/metadata-voters` (sent to an observer) makes all five voters, one
  Raft change at a time, visible in `GET /v1/cluster/operations` while it runs;
- kill -9 of the metadata leader in the 5-voter set: admin calls (create topic, alter
  config), consumer-group commits and acks=all produces go on with 4 of 5; the killed
  leader and a voter added by the change, both restarted, rejoin group 0 with the
  5-member configuration taken from their own journals;
- 5 -> 3 removing two voters, the current metadata leader among them: the removed ones
  delete their group-0 directory, write `metadata_left`, follow the catalogue as
  observers; one restarted stays an observer and serves reads;
- every acknowledged record is read back exactly once, in order, at its offset; the
  group's committed offset, read linearizably through any broker, never goes backwards
  and is never older than a commit acknowledged before the read;
- a change waiting for a broker that is down refuses another change (409) and is rolled
  back by asking for the recorded set;
- kill -9 of the metadata leader halfway through a change (n4 added, waiting for n5 that
  is down): the new leader finishes it once n5 is back, and the old one restarts with
  the 5-member group;
- a broker killed while promoting (group 0 open, not added yet: the change waits for
  n4, which is down) restarts promoting (`metadata_promoting`): it registers through
  the voters and is added once n4 is back; before that fix it reopened group 0 as a
  voter nobody answered, never registered, and the change waited for it for ever;
- decommissioning a voter first swaps it for a non-voting broker, then it leaves the
  catalogue; with no broker to take its place the request is refused (400, broker_id);
- a voter restarted with its first flags (peers n1-n3 only) reaches the voters that
  joined later (their addresses from its catalogue), and a joined broker restarts while
  the broker its `--join` names is down (from what its first join read).
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pytest
from cluster_harness import (
    RETRIABLE_STATUSES,
    DmqCluster,
    LoadThread,
    Node,
    Producer,
    Response,
    check_log_against_acks,
    fetch_all,
    operations,
    retry,
    wait_for,
)

from dmq.broker.operations_plan import REPLICA_LAG_ENTRIES_MAX

CHANGE_TIMEOUT_S = 60.0  # one voter change of several steps, on a loaded 2-core machine


@dataclass(eq=False)
class AnyLive:
    """Duck-types `Node.request` for the harness's Producer: each request goes to the next
    broker not marked down (a load that survives any one broker's crash)."""

    nodes: list[Node]
    down: set[str] = field(default_factory=set)
    _turn: itertools.count[int] = field(default_factory=itertools.count)

    @property
    def node_id(self) -> str:
        return "any"

    def pick(self) -> Node:
        up = [n for n in self.nodes if n.node_id not in self.down]
        return up[next(self._turn) % len(up)]

    def request(self, method: str, path: str, body: Any = None, *, timeout_s: float = 20.0) -> Any:
        return self.pick().request(method, path, body, timeout_s=timeout_s)


@dataclass(eq=False)
class AdminAndGroupLoad(LoadThread):
    """A thread: every round commits the group's next offset (one member of group `g`),
    reads it back linearizably through another broker, and about once a second makes an
    admin call (create a topic, or alter `mv`'s config). Keeps the monotonic times of
    each success, and every violation it sees."""

    via: AnyLive
    member: dict[str, Any]
    committed: int = 0  # highest offset whose commit was acknowledged
    commits_at: list[float] = field(default_factory=list)
    admin_at: list[float] = field(default_factory=list)
    reads: list[int] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)

    def _call(self, method: str, path: str, body: Any, ok: tuple[int, ...]) -> Response | None:
        try:
            resp = self.via.request(method, path, body, timeout_s=15.0)
        except OSError:
            return None
        if resp.status in ok:
            return resp
        if resp.status not in RETRIABLE_STATUSES:
            self.errors.append(f"{method} {path}: {resp!r}")
        return None

    def _run(self) -> None:
        next_admin = time.monotonic()
        for k in itertools.count(1):
            if self.stop.is_set():
                return
            body = {"member_id": self.member["member_id"],
                    "generation": self.member["generation"],
                    "offsets": [{"topic": "mv", "partition": 0, "offset": k}]}  # fmt: skip
            if self._call("POST", "/v1/groups/g/offsets", body, (200,)):
                self.committed = k
                self.commits_at.append(time.monotonic())
            floor = self.committed
            read = self._call("GET", "/v1/groups/g/offsets", None, (200,))
            if read is not None:
                [entry] = [o for o in read.json()["offsets"] if o["partition"] == 0]
                if entry["offset"] < floor or (self.reads and entry["offset"] < self.reads[-1]):
                    self.errors.append(f"offset read {entry['offset']} after commit {floor}")
                self.reads.append(entry["offset"])
            if time.monotonic() >= next_admin:
                next_admin = time.monotonic() + 1.0
                if k % 2:
                    done = self._call("POST", "/v1/topics",
                                      {"name": f"adm-{k}", "partitions": 1,
                                       "replication_factor": 1}, (201,))  # fmt: skip
                else:
                    done = self._call("PATCH", "/v1/topics/mv/config",
                                      {"config": {"retention_ms": 86_400_000 + k}}, (200,))  # fmt: skip
                if done:
                    self.admin_at.append(time.monotonic())
            time.sleep(0.05)


def voters_doc(node: Node) -> dict[str, Any]:
    return operations(node)["metadata_voters"]  # type: ignore[no-any-return]


def change_voters(node: Node, voters: list[str]) -> None:
    resp = retry(lambda: node.request("POST", "/v1/cluster/metadata-voters", {"voters": voters}),
                 timeout_s=30.0)  # fmt: skip
    assert resp.status == 202, resp


def wait_voters(node: Node, voters: list[str], seen: list[dict[str, Any]]) -> None:
    """Poll the operation until it is done with `voters`; `seen` gets each running doc."""

    def done() -> bool:
        doc = voters_doc(node)
        if doc["target"] is not None:
            seen.append(doc)
        return doc["target"] is None and doc["voters"] == voters

    wait_for(done, CHANGE_TIMEOUT_S, f"metadata voters {voters}", interval_s=0.1)


def group0_members(node: Node) -> list[str] | None:
    """Group 0's configuration as `node`'s own replica knows it (None: not open there)."""
    for r in node.json("GET", "/v1/internal/status")["replicas"]:
        if r["group_id"] == 0:
            return r["members"]  # type: ignore[no-any-return]
    return None


def group0_commit(node: Node) -> int:
    """Group 0's commit index as `node`'s replica knows it."""
    [entry] = [r for r in node.json("GET", "/v1/internal/status")["replicas"]
               if r["group_id"] == 0]  # fmt: skip
    return int(entry["commit_index"])


def start_with_join(cluster: DmqCluster, node_id: str, url: str) -> None:
    cluster.use_join(node_id, url)
    cluster[node_id].start()


def restart_configured(cluster: DmqCluster, node_id: str, voters: list[str]) -> Node:
    """kill -9, then start again with every peer listed and `--metadata-voters voters`
    (no --join): what group 0 opens with then comes from the broker's own files, not
    from a configuration that happens to match."""
    node = cluster[node_id]
    node.kill9()
    node.drop_flags("--join", "--peers", "--metadata-voters")
    node.args += ["--peers", cluster.peers_of(cluster.nodes), "--metadata-voters", ",".join(voters)]
    node.start()
    cluster.wait_ready([node])
    return node


def start_three_voters_two_joiners(dmq_cluster: Callable[..., DmqCluster], n: int) -> DmqCluster:
    cluster = dmq_cluster(n, metadata_voters=["n1", "n2", "n3"])
    first = ["n1", "n2", "n3"]
    cluster.limit_peers(first, first)
    for node_id in first:
        cluster[node_id].start()
    cluster.wait_ready([cluster[i] for i in first])
    for node_id in list(cluster.nodes)[3:]:
        start_with_join(cluster, node_id, cluster["n1"].url)
    cluster.wait_ready()
    return cluster


def shrink_removing_the_leader(cluster: DmqCluster, seen: list[dict[str, Any]]) -> Node:
    """5 -> 3 voters, the metadata leader among the two removed; checks they became
    observers; returns one of them restarted (configured as a voter, still an observer)."""
    everyone = sorted(cluster.nodes)
    leader = cluster.metadata_leader()
    stay = sorted(b for b in everyone if b != leader)[:3]
    removed = sorted(set(everyone) - set(stay))
    assert leader in removed
    print(f"5 -> 3: {stay}, removing {removed} (the leader is {leader})")
    started = time.monotonic()
    change_voters(cluster[stay[0]], stay)
    wait_voters(cluster[stay[0]], stay, seen)
    print(f"5 -> 3 under load in {time.monotonic() - started:.1f} s")
    for node_id in removed:
        node = cluster[node_id]
        wait_for(lambda n=node: not n.group_dir(0).exists(), 20.0, f"{node_id} demoted")
        assert (node.data_dir / "meta" / "metadata_left").exists()
        assert group0_members(node) is None
    assert group0_members(cluster[stay[0]]) == stay
    assert cluster["n1"].json("GET", "/v1/cluster")["metadata_voters"] == stay
    # A removed voter restarted stays an observer (configured as a voter even: the
    # marker decides) and serves reads.
    observer = restart_configured(cluster, removed[0], everyone)
    assert group0_members(observer) is None and not observer.group_dir(0).exists()
    offsets = retry(lambda: observer.request("GET", "/v1/groups/g/offsets"), 20.0)
    assert offsets.status == 200 and offsets.json()["offsets"], offsets
    return observer


@pytest.mark.slow
def test_voters_grow_3_to_5_survive_a_leader_crash_and_shrink_to_3(
    dmq_cluster: Callable[..., DmqCluster],
) -> None:
    cluster = start_three_voters_two_joiners(dmq_cluster, 5)
    everyone = sorted(cluster.nodes)
    assert cluster["n4"].json("GET", "/v1/cluster")["metadata_voters"] == ["n1", "n2", "n3"]
    assert group0_members(cluster["n4"]) is None  # an observer
    cluster.create_topic("mv", partitions=2, replication_factor=3)
    via = AnyLive(list(cluster.nodes.values()))
    member = retry(
        lambda: cluster["n5"].request(
            "POST", "/v1/groups/g/members", {"topics": ["mv"], "session_timeout_ms": 120_000}
        ),
        20,
    )
    assert member.status == 201, member
    producer = Producer(via, "mv", "p", partitions=(0, 1)).start()  # type: ignore[arg-type]
    load = AdminAndGroupLoad(via, member.json()).start()
    seen: list[dict[str, Any]] = []
    try:
        wait_for(lambda: len(producer.acked) >= 10 and load.commits_at, 30.0, "load running")
        started = time.monotonic()
        change_voters(cluster["n4"], everyone)
        wait_voters(cluster["n2"], everyone, seen)
        print(f"3 -> 5 under load in {time.monotonic() - started:.1f} s")
        assert seen and all(d["target"] == everyone for d in seen), seen[:3]
        progress = [d["progress"] for d in seen]  # as polled: it only moves forward
        assert progress == sorted(progress) and progress[0] < 1.0, progress
        for node_id in ("n4", "n5"):
            assert wait_for(lambda n=node_id: group0_members(cluster[n]) == everyone, 20.0,
                            f"{node_id} a voter")  # fmt: skip

        print(f"3 -> 5: {len(seen)} running views, e.g. {seen[0]}")
        leader = cluster.metadata_leader()
        print(f"killing the metadata leader {leader}")
        via.down.add(leader)
        cluster.kill9(leader)
        killed_at = time.monotonic()
        wait_for(lambda: (any(t > killed_at for t in load.commits_at)
                          and any(t > killed_at for t in load.admin_at)
                          and any(a.sent > killed_at for a in producer.acked)),
                 30.0, "commits, admin calls and produces with 4 of 5 voters")  # fmt: skip
        # The killed leader and a voter the change added restart configured with the
        # first three voters only: their own journals give them the 5-member group.
        restarted = [leader, *(["n5"] if leader != "n5" else ["n4"])]
        for node_id in restarted:
            restart_configured(cluster, node_id, ["n1", "n2", "n3"])
            via.down.discard(node_id)
            assert group0_members(cluster[node_id]) == everyone, node_id

        observer = shrink_removing_the_leader(cluster, seen)
        acked = len(producer.acked)
        wait_for(lambda: len(producer.acked) >= acked + 10, 30.0, "acks after the shrink")
    finally:
        producer.finish()
        load.finish()
    assert not producer.errors, producer.errors
    assert not load.errors, load.errors[:5]
    assert load.reads and load.reads == sorted(load.reads)
    for p in (0, 1):
        check_log_against_acks(fetch_all(observer, "mv", p), [producer], partition=p)


def test_decommissioning_a_voter_swaps_it_out_first(
    dmq_cluster: Callable[..., DmqCluster],
) -> None:
    cluster = start_three_voters_two_joiners(dmq_cluster, 4)
    cluster.create_topic("d", partitions=1, replication_factor=3)
    # A change to a broker that is down waits (it cannot open group 0); another change
    # meanwhile is a conflict; asking for the recorded set rolls it back.
    cluster.kill9("n4")
    change_voters(cluster["n1"], ["n1", "n2", "n3", "n4"])
    running = wait_for(lambda: (doc := voters_doc(cluster["n2"]))["target"] and doc, 10.0,
                       "n2's catalogue has the change")  # fmt: skip
    assert running["target"] == ["n1", "n2", "n3", "n4"] and running["progress"] == 0.0, running
    resp = cluster["n2"].request("POST", "/v1/cluster/metadata-voters",
                                 {"voters": ["n1", "n2", "n4"]})  # fmt: skip
    assert resp.status == 409 and resp.json()["error"]["code"] == "operation_conflict", resp
    assert resp.json()["error"]["details"]["field"] == "voters", resp
    change_voters(cluster["n3"], ["n1", "n2", "n3"])
    wait_voters(cluster["n1"], ["n1", "n2", "n3"], [])
    assert group0_members(cluster[cluster.metadata_leader()]) == ["n1", "n2", "n3"]
    cluster["n4"].start()
    cluster.wait_ready([cluster["n4"]])
    assert group0_members(cluster["n4"]) is None
    resp = cluster["n4"].request("POST", "/v1/cluster/brokers/n2/decommission")
    assert resp.status == 202, resp
    wait_voters(cluster["n1"], ["n1", "n3", "n4"], [])
    wait_for(lambda: "n2" not in [b["node_id"] for b in
                                  cluster["n1"].json("GET", "/v1/cluster")["brokers"]],
             CHANGE_TIMEOUT_S, "n2 unregistered")  # fmt: skip
    wait_for(lambda: not cluster["n2"].group_dir(0).exists(), 20.0, "n2 left group 0")
    assert group0_members(cluster["n4"]) == ["n1", "n3", "n4"]
    # No non-voting broker is left to take a voter's place: refused, naming the broker.
    resp = cluster["n3"].request("POST", "/v1/cluster/brokers/n1/decommission")
    assert resp.status == 400, resp
    assert resp.json()["error"]["details"]["field"] == "broker_id", resp
    assert "n1" in resp.json()["error"]["message"]
    change_voters(cluster["n1"], ["n1", "n3", "n4"])  # the current set: nothing to do
    assert voters_doc(cluster["n1"])["target"] is None
    resp = cluster["n1"].request("POST", "/v1/cluster/metadata-voters", {"voters": ["n1", "n9"]})
    assert resp.status == 400 and resp.json()["error"]["details"]["field"] == "voters", resp


def test_a_new_metadata_leader_resumes_a_voter_change(
    dmq_cluster: Callable[..., DmqCluster],
) -> None:
    cluster = start_three_voters_two_joiners(dmq_cluster, 5)
    everyone = sorted(cluster.nodes)
    cluster.kill9("n5")  # the change can add n4, then waits for n5
    change_voters(cluster["n1"], everyone)
    wait_for(lambda: voters_doc(cluster["n2"])["voters"] == ["n1", "n2", "n3", "n4"], 30.0,
             "n4 added and recorded")  # fmt: skip
    leader = cluster.metadata_leader()
    waiting = wait_for(lambda: (doc := voters_doc(cluster[leader]))["step"].startswith(
        "waiting for n5") and doc, 10.0, "the leader's driver waiting for n5")  # fmt: skip
    assert waiting["target"] == everyone, waiting
    assert 0.0 < waiting["progress"] < 1.0, waiting
    cluster.kill9(leader)  # 3 of the 4 members go on; a new leader takes the change over
    cluster["n5"].start()
    cluster.wait_ready([cluster["n5"]])
    survivor = cluster.any_live(exclude=[leader])
    wait_voters(survivor, everyone, [])
    assert group0_members(cluster["n5"]) == everyone
    node = restart_configured(cluster, leader, ["n1", "n2", "n3"])
    assert group0_members(node) == everyone


def test_a_broker_killed_while_promoting_is_added_after_its_restart(
    dmq_cluster: Callable[..., DmqCluster],
) -> None:
    cluster = start_three_voters_two_joiners(dmq_cluster, 5)
    everyone = sorted(cluster.nodes)
    cluster.kill9("n4")  # the change adds n4 first: it waits, n5 promotes meanwhile
    change_voters(cluster["n1"], everyone)
    n5 = cluster["n5"]
    wait_for(lambda: group0_members(n5) is not None, 30.0, "n5 opened group 0")
    assert (n5.data_dir / "meta" / "metadata_promoting").exists()
    leader = cluster.metadata_leader()
    assert "n5" not in (group0_members(cluster[leader]) or []), "added already"
    n5.kill9()
    n5.start()
    cluster.wait_ready([n5])  # registered through the voters: before the fix, never
    assert voters_doc(n5)["target"] == everyone  # the observed catalogue, not an empty one
    cluster["n4"].start()
    wait_voters(cluster["n1"], everyone, [])
    # n5 learns n4's addition from the log it replicates: a moment after the record.
    wait_for(lambda: group0_members(n5) == everyone, 20.0, "n5 sees every member")
    wait_for(lambda: not (n5.data_dir / "meta" / "metadata_promoting").exists(), 20.0,
             "n5's promotion finished")  # fmt: skip


def test_a_voter_restarted_with_only_the_first_peers_reaches_the_joined_voters(
    dmq_cluster: Callable[..., DmqCluster],
) -> None:
    """n1 started knowing only n1-n3 as Raft peers; n4 and n5 joined later. After the
    voters become n1, n4, n5, n1 restarts with its original flags: group 0 (from its
    journal) has members it has no address for in its configuration. It must take them
    from its catalogue before it can commit anything (registration included). And a
    joined broker restarts although the broker its `--join` names is down."""
    cluster = start_three_voters_two_joiners(dmq_cluster, 5)
    wanted = ["n1", "n4", "n5"]
    change_voters(cluster["n2"], wanted)
    wait_voters(cluster["n1"], wanted, [])
    cluster.kill9("n1")
    # n4 restarts with `--join <n1's URL>` while n1 is down: it starts from what its
    # first join read (meta/joined_cluster.json), and n4 + n5 are a majority.
    cluster.kill9("n4")
    cluster["n4"].start()
    cluster.wait_ready([cluster["n4"]])
    assert "starting from what the last join read" in cluster["n4"].log_tail()
    cluster["n1"].start()  # --peers n1..n3, --metadata-voters n1,n2,n3: as first started
    cluster.wait_ready([cluster["n1"]])
    assert group0_members(cluster["n1"]) == wanted
    resp = retry(lambda: cluster["n1"].request("POST", "/v1/topics", {"name": "after"}), 20.0)
    assert resp.status == 201, resp


def test_a_promoting_broker_restarted_reaches_a_leader_its_flags_do_not_name(
    dmq_cluster: Callable[..., DmqCluster],
) -> None:
    """jepsen/ campaign seed 1128, run 36 (seed 1531591445): a broker killed while
    promoting reopens group 0 from its directory. Its journal holds no membership entry
    (nobody sends a non-member entries), so before the fix it reopened with its
    configured `metadata_voters` plus itself, here n1-n3 + n2. The voters had moved on
    to n4 and n5, n4 leading: n2's replica dropped every message of that leader, a
    broker outside its set, never caught up, and the swap of n5 for n1 and n2 waited
    for it for ever ("catching up n2"; in jepsen the swap of a decommissioned voter never
    removed it). It reopens with the members it first opened with, which
    `metadata_promoting` records."""
    cluster = start_three_voters_two_joiners(dmq_cluster, 5)
    first = ["n1", "n2", "n3"]
    change_voters(cluster["n1"], ["n4", "n5"])  # the leader leaves: it hands over to n4
    wait_voters(cluster["n1"], ["n4", "n5"], [])
    assert cluster.metadata_leader() in ("n4", "n5")  # neither named by n2's flags
    for node_id in ("n1", "n2"):
        wait_for(lambda n=node_id: not cluster[n].group_dir(0).exists(), 20.0,
                 f"{node_id} demoted")  # fmt: skip
    # As in jepsen, a log longer than the in-sync slack (REPLICA_LAG_ENTRIES_MAX): the
    # test then does not rest on `caught_up` refusing a member that acknowledged nothing
    # (before that fix, in a shorter log, a member added less than a second ago counted
    # as in sync, and the change ended without waiting for n2).
    cluster.create_topic("pad", partitions=1, replication_factor=1)
    for k in itertools.count():
        if group0_commit(cluster["n4"]) > REPLICA_LAG_ENTRIES_MAX + 16:
            break
        resp = retry(lambda k=k: cluster["n4"].request(
            "PATCH", "/v1/topics/pad/config", {"config": {"retention_ms": 86_400_000 + k}}),
            10.0)  # fmt: skip
        assert resp.status == 200, resp
    # n1, first in the target, stopped: the change waits for it, n2 promotes meanwhile.
    cluster["n1"].sigstop()
    wanted = ["n1", "n2", "n4"]
    change_voters(cluster["n4"], wanted)
    n2 = cluster["n2"]
    wait_for(lambda: group0_members(n2) is not None, 30.0, "n2 opened group 0")
    assert (n2.data_dir / "meta" / "metadata_promoting").exists()
    assert "n2" not in (group0_members(cluster["n4"]) or []), "added already"
    n2.kill9()
    cluster["n1"].sigcont()  # added; the change then waits for n2
    wait_for(lambda: "n1" in voters_doc(cluster["n4"])["voters"], 30.0, "n1 added")
    # As jepsen restarts it: every broker a peer, the voters as first configured.
    restart_configured(cluster, "n2", first)
    assert "n4" in (group0_members(n2) or []), group0_members(n2)
    wait_voters(cluster["n4"], wanted, [])  # before the fix: "catching up n2" for ever
    wait_for(lambda: group0_members(n2) == wanted, 20.0, "n2 sees every member")
    wait_for(lambda: not (n2.data_dir / "meta" / "metadata_promoting").exists(), 20.0,
             "n2's promotion finished")  # fmt: skip
