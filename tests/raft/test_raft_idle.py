"""Proves, with three real `python -m raft.demo` processes hosting 200 groups each and
default settings, that an idle cluster goes quiet (raft/quiesce.py):

- every group quiesces on every node (its leader and both followers) within a few seconds
  of being led;
- then no group holds a new election (every term is unchanged over the window), no group
  is ticked and no group frame is sent (a small allowance for stragglers): only node
  heartbeats, at most one per peer per heartbeat_interval_s;
- each node uses under 15% of one core: a loose backstop against a CPU regression
  (measured here: about 1% per node at 200 groups; 2-4% at 1,000 groups with
  `python -m bench.raft_bench --idle`, the issue's target being < 10%). Before quiesced
  groups, heartbeats and ticks at their cadence cost 9-17% at 200 groups.
"""

from __future__ import annotations

import time
from pathlib import Path

from raft_harness import RaftCluster

from bench.cpu import process_cpu_s
from raft.config import RaftConfig

GROUPS = 200
IDLE_S = 4.0


def test_two_hundred_idle_groups_quiesce_and_send_only_node_heartbeats(tmp_path: Path) -> None:
    config = RaftConfig()
    with RaftCluster(tmp_path, groups=GROUPS, extra_args=["--no-values"]) as cluster:
        nodes = list(cluster.nodes.values())
        deadline = time.monotonic() + 30
        while True:
            views = [n.request("states")["groups"] for n in nodes]
            led = all(
                len({view[g]["leader_id"] for view in views} - {None}) == 1
                and sum(view[g]["is_leader"] for view in views) == 1
                and all(view[g]["leader_id"] for view in views)
                for g in views[0]
            )
            if led:
                break
            assert time.monotonic() < deadline, "not every group elected a leader"
            time.sleep(0.2)
        deadline = time.monotonic() + 15
        while any(n.request("stats")["quiesced"] < GROUPS for n in nodes):
            assert time.monotonic() < deadline, [n.request("stats")["quiesced"] for n in nodes]
            time.sleep(0.2)

        def terms() -> list[dict[str, int]]:
            return [{g: s["term"] for g, s in n.request("states")["groups"].items()} for n in nodes]

        terms_before = terms()
        stats_before = [n.request("stats") for n in nodes]
        cpu_before = [process_cpu_s(n.proc.pid) for n in nodes if n.proc is not None]
        started = time.monotonic()
        time.sleep(IDLE_S)
        elapsed = time.monotonic() - started
        cpu = [
            100.0 * (process_cpu_s(n.proc.pid) - before) / elapsed
            for n, before in zip(nodes, cpu_before, strict=True)
            if n.proc is not None
        ]
        stats_after = [n.request("stats") for n in nodes]
        terms_after = terms()

        assert terms_after == terms_before, "an idle group held an election"
        leads = [sum(s["is_leader"] for s in n.request("states")["groups"].values()) for n in nodes]
        assert sum(leads) == GROUPS
        for before, after in zip(stats_before, stats_after, strict=True):
            ticks_per_s = (after["ticks"] - before["ticks"]) / elapsed
            frames_per_s = (after["frames_sent"] - before["frames_sent"]) / elapsed
            pings_per_s = (after["pings_sent"] - before["pings_sent"]) / elapsed
            assert ticks_per_s <= 5 and frames_per_s <= 5, (ticks_per_s, frames_per_s)
            assert pings_per_s <= 1.5 * 2 / config.heartbeat_interval_s, pings_per_s
            assert after["quiesced"] == GROUPS
        assert max(cpu) < 15.0, cpu
