"""`python -m bench.reads_bench` (`dmq bench reads`): linearizable reads against leader reads.

Starts `--nodes` (3) `dmq serve` processes on loopback (bench/cluster_bench.py's launcher,
fsync on), one topic of 1 partition, replication factor min(3, nodes), and `--records`
(1000) records in it. Then, in the same run, `--readers` (32) concurrent HTTP readers
send to the partition's leader, for `--seconds` (4) each and back to back:

a. **offsets**: `GET .../offsets?consistency=leader` and `?consistency=linearizable`;
b. **fetch**: `GET .../records?offset=<hw - 10>&max_records=10&consistency=leader` and
   `linearizable` (10 records of 100 B from the log's tail).

Each kind is measured leader, linearizable, linearizable, leader (half of `--seconds`
each), so that a warming cache or a drifting machine load favours neither level.

`linearizable` waits for the leader's ReadIndex (raft/read_index.py: one confirmation
round per Raft round, shared by every read that arrived before it went out); `leader`
answers at once. Figures: reads/s of each, the ratio linearizable / leader per kind (the
issue's target: >= 0.70), p50 and p99 latency (ms) of each; every figure the median of
`--runs` (3) runs. The brokers, the readers and this process share the machine's cores
(2 shared cores on this project's VM: "3 nodes share 2 cores").
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
from pathlib import Path

import aiohttp

from bench import main_of
from bench.cluster_bench import dmq_cluster, led_partitions, percentile

TOPIC = "reads-bench"
KINDS = ("offsets", "fetch")
LEVELS = ("leader", "linearizable")


async def _prepare(url: str, rf: int, records: int) -> str:
    """Create the topic, fill it, and return the URL of its leader's broker."""
    async with aiohttp.ClientSession() as s:
        body = {"name": TOPIC, "partitions": 1, "replication_factor": rf}
        for _ in range(200):
            async with s.post(f"{url}/v1/topics", json=body) as r:
                if r.status in (201, 409):
                    break
            await asyncio.sleep(0.1)
        batch = {"records": [{"value": "v" * 100, "partition": 0} for _ in range(100)]}
        sent = 0
        while sent < records:
            async with s.post(f"{url}/v1/topics/{TOPIC}/records", json=batch) as r:
                if r.status in (200, 201):
                    sent += 100
                else:
                    await asyncio.sleep(0.1)
        for _ in range(200):
            leaders = await led_partitions(s, url, TOPIC)
            if 0 in leaders:
                break
            await asyncio.sleep(0.1)
        async with s.get(f"{url}/v1/cluster/status") as r:
            status = await r.json()
    leader = leaders[0]
    for broker in status.get("brokers", []):
        if str(broker.get("id", broker.get("node_id"))) == leader and broker.get("http_addr"):
            return f"http://{broker['http_addr']}"
    return ""


async def _read(
    url: str, kind: str, level: str, args: argparse.Namespace
) -> tuple[float, list[float]]:
    """(reads/s, sorted latencies in ms) of --readers readers for --seconds."""
    latencies: list[float] = []
    refused: list[int] = []
    base = f"{url}/v1/topics/{TOPIC}/partitions/0"
    offset = max(0, args.records - 10)
    path = (
        f"{base}/offsets?consistency={level}"
        if kind == "offsets"
        else f"{base}/records?offset={offset}&max_records=10&consistency={level}"
    )

    async def one(session: aiohttp.ClientSession) -> None:
        while time.perf_counter() < deadline:
            start = time.perf_counter()
            async with session.get(path) as r:
                await r.read()
                if r.status == 503:  # a leader change under load: retriable, not counted
                    refused.append(1)
                    await asyncio.sleep(0.05)
                    continue
                if r.status != 200:
                    raise RuntimeError(f"GET {path}: {r.status}")
            latencies.append((time.perf_counter() - start) * 1000)

    connector = aiohttp.TCPConnector(limit=args.readers)
    async with aiohttp.ClientSession(connector=connector) as session:
        async with session.get(path) as r:  # warm the connection and the path
            await r.read()
        start = time.perf_counter()
        deadline = start + args.seconds / 2
        await asyncio.gather(*(one(session) for _ in range(args.readers)))
        took = time.perf_counter() - start
    if refused:
        print(f"  {kind} {level}: {len(refused)} answers 503 (retried, not counted)")
    if not latencies:
        raise RuntimeError(f"GET {path}: no read answered 200 in {took:.1f} s")
    return len(latencies) / took, sorted(latencies)


