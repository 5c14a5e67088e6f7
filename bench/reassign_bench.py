"""`python -m bench.reassign_bench`: the time and throughput cost of moving a partition.

Starts 4 `dmq serve` processes on loopback (n1-n3 metadata voters, all on this machine),
fills partition 0 of a topic `big` (replication factor 3, on three brokers) with
`--size-mb` (1024) MiB of 1 KiB records in binary batches of 128, then:

1. **baseline**: `--load-seconds` (10) of acks=all produce to a second topic `load`
   (batches of 128 x 1 KiB, `--in-flight` (4) requests at once): MB/s;
2. **move**: `POST /v1/cluster/reassignments` moves `big`-0 from its leader's broker to
   the fourth broker (a new replica added to the Raft group, caught up, leadership moved,
   the old replica removed: dmq/broker/operations.py) while the same load runs: seconds until
   `GET /v1/cluster/operations` shows none, the moved MiB/s, and the load's MB/s during
   the move as a ratio of the baseline.

Every process started here is killed before `run` returns, errors included. The brokers
and this client share the machine's cores.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import aiohttp

from bench.cluster_bench import (
    Broker,
    ClusterError,
    closed_loop,
    create_topic,
    dmq_cluster,
    post_batch,
    records,
    wait_leader,
)
from log.records import encode_batch

BATCH_RECORDS = 128
FILL_IN_FLIGHT = 8
MOVE_TIMEOUT_S = 3600.0
POLL_S = 0.5


async def _json(session: aiohttp.ClientSession, method: str, url: str, body: Any = None) -> Any:
    async with session.request(method, url, json=body) as r:
        text = await r.text()
        if r.status >= 300:
            raise ClusterError(f"{method} {url}: {r.status} {text[:300]}")
        return json.loads(text)


async def fill(session: aiohttp.ClientSession, url: str, size_mb: float) -> float:
    """Produce `size_mb` MiB to big-0; the MB/s it took."""
    batches = [encode_batch(records(BATCH_RECORDS, k * BATCH_RECORDS)) for k in range(16)]
    total = int(size_mb * 1024 * 1024)
    batch_bytes = len(batches[0])
    count = max(1, total // batch_bytes)
    start = time.perf_counter()
    sent = [0]

    async def worker() -> None:
        while sent[0] < count:
            sent[0] += 1
            await post_batch(session, url, "big", batches[sent[0] % len(batches)])

    await asyncio.gather(*(worker() for _ in range(FILL_IN_FLIGHT)))
    return count * batch_bytes / 1e6 / (time.perf_counter() - start)


async def move(
    session: aiohttp.ClientSession, brokers: list[Broker], args: argparse.Namespace
) -> dict[str, float]:
    url = brokers[0].url
    await create_topic(session, url, "big", 1, 3)
    leader = await wait_leader(session, brokers, "big")
    fill_mb_s = await fill(session, leader.url, args.size_mb)
    desc = await _json(session, "GET", f"{url}/v1/topics/big")
    replicas = desc["partitions"][0]["replicas"]
    spare = next(b.node_id for b in brokers if b.node_id not in replicas)
    leader = await wait_leader(session, brokers, "big")
    target = [spare, *[r for r in replicas if r != leader.node_id]]
    await create_topic(session, url, "load", 1, 3)
    batches = [encode_batch(records(BATCH_RECORDS, k)) for k in range(8)]
    baseline_until = time.perf_counter() + args.load_seconds
    baseline_mb_s = await _load_slices(
        session, brokers, batches, args, lambda: time.perf_counter() < baseline_until
    )
    body = {"topic": "big", "partition": 0, "replicas": target}
    started = time.perf_counter()
    await _json(session, "POST", f"{url}/v1/cluster/reassignments", body)
    moved: list[float] = []

    async def watch() -> None:
        moved.append(await _wait_done(session, url, started))

    watcher = asyncio.ensure_future(watch())
    during_mb_s = await _load_slices(session, brokers, batches, args, lambda: not moved)
    await watcher
    moved_s = moved[0]
    return {
        "fill_mb_s": fill_mb_s,
        "move_s": moved_s,
        "moved_mib_s": args.size_mb / moved_s,
        "load_baseline_mb_s": baseline_mb_s,
        "load_during_mb_s": during_mb_s,
        "load_ratio": during_mb_s / baseline_mb_s,
    }


async def _wait_done(session: aiohttp.ClientSession, url: str, started: float) -> float:
    while time.perf_counter() - started < MOVE_TIMEOUT_S:
        ops = await _json(session, "GET", f"{url}/v1/cluster/operations")
        if not ops["reassignments"]:
            return time.perf_counter() - started
        await asyncio.sleep(POLL_S)
    raise ClusterError(f"the move did not finish in {MOVE_TIMEOUT_S} s")


async def _load_slices(
    session: aiohttp.ClientSession,
    brokers: list[Broker],
    batches: list[bytes],
    args: argparse.Namespace,
    going: Callable[[], bool],
) -> float:
    """The load's MB/s while `going()`: 1-second slices, each to the leader of the moment
    (the same way for the baseline and during the move)."""
    total_bytes = 0
    start = time.perf_counter()
    while going():
        leader = await wait_leader(session, brokers, "load")
        _, _, sent, _ = await closed_loop(session, leader.url, "load", batches, args.in_flight, 1.0)
        total_bytes += sent
    return total_bytes / 1e6 / (time.perf_counter() - start)


def run(args: argparse.Namespace) -> dict[str, float]:
    base = Path(tempfile.mkdtemp(prefix="dmq-reassign-bench-", dir=args.dir or ".")).resolve()
    print(
        f"reassign_bench: 4 brokers on loopback (3 metadata voters), move {args.size_mb} MiB "
        f"of 1 KiB records (batches of {BATCH_RECORDS}), load {args.in_flight} in flight, "
        f"raft durability {args.durability}; {base}",
        flush=True,
    )
    try:
        with dmq_cluster(base / "c", 4, args.durability) as brokers:
            figures = asyncio.run(_measure(brokers, args))
    finally:
        shutil.rmtree(base, ignore_errors=True)
    for key, value in figures.items():
        print(f"  {key:<20} {value:10.2f}")
    return figures


async def _measure(brokers: list[Broker], args: argparse.Namespace) -> dict[str, float]:
    timeout = aiohttp.ClientTimeout(total=120)
    async with aiohttp.ClientSession(timeout=timeout) as session:
        return await move(session, brokers, args)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--size-mb", type=float, default=1024.0, help="MiB in the moved partition")
    parser.add_argument("--load-seconds", type=float, default=10.0, help="baseline load, seconds")
    parser.add_argument("--in-flight", type=int, default=4, help="load requests at once")
    parser.add_argument("--durability", default="fsync", choices=("fsync", "none"))
    parser.add_argument("--dir", type=Path, help="create the work directory inside DIR")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_arguments(parser)
    run(parser.parse_args(argv))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
