"""`python -m bench.share_bench` (`dmq bench share`): share groups (queues) on real brokers.

Starts `--nodes` (3) `dmq serve` processes on loopback (bench/cluster_bench.py's launcher)
and measures, in the same run, on a topic of ONE partition:

a. **members scale on one partition**: `--records` (1200) records, each taking
   `--work-ms` (10) ms to process (an await, as a call to another service would); k
   members of a fresh share group each poll up to `--batch` (20) records, process them one
   after the other and accept them in one ack request, sent while the next poll runs (as
   Kafka's share consumer sends acknowledgements with its next fetch; one ack request in
   flight per member). Records/s from the first poll to
   the last accept, for k = 1 (the baseline: what a consumer group can do on one
   partition, whatever its size) and k = `--members` (4); the ratio is the figure;
b. **ack throughput**: one member holding 500 records acknowledges them one record per
   request, `--in-flight` (16) requests at once: acks/s (each ack is one Raft command of
   the metadata group, coalesced with concurrent ones);
c. **redelivery latency**: a member takes a record and dies (never acks; lock 1,000 ms);
   another member long-polls. The figure is the delay between the lock's expiry
   (`locked_until`) and the record's delivery to the other member; and the delay from a
   release (the ack request sent) to the redelivery to a third, waiting member.

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
from bench.cluster_bench import dmq_cluster


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


async def _setup(s: aiohttp.ClientSession, url: str, topic: str, records: int, rf: int) -> None:
    await _call(s, "POST", f"{url}/v1/topics",
                {"name": topic, "partitions": 1, "replication_factor": rf})  # fmt: skip
    for start in range(0, records, 500):
        batch = [{"value": f"r{i}"} for i in range(start, min(records, start + 500))]
        await _call(s, "POST", f"{url}/v1/topics/{topic}/records?acks=all", {"records": batch})


async def members_rate(url: str, args: argparse.Namespace, run: int, members: int) -> float:
    """Records/s for `members` members processing `args.records` records of one partition."""
    topic = group = f"scale-{run}-{members}"
    async with aiohttp.ClientSession() as s:
        await _setup(s, url, topic, args.records, args.rf)
        base = f"{url}/v1/share-groups/{group}"
        await _call(s, "PUT", base, {"lock_duration_ms": 30_000})
        ids = [(await _call(s, "POST", f"{base}/members", {"topics": [topic]}))["member_id"]
               for _ in range(members)]  # fmt: skip
        done: set[int] = set()
        started = time.perf_counter()

        async def ack(path: str, offsets: list[int]) -> None:
            acks = [{"topic": topic, "partition": 0, "offsets": offsets, "type": "accept"}]
            await _call(s, "POST", f"{path}/acks", {"acks": acks})
            done.update(offsets)

        async def member(member_id: str) -> None:
            path = f"{base}/members/{member_id}"
            acking: asyncio.Future[None] | None = None
            while len(done) < args.records:
                got = await _call(s, "GET", f"{path}/records?max_records={args.batch}&wait_ms=200")
                offsets = []
                for r in got["records"]:
                    await asyncio.sleep(args.work_ms / 1000)  # processing one record
                    offsets.append(r["offset"])
                if acking is not None:
                    await acking  # one ack request in flight per member
                    acking = None
                if offsets:  # acknowledged while the next poll runs
                    acking = asyncio.ensure_future(ack(path, offsets))
            if acking is not None:
                await acking

        await asyncio.gather(*(member(m) for m in ids))
        return float(args.records / (time.perf_counter() - started))


async def ack_rate(url: str, args: argparse.Namespace, run: int) -> float:
    topic = group = f"acks-{run}"
    count = 500
    async with aiohttp.ClientSession() as s:
        await _setup(s, url, topic, count, args.rf)
        base = f"{url}/v1/share-groups/{group}"
        member = (await _call(s, "POST", f"{base}/members", {"topics": [topic]}))["member_id"]
        held: list[int] = []
        while len(held) < count:
            got = await _call(s, "GET", f"{base}/members/{member}/records?max_records=500")
            held += [r["offset"] for r in got["records"]]
        queue = list(held)
        started = time.perf_counter()

        async def worker() -> None:
            while queue:
                offset = queue.pop()
                acks = [{"topic": topic, "partition": 0, "offsets": [offset], "type": "accept"}]
                await _call(s, "POST", f"{base}/members/{member}/acks", {"acks": acks})

        await asyncio.gather(*(worker() for _ in range(args.in_flight)))
        return count / (time.perf_counter() - started)


async def redelivery(url: str, args: argparse.Namespace, run: int) -> tuple[float, float]:
    """(ms from lock expiry to redelivery, ms from a release to redelivery)."""
    topic = group = f"redeliver-{run}"
    async with aiohttp.ClientSession() as s:
        await _setup(s, url, topic, 2, args.rf)
        base = f"{url}/v1/share-groups/{group}"
        await _call(s, "PUT", base, {"lock_duration_ms": 1_000})
        dead = (await _call(s, "POST", f"{base}/members", {"topics": [topic]}))["member_id"]
        alive = (await _call(s, "POST", f"{base}/members", {"topics": [topic]}))["member_id"]
        waiter = (await _call(s, "POST", f"{base}/members", {"topics": [topic]}))["member_id"]
        (taken,) = (await _call(s, "GET", f"{base}/members/{dead}/records?max_records=1"))[
            "records"
        ]
        held: set[int] = set()
        while taken["offset"] not in held:  # the other record at once, this one after the lock
            got = await _call(s, "GET", f"{base}/members/{alive}/records?wait_ms=3000")
            held |= {r["offset"] for r in got["records"]}
        expiry_ms = time.time() * 1000 - taken["locked_until"]
        acks = [{"topic": topic, "partition": 0, "offsets": [min(held)], "type": "release"}]
        poller = asyncio.ensure_future(
            _call(s, "GET", f"{base}/members/{waiter}/records?wait_ms=3000&max_records=1")
        )
        await asyncio.sleep(0.2)  # the third member is waiting
        released = time.perf_counter()
        await _call(s, "POST", f"{base}/members/{alive}/acks", {"acks": acks})
        await poller
        release_ms = (time.perf_counter() - released) * 1000
        return expiry_ms, release_ms


def measure(nodes: int, args: argparse.Namespace) -> dict[str, float]:
    runs: list[dict[str, float]] = []
    args.rf = min(3, nodes)
    with (
        tempfile.TemporaryDirectory(prefix="dmq-share-bench-") as tmp,
        dmq_cluster(Path(tmp) / f"n{nodes}", nodes, "fsync") as brokers,
    ):
        url = brokers[-1].url  # any broker: share-group requests go to the metadata leader
        for run in range(args.runs):
            one = asyncio.run(members_rate(url, args, run, 1))
            many = asyncio.run(members_rate(url, args, run, args.members))
            expiry_ms, release_ms = asyncio.run(redelivery(url, args, run))
            runs.append({
                "one_member_per_s": one, "members_per_s": many, "ratio": many / one,
                "acks_per_s": asyncio.run(ack_rate(url, args, run)),
                "redelivery_after_expiry_ms": expiry_ms, "redelivery_after_release_ms": release_ms,
            })  # fmt: skip
    return {k: statistics.median(r[k] for r in runs) for k in runs[0]}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--nodes", type=int, default=3, help="brokers of the cluster (3)")
    parser.add_argument("--runs", type=int, default=3, help="runs; medians are shown (3)")
    parser.add_argument("--records", type=int, default=1200, help="records per scale run (1200)")
    parser.add_argument("--work-ms", type=int, default=10, help="processing per record (10)")
    parser.add_argument("--members", type=int, default=4, help="members against 1 (4)")
    parser.add_argument("--batch", type=int, default=20, help="max_records per poll (20)")
    parser.add_argument("--in-flight", type=int, default=16, help="concurrent acks (16)")
    parser.add_argument("--quick", action="store_true", help="one small run (CI)")


def run(args: argparse.Namespace) -> dict[str, float]:
    if args.quick:
        args.runs, args.records = 1, 120
    print(f"share_bench: {args.nodes} node(s), fsync, {args.runs} run(s), medians; one "
          f"partition, {args.records} records of {args.work_ms} ms work, {args.batch} per poll; "
          f"brokers and client on this machine (2 shared cores here)")  # fmt: skip
    r = measure(args.nodes, args)
    print(
        f"1 member: {r['one_member_per_s']:.0f} records/s; {args.members} members: "
        f"{r['members_per_s']:.0f} records/s; ratio {r['ratio']:.2f}x (target >= 3x)"
    )
    print(f"acks: {r['acks_per_s']:.0f} acks/s (one record per request, {args.in_flight} in "
          f"flight); redelivery {r['redelivery_after_expiry_ms']:.0f} ms after lock expiry, "
          f"{r['redelivery_after_release_ms']:.0f} ms after a release")  # fmt: skip
    return r


main = main_of(__doc__, add_arguments, run)


if __name__ == "__main__":
    raise SystemExit(main())