def measure(args: argparse.Namespace) -> dict[str, float]:
    runs: list[dict[str, float]] = []
    with (
        tempfile.TemporaryDirectory(prefix="dmq-reads-bench-") as tmp,
        dmq_cluster(Path(tmp) / f"n{args.nodes}", args.nodes, "fsync") as brokers,
    ):
        leader_url = asyncio.run(_prepare(brokers[0].url, min(3, args.nodes), args.records))
        by_url = {b.url: b for b in brokers}
        url = leader_url if leader_url in by_url else brokers[0].url
        print(f"  readers ask {url} ({'the leader' if url == leader_url else 'not the leader'})")
        for run in range(args.runs):
            figures: dict[str, float] = {}
            for kind in KINDS:
                rates: dict[str, list[float]] = {level: [] for level in LEVELS}
                lats: dict[str, list[float]] = {level: [] for level in LEVELS}
                for level in (*LEVELS, *reversed(LEVELS)):
                    rate, lat = asyncio.run(_read(url, kind, level, args))
                    rates[level].append(rate)
                    lats[level] += lat
                for level in LEVELS:
                    lat = sorted(lats[level])
                    figures[f"{kind}_{level}_per_s"] = statistics.mean(rates[level])
                    figures[f"{kind}_{level}_p50_ms"] = percentile(lat, 0.5)
                    figures[f"{kind}_{level}_p99_ms"] = percentile(lat, 0.99)
                ratio = figures[f"{kind}_linearizable_per_s"] / figures[f"{kind}_leader_per_s"]
                figures[f"{kind}_ratio"] = ratio
            print(f"  run {run + 1}: " + ", ".join(
                f"{k} {figures[f'{k}_leader_per_s']:.0f} -> {figures[f'{k}_linearizable_per_s']:.0f}"
                f" reads/s ({figures[f'{k}_ratio']:.2f})" for k in KINDS
            ), flush=True)  # fmt: skip
            runs.append(figures)
    return {k: statistics.median(r[k] for r in runs) for k in runs[0]}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--nodes", type=int, default=3, help="brokers of the cluster (3)")
    parser.add_argument("--runs", type=int, default=3, help="runs; medians are shown (3)")
    parser.add_argument("--seconds", type=float, default=4.0, help="per measure (4)")
    parser.add_argument("--readers", type=int, default=32, help="concurrent readers (32)")
    parser.add_argument("--records", type=int, default=1000, help="records in the topic (1000)")
    parser.add_argument("--quick", action="store_true", help="one small run (CI)")


def run(args: argparse.Namespace) -> dict[str, float]:
    if args.quick:
        args.runs, args.seconds, args.records = 1, 1.0, 100
    print(f"reads_bench: {args.nodes} nodes, fsync, 1 partition, {args.readers} readers at the "
          f"partition leader, {args.seconds} s per measure, {args.runs} run(s), medians; "
          f"{args.nodes} nodes and the client share this machine's cores "
          f"(2 shared cores here)")  # fmt: skip
    r = measure(args)
    for kind in KINDS:
        print(f"{kind}: leader {r[f'{kind}_leader_per_s']:.0f} reads/s "
              f"(p50 {r[f'{kind}_leader_p50_ms']:.1f} ms, p99 {r[f'{kind}_leader_p99_ms']:.1f} ms)"
              f", linearizable {r[f'{kind}_linearizable_per_s']:.0f} reads/s "
              f"(p50 {r[f'{kind}_linearizable_p50_ms']:.1f} ms, "
              f"p99 {r[f'{kind}_linearizable_p99_ms']:.1f} ms); ratio "
              f"{r[f'{kind}_ratio']:.2f} (target >= 0.70)")  # fmt: skip
    return r


main = main_of(__doc__, add_arguments, run)


if __name__ == "__main__":
    raise SystemExit(main())
