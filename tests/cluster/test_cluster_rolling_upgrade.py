"""Proves that a cluster of the previous release (0.1.0, commit RELEASE_FROM, checked out of
git history into a temporary worktree and run with this interpreter) is upgraded to this
tree one broker at a time, on the same data directories, while a producer with acks=all
goes on, and that one broker can be rolled back to 0.1.0 afterwards:

- every restarted broker, on either release, is ready (/readyz 200) within READY_S_MAX;
- across the whole run the cluster never goes more than ACK_GAP_S_MAX without an
  acknowledgement;
- every acknowledged record is read back exactly once at its acknowledged offset, through
  an upgraded broker and through the rolled-back one (offsets dense, no duplicate); the
  rolled-back broker starts on files this tree wrote (`raft-producers` with its `format`);
- GET /v1/cluster on an upgraded broker names each broker's release: this tree's for
  itself, 0.1.0 for a broker still on it (README.md, "Releases and upgrading");
- finalize (feature level 1) is refused (409) while the rolled-back broker runs 0.1.0,
  naming it and its release; once it is upgraded again, finalize succeeds on every
  broker, and then what level 1 gates holds: an internal call signed in the plain form
  is refused (401, reason `plain`) while a bound one is served, and a 0.1.0 broker
  started on its old data directory is refused as a Raft peer (named in the log) while
  the others go on acknowledging.

Skipped only when git history does not hold RELEASE_FROM (a shallow clone); CI's clone
(.ci/run) has full history.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from cluster_harness import (
    ROOT,
    DmqCluster,
    Node,
    Producer,
    check_log_against_acks,
    fetch_all,
    produce,
    wait_caught_up,
    wait_for,
)

import dmq
from dmq.internal_auth import signed_headers

RELEASE_FROM = "425063b"  # release 0.1.0
RELEASE_FROM_VERSION = "0.1.0"
READY_S_MAX = 60.0  # the bound for a restarted broker to be ready
ACK_GAP_S_MAX = 15.0  # the bound on the time without any acknowledgement
ACKS_PER_STEP = 20  # new acknowledgements between two restarts: the cluster serves again
TOPIC = "orders"


def _git(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["git", "-C", str(ROOT), *args], capture_output=True, text=True, timeout=60, check=False
    )


@pytest.fixture
def old_release() -> Iterator[Path]:
    """A detached worktree of RELEASE_FROM, removed (and pruned) whatever happens."""
    if _git("cat-file", "-e", f"{RELEASE_FROM}^{{commit}}").returncode != 0:
        pytest.skip(f"git history does not hold {RELEASE_FROM} (a shallow clone?)")
    tree = Path(tempfile.mkdtemp(prefix="dmq-0.1.0-")) / "tree"
    added = _git("worktree", "add", "--detach", str(tree), RELEASE_FROM)
    assert added.returncode == 0, added.stderr
    try:
        yield tree
    finally:
        _git("worktree", "remove", "--force", str(tree))
        _git("worktree", "prune")
        shutil.rmtree(tree.parent, ignore_errors=True)


def run_on(node: Node, tree: Path) -> None:
    """The node's next start runs the dmq of `tree`."""
    node.root = tree
    node.env = {**node.env, "PYTHONPATH": str(tree)}


def acks(producers: list[Producer]) -> int:
    return sum(len(p.acked) for p in producers)


def replace(
    cluster: DmqCluster,
    node: Node,
    tree: Path,
    producers: list[Producer],
    stopped: Callable[[], None] = lambda: None,
) -> float:
    """Stop `node` (SIGTERM), call `stopped`, start it from `tree` on its data directory,
    wait until it is ready and the cluster acknowledged ACKS_PER_STEP more records;
    seconds to ready."""
    wait_caught_up(cluster, TOPIC, 0, timeout_s=30.0)  # stopping a laggard costs the majority
    assert node.proc is not None
    node.proc.terminate()
    node.proc.wait(30)
    stopped()
    run_on(node, tree)
    started = time.monotonic()
    node.start()
    cluster.wait_ready([node], timeout_s=READY_S_MAX)
    ready_s = time.monotonic() - started
    before = acks(producers)
    wait_for(lambda: acks(producers) >= before + ACKS_PER_STEP, 30.0, "acks after a restart")
    return ready_s


def release_seen(via: Node, node_id: str) -> Callable[[], str | None]:
    def probe() -> str | None:
        brokers = via.json("GET", "/v1/cluster")["brokers"]
        return next(b["version"] for b in brokers if b["node_id"] == node_id)

    return probe


def ack_gap_s_max(producers: list[Producer], started: float, ended: float) -> float:
    times = sorted([started, *(a.done for p in producers for a in p.acked), ended])
    return max(b - a for a, b in zip(times, times[1:], strict=False))


