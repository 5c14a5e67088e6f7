"""`python -m bench.groups_bench` (`dmq bench groups`): consumer groups on real brokers.

Starts `--nodes` (3) `dmq serve` processes on loopback (bench/cluster_bench.py's launcher),
then a single-node broker, and measures on each, in the same run:

a. **commit latency**: one member commits one offset at a time, `--commits` (300) times:
   p50 and p99 (ms); the baseline is a one-record acks=all produce, measured the same way;
b. **commit rate**: `--in-flight` (32) commits at once for `--seconds` (4): commits/s that
   the metadata group sustains (each commit is one Raft command; concurrent ones are
   coalesced into one entry by the Raft node's group commit); baseline: one-record
   acks=all produces, 32 at once;
c. **member death**: two members share 4 partitions (session timeout `--session-ms`, 1000);
   one stops calling (as after kill -9); the other heartbeats every 100 ms and group-fetches.
   The figure is the time from the last call of the dead member until the survivor
   receives a record produced to one of the dead member's partitions.

Every figure is the median of `--runs` (3) runs. The brokers and this client share the
machine's cores (on the 2-core shared VM of this project: say so next to each figure).
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp

from bench import main_of
from bench.cluster_bench import dmq_cluster, percentile

TOPIC_PARTITIONS = 4


async def _call(session: aiohttp.ClientSession, method: str, url: str, body: Any = None,
                expect: tuple[int, ...] = (200, 201, 204)) -> Any:  # fmt: skip
    while True:
        async with session.request(method, url, json=body) as r:
            data = await r.json() if r.content_type == "application/json" else None
            if r.status in expect:
                return data
            if r.status not in (429, 503, 504):
                raise RuntimeError(f"{method} {url}: {r.status} {data}")
        await asyncio.sleep(0.05)


async def _timed(calls: int, one: Any) -> list[float]:
    out = []
    for i in range(calls):
        start = time.perf_counter()
        await one(i)
        out.append((time.perf_counter() - start) * 1000)
    return sorted(out)


async def _rate(seconds: float, in_flight: int, one: Any) -> float:
    done = 0
    deadline = time.perf_counter() + seconds

    async def worker(k: int) -> None:
        nonlocal done
        i = 0
        while time.perf_counter() < deadline:
            await one(k * 1_000_000 + i)
            i += 1
            done += 1

    start = time.perf_counter()
    await asyncio.gather(*(worker(k) for k in range(in_flight)))
    return done / (time.perf_counter() - start)


async def latency_and_rate(url: str, args: argparse.Namespace, run: int) -> dict[str, float]:
    topic, group = f"bench-{run}", f"bench-{run}"
    async with aiohttp.ClientSession() as s:
        await _call(s, "POST", f"{url}/v1/topics",
                    {"name": topic, "partitions": TOPIC_PARTITIONS, "replication_factor": args.rf})  # fmt: skip
        member = await _call(s, "POST", f"{url}/v1/groups/{group}/members",
                             {"topics": [topic], "session_timeout_ms": 300_000})  # fmt: skip

        async def commit(i: int) -> None:
            body = {"member_id": member["member_id"], "generation": member["generation"],
                    "offsets": [{"topic": topic, "partition": i % TOPIC_PARTITIONS, "offset": i}]}  # fmt: skip
            await _call(s, "POST", f"{url}/v1/groups/{group}/offsets", body)

        async def produce(i: int) -> None:
            body = {"records": [{"value": f"r{i}", "partition": i % TOPIC_PARTITIONS}]}
            await _call(s, "POST", f"{url}/v1/topics/{topic}/records?acks=all", body)

        commits = await _timed(args.commits, commit)
        produces = await _timed(args.commits, produce)
        return {
            "commit_p50_ms": percentile(commits, 0.5),
            "commit_p99_ms": percentile(commits, 0.99),
            "produce_p50_ms": percentile(produces, 0.5),
            "produce_p99_ms": percentile(produces, 0.99),
            "commits_per_s": await _rate(args.seconds, args.in_flight, commit),
            "produces_per_s": await _rate(args.seconds, args.in_flight, produce),
        }


async def member_death(url: str, args: argparse.Namespace, run: int) -> float:
    topic, group = f"death-{run}", f"death-{run}"
    base = f"{url}/v1/groups/{group}/members"
    async with aiohttp.ClientSession() as s:
        await _call(s, "POST", f"{url}/v1/topics",
                    {"name": topic, "partitions": TOPIC_PARTITIONS, "replication_factor": args.rf})  # fmt: skip
        join = {"topics": [topic], "session_timeout_ms": args.session_ms}
        dead = await _call(s, "POST", base, join)
        alive = await _call(s, "POST", base, join)
        while True:  # both heartbeat until the partitions are split 2/2
            d = await _call(s, "POST", f"{base}/{dead['member_id']}/heartbeat",
                            {"generation": dead["generation"]})  # fmt: skip
            a = await _call(s, "POST", f"{base}/{alive['member_id']}/heartbeat",
                            {"generation": alive["generation"]})  # fmt: skip
            dead, alive = {**dead, **d}, {**alive, **a}
            if len(d["assignment"]) == len(a["assignment"]) == TOPIC_PARTITIONS // 2:
                break
            await asyncio.sleep(0.05)
        died_at = time.perf_counter()  # the dead member's last call
        orphan = dead["assignment"][0]["partition"]
        body = {"records": [{"value": "after-death", "partition": orphan}]}
        await _call(s, "POST", f"{url}/v1/topics/{topic}/records?acks=all", body)
        while True:
            hb = await _call(s, "POST", f"{base}/{alive['member_id']}/heartbeat",
                             {"generation": alive["generation"]})  # fmt: skip
            alive = {**alive, **hb}
            got = await _call(s, "GET", f"{base}/{alive['member_id']}/records?wait_ms=100")
            if any(p["partition"] == orphan and p["records"] for p in got["partitions"]):
                return time.perf_counter() - died_at
            if time.perf_counter() - died_at > 60:
                raise RuntimeError("the dead member's partition was not served in 60 s")


def measure(nodes: int, args: argparse.Namespace) -> dict[str, float]:
    runs: list[dict[str, float]] = []
    args.rf = min(3, nodes)
    with (
        tempfile.TemporaryDirectory(prefix="dmq-groups-bench-") as tmp,
        dmq_cluster(Path(tmp) / f"n{nodes}", nodes, "fsync") as brokers,
    ):
        url = brokers[-1].url  # any broker: group requests are relayed to the leader
        for run in range(args.runs):
            figures = asyncio.run(latency_and_rate(url, args, run))
            figures["death_to_served_s"] = asyncio.run(member_death(url, args, run))
            runs.append(figures)
    return {k: statistics.median(r[k] for r in runs) for k in runs[0]}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--nodes", type=int, default=3, help="brokers of the cluster (3)")
    parser.add_argument("--runs", type=int, default=3, help="runs; medians are shown (3)")
    parser.add_argument("--commits", type=int, default=300, help="sequential commits (300)")
    parser.add_argument("--seconds", type=float, default=4.0, help="per rate measure (4)")
    parser.add_argument("--in-flight", type=int, default=32, help="concurrent commits (32)")
    parser.add_argument("--session-ms", type=int, default=1_000, help="session timeout (1000)")
    parser.add_argument("--quick", action="store_true", help="one small run (CI)")


def run(args: argparse.Namespace) -> dict[int, dict[str, float]]:
    if args.quick:
        args.runs, args.commits, args.seconds = 1, 50, 1.0
    print(f"groups_bench: {args.nodes} nodes vs 1 node, fsync, {args.runs} run(s), medians; "
          f"{args.commits} sequential calls, {args.in_flight} in flight for {args.seconds} s, "
          f"session {args.session_ms} ms; brokers and client on this machine")  # fmt: skip
    results = {n: measure(n, args) for n in (args.nodes, 1)}
    cluster, single = results[args.nodes], results[1]
    for name, r in ((f"{args.nodes} nodes", cluster), ("1 node", single)):
        print(f"{name}: commit p50 {r['commit_p50_ms']:.1f} ms, p99 {r['commit_p99_ms']:.1f} ms "
              f"(produce acks=all p50 {r['produce_p50_ms']:.1f}, p99 {r['produce_p99_ms']:.1f}); "
              f"{r['commits_per_s']:.0f} commits/s ({r['produces_per_s']:.0f} produces/s); "
              f"member death -> served again {r['death_to_served_s']:.2f} s")  # fmt: skip
    print(f"ratios {args.nodes} nodes / 1 node: commit p50 "
          f"{cluster['commit_p50_ms'] / single['commit_p50_ms']:.2f}x, commit rate "
          f"{cluster['commits_per_s'] / single['commits_per_s']:.2f}x; commit/produce p50 "
          f"{cluster['commit_p50_ms'] / cluster['produce_p50_ms']:.2f}x ({args.nodes} nodes)")  # fmt: skip
    return results


main = main_of(__doc__, add_arguments, run)


if __name__ == "__main__":
    raise SystemExit(main())
