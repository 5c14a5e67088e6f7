"""One partition's latency while another on the same broker takes a heavy load, #22.

    python -m bench.stall_bench [--quick] [--seconds S] [--runs N] [--dir DIR]

A single-node `dmq serve` (fsync durability) on loopback with two topics of one partition:
`heavy` takes binary batches of 1000 x 1 KiB, two requests in flight, acks=all, for
--seconds; meanwhile `probe` takes one record every 5 ms, each waiting for its answer. All
partitions of a node share its Raft tick thread, so a stall of that thread (a segment of
`heavy` sealed with an fdatasync of everything it holds, log/writeback.py) shows in the
probe's latency. Printed per run: the heavy load's MB/s and the probe's p50, p99, p99.9,
max and answers over 50 ms; then the medians. The broker and this client share the cores.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path

import aiohttp

from bench import main_of
from bench.cluster_bench import (
    BATCH_CONTENT_TYPE,
    Broker,
    RawBody,
    create_topic,
    dmq_cluster,
    one_record_batch,
    percentile,
    records,
    wait_leader,
)
from log.records import encode_batch

PROBE_INTERVAL_S = 0.005
HEAVY_IN_FLIGHT = 2


async def measure(url: str, brokers: list[Broker], seconds: float) -> dict[str, float]:
    heavy_batch, probe_batch = encode_batch(records(1000, 0)), one_record_batch()
    async with aiohttp.ClientSession() as session:
        for topic in ("heavy", "probe"):
            await create_topic(session, url, topic, 1, 1)
            await wait_leader(session, brokers, topic)
        stop = time.perf_counter() + seconds
        sent = [0]
        latencies: list[float] = []

        async def post(topic: str, batch: bytes) -> None:
            async with session.post(
                f"{url}/v1/topics/{topic}/records?partition=0&acks=all",
                data=RawBody(batch, BATCH_CONTENT_TYPE),
            ) as answer:
                await answer.read()
                if answer.status != 200:
                    raise RuntimeError(f"produce to {topic}: {answer.status}")

        async def heavy() -> None:
            while time.perf_counter() < stop:
                await post("heavy", heavy_batch)
                sent[0] += len(heavy_batch)

        async def probe() -> None:
            while time.perf_counter() < stop:
                started = time.perf_counter()
                await post("probe", probe_batch)
                latencies.append(time.perf_counter() - started)
                await asyncio.sleep(PROBE_INTERVAL_S)

        await asyncio.gather(*(heavy() for _ in range(HEAVY_IN_FLIGHT)), probe())
    latencies.sort()
    return {
        "heavy_mb_s": sent[0] / seconds / 1e6,
        "probe_p50_ms": percentile(latencies, 0.5) * 1e3,
        "probe_p99_ms": percentile(latencies, 0.99) * 1e3,
        "probe_p999_ms": percentile(latencies, 0.999) * 1e3,
        "probe_max_ms": latencies[-1] * 1e3,
        "probe_over_50ms": float(sum(x > 0.05 for x in latencies)),
    }


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--quick", action="store_true", help="one run of 4 s")
    parser.add_argument("--seconds", type=float, default=12.0)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--dir", type=Path, default=None, help="work directory parent")


def run(args: argparse.Namespace) -> dict[str, float]:
    """Run as `args` say; print every run and the medians, and return the medians."""
    seconds, runs = (4.0, 1) if args.quick else (args.seconds, args.runs)
    print(f"1 node, fsync; heavy: 1000 x 1 KiB batches, {HEAVY_IN_FLIGHT} in flight; probe: one "
          f"record every {PROBE_INTERVAL_S * 1e3:.0f} ms; {seconds:g} s per run, {runs} runs; "
          f"{os.cpu_count()} cores shared by the broker and this client, load "
          f"{os.getloadavg()[0]:.2f}")  # fmt: skip
    samples: dict[str, list[float]] = {}
    base = Path(tempfile.mkdtemp(prefix="dmq-stall-bench-", dir=args.dir))
    try:
        for k in range(runs):
            with dmq_cluster(base / f"run{k}", 1, "fsync") as brokers:
                figures = asyncio.run(measure(brokers[0].url, brokers, seconds))
            shutil.rmtree(base / f"run{k}", ignore_errors=True)
            print(f"  run {k + 1}: " + ", ".join(f"{n} {v:.1f}" for n, v in figures.items()))
            for name, value in figures.items():
                samples.setdefault(name, []).append(value)
    finally:
        shutil.rmtree(base, ignore_errors=True)
    medians = {name: statistics.median(values) for name, values in samples.items()}
    print("medians: " + ", ".join(f"{n} {v:.1f}" for n, v in medians.items()))
    print(f"load average at the end: {os.getloadavg()[0]:.2f}")
    return medians


main = main_of(__doc__, add_arguments, run)

if __name__ == "__main__":
    raise SystemExit(main())