@pytest.mark.slow
def test_rolling_upgrade_from_0_1_0_under_load_and_rollback(
    dmq_cluster: Callable[..., DmqCluster], old_release: Path
) -> None:
    cluster = dmq_cluster(3, secret=os.urandom(32))
    for node in cluster.nodes.values():
        run_on(node, old_release)
    cluster.start_all(timeout_s=READY_S_MAX)
    n1, n2, n3 = (cluster[i] for i in ("n1", "n2", "n3"))
    assert "X-Dmq-Version" not in n1.request("GET", "/healthz").headers  # really 0.1.0
    cluster.create_topic(TOPIC, partitions=1, replication_factor=3)
    producers = [Producer(node=n, topic=TOPIC, name=f"p{n.node_id}").start() for n in (n1, n2, n3)]
    started = time.monotonic()
    try:
        wait_for(lambda: acks(producers) >= ACKS_PER_STEP, 30.0, "acks on 0.1.0")
        ready_s = {"n1": replace(cluster, n1, ROOT, producers)}
        # A mixed cluster: the upgraded broker names both releases.
        assert wait_for(release_seen(n1, "n2"), 15.0, "n2's release") == RELEASE_FROM_VERSION
        assert release_seen(n1, "n1")() == dmq.__version__
        ready_s["n2"] = replace(cluster, n2, ROOT, producers)
        ready_s["n3"] = replace(cluster, n3, ROOT, producers)

        # Roll one broker back to 0.1.0: it reads what 0.2.0 wrote and serves again.
        def written_by_this_tree() -> None:
            producer_state = n3.partition_dir(TOPIC, 0) / "raft-producers"
            assert b'"format": 1' in producer_state.read_bytes()  # a key 0.1.0 never wrote

        ready_s["n3 back"] = replace(cluster, n3, old_release, producers, written_by_this_tree)
        wait_for(lambda: release_seen(n1, "n3")() == RELEASE_FROM_VERSION, 15.0, "n3 is 0.1.0")
    finally:
        for producer in producers:
            producer.finish()
    ended = time.monotonic()
    print(f"ready after restart (s): {ready_s}; acknowledged: {acks(producers)}")
    assert all(s <= READY_S_MAX for s in ready_s.values()), ready_s
    assert not [e for p in producers for e in p.errors], [p.errors for p in producers]
    gap_s = ack_gap_s_max(producers, started, ended)
    print(f"longest time without an acknowledgement: {gap_s:.1f} s")
    assert gap_s <= ACK_GAP_S_MAX
    wait_caught_up(cluster, TOPIC, 0, timeout_s=30.0)
    for via in (n1, n3):  # this tree, and 0.1.0 rolled back
        check_log_against_acks(fetch_all(via, TOPIC, 0), producers)
    finalize_refused_then_done(cluster, old_release)


def restart_on(node: Node, tree: Path) -> None:
    assert node.proc is not None
    node.proc.terminate()
    node.proc.wait(30)
    run_on(node, tree)
    node.start()


def finalize_refused_then_done(cluster: DmqCluster, old_release: Path) -> None:
    n1, n2, n3 = (cluster[i] for i in ("n1", "n2", "n3"))
    refused = n1.request("POST", "/v1/cluster/features/finalize", {})
    assert refused.status == 409, refused
    error = refused.json()["error"]
    assert error["code"] == "feature_level_unsupported"
    assert set(error["details"]["laggards"]) == {"n3"}
    assert RELEASE_FROM_VERSION in error["details"]["laggards"]["n3"]
    assert n1.json("GET", "/v1/cluster/features")["finalized_level"] == 0

    restart_on(n3, ROOT)  # upgraded again: now every broker supports level 1
    cluster.wait_ready([n3], timeout_s=READY_S_MAX)
    assert n2.json("POST", "/v1/cluster/features/finalize", {})["finalized_level"] == 1
    for node in (n1, n2, n3):
        wait_for(
            lambda node=node: node.json("GET", "/v1/cluster/features")["finalized_level"] == 1,
            15.0,
            f"{node.node_id} at level 1",
        )
    # Level 1's gate: the plain signature (0.1.0's only form) is refused, the bound one not.
    plain = n1.request("GET", "/v1/internal/status")
    assert plain.status == 401 and plain.json()["error"]["details"]["reason"] == "plain", plain
    assert n1.secret is not None
    headers = signed_headers(n1.secret, "GET", "/v1/internal/status")
    bound = urllib.request.Request(n1.url + "/v1/internal/status", headers=headers)
    with urllib.request.urlopen(bound, timeout=20) as resp:  # noqa: S310 - loopback http
        assert resp.status == 200

    # A 0.1.0 broker after finalize: refused as a Raft peer, named; the others serve on.
    restart_on(n3, old_release)
    wait_for(
        lambda: "refusing peer n3" in n1.log_tail() + n2.log_tail(),
        30.0,
        "n3 (0.1.0) refused as a peer",
    )
    assert len(produce(n1, TOPIC, [{"value": "after finalize"}], acks="all", timeout_s=30.0)) == 1
