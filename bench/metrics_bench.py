"""`dmq bench metrics` (`python -m bench.metrics_bench`): what scraping GET /metrics costs
batched produce.

One real `dmq serve` process on loopback (bench/broker_bench.py's Server). Runs alternate
between produce alone and produce while a scraper GETs /metrics every --interval seconds
(Prometheus's side), so that both see the same disk and page cache over time; each run
produces --total-mb of 1 KiB records in 1000-record binary batches with 4 requests in
flight, to a topic of --partitions partitions. Printed: the median produce MB/s of each
mode, their ratio, the broker's CPU seconds per produced GB in each mode (steadier than
MB/s when other work shares the machine), and the scrape's median latency and size.

MB/s moves by more than the 2% budget between two runs of the same mode on a shared
machine, so the run also measures the scrape's own price, which noise does not hide: the
broker's CPU seconds per scrape (--cpu-scrapes scrapes back to back once produce has
stopped, every run's topic in place, less the broker's idle CPU over the same time), set
against the broker's CPU seconds per second while it produced (plain runs). A broker that
produces as fast as it can is bound by its one Python interpreter, so that quotient,
`scrape_cost_share` = CPU per scrape / interval / produce CPU per second, is the share of
produce throughput a scrape every interval takes. On a loaded machine the broker gets less
than a core while producing and the quotient grows with the load;
`scrape_share_of_one_core` (CPU per scrape / interval) is the same price against a broker
that has its core, the case the budget is about (batched produce at full speed).

The issue's budget (#21): a scrape a second costs < 2% of batched produce throughput.
The broker, the producer and the scraper share this machine's 2 cores: say so next to
any figure quoted from here.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp

from bench.broker_bench import BATCH_RECORDS, RECORD_BYTES, Server, _produce_binary
from bench.cpu import process_cpu_s
from log.records import Record, encode_batch

IDLE_SAMPLE_S = 2.0  # the broker's idle CPU, subtracted from the scrapes' CPU


def _batches(total_mb: int, seed: int) -> list[bytes]:
    rng = random.Random(seed)
    count = max(1, total_mb * 1_000_000 // (RECORD_BYTES * BATCH_RECORDS))
    return [
        encode_batch([Record(None, rng.randbytes(RECORD_BYTES)) for _ in range(BATCH_RECORDS)])
        for _ in range(count)
    ]


async def _scraper(
    session: aiohttp.ClientSession, url: str, interval_s: float, out: list[tuple[float, int]]
) -> None:
    while True:
        start = time.perf_counter()
        async with session.get(f"{url}/metrics") as resp:
            body = await resp.read()
        out.append((time.perf_counter() - start, len(body)))
        await asyncio.sleep(max(0.0, interval_s - (time.perf_counter() - start)))


async def _one_run(
    url: str, run: int, batches: list[bytes], partitions: int, scrape_s: float | None
) -> tuple[float, list[tuple[float, int]]]:
    scrapes: list[tuple[float, int]] = []
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=300)) as session:
        topic = f"bench-metrics-{run}"
        body = {"name": topic, "partitions": partitions}
        async with session.post(f"{url}/v1/topics", json=body) as resp:
            await resp.read()
        scraper = (
            asyncio.ensure_future(_scraper(session, url, scrape_s, scrapes))
            if scrape_s is not None
            else None
        )
        try:
            elapsed = await _produce_binary(session, url, topic, batches, concurrency=4)
        finally:
            if scraper is not None:
                scraper.cancel()
                await asyncio.gather(scraper, return_exceptions=True)
    return sum(map(len, batches)) / elapsed / 1e6, scrapes


def _scrape_cpu_s(url: str, pid: int, scrapes: int) -> float:
    """The broker's CPU seconds per GET /metrics, less its idle CPU (module docstring)."""

    async def scrape_all() -> float:
        async with aiohttp.ClientSession() as session:
            start = time.perf_counter()
            for _ in range(scrapes):
                async with session.get(f"{url}/metrics") as resp:
                    await resp.read()
            return time.perf_counter() - start

    idle_before = process_cpu_s(pid)
    time.sleep(IDLE_SAMPLE_S)
    idle_per_s = (process_cpu_s(pid) - idle_before) / IDLE_SAMPLE_S
    before = process_cpu_s(pid)
    wall = asyncio.run(scrape_all())
    return max(0.0, process_cpu_s(pid) - before - idle_per_s * wall) / scrapes


def run(args: argparse.Namespace) -> dict[str, Any]:
    if args.quick:  # CI: one run of each mode, small, scraped often enough to see scrapes
        args.runs, args.total_mb, args.interval, args.cpu_scrapes = 1, 4, 0.1, 20
    batches = _batches(args.total_mb, seed=1)
    plain: list[float] = []
    scraped: list[float] = []
    cpu: dict[bool, list[float]] = {False: [], True: []}  # broker CPU s per produced GB
    busy: list[float] = []  # broker CPU s per s of produce, plain runs
    scrapes: list[tuple[float, int]] = []
    gb = sum(map(len, batches)) / 1e9
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp, Server(Path(tmp) / "data") as server:
        assert server.proc is not None
        for run_index in range(2 * args.runs):
            with_scrape = run_index % 2 == 1
            cpu_before, wall_before = process_cpu_s(server.proc.pid), time.perf_counter()
            mb_s, seen = asyncio.run(
                _one_run(
                    server.url,
                    run_index,
                    batches,
                    args.partitions,
                    args.interval if with_scrape else None,
                )
            )
            cpu_used = process_cpu_s(server.proc.pid) - cpu_before
            cpu[with_scrape].append(cpu_used / gb)
            if not with_scrape:
                busy.append(cpu_used / (time.perf_counter() - wall_before))
            (scraped if with_scrape else plain).append(mb_s)
            scrapes += seen
        scrape_cpu_s = _scrape_cpu_s(server.url, server.proc.pid, args.cpu_scrapes)
    busy_median = statistics.median(busy)
    result = {
        "setup": "1 broker, producer and scraper share the machine's cores",
        "partitions": args.partitions,
        "produce_mb_s_median": statistics.median(plain),
        "produce_mb_s_scraped_median": statistics.median(scraped),
        "scraped_over_plain": statistics.median(scraped) / statistics.median(plain),
        # Less sensitive to other load on the machine than MB/s: the broker's own CPU.
        "broker_cpu_s_per_gb_median": statistics.median(cpu[False]),
        "broker_cpu_s_per_gb_scraped_median": statistics.median(cpu[True]),
        "scrapes": len(scrapes),
        "scrape_ms_median": statistics.median(s for s, _ in scrapes) * 1000 if scrapes else None,
        "scrape_bytes_median": statistics.median(b for _, b in scrapes) if scrapes else None,
        "broker_cpu_ms_per_scrape": scrape_cpu_s * 1000,
        "broker_cpu_s_per_s_producing_median": busy_median,
        # The share of produce throughput one scrape every interval takes (docstring).
        "scrape_cost_share": scrape_cpu_s / args.interval / busy_median,
        "scrape_share_of_one_core": scrape_cpu_s / args.interval,
        "load_average_1m": os.getloadavg()[0],
        "runs": args.runs,
        "total_mb": args.total_mb,
        "interval_s": args.interval,
    }
    return result


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--dir", help="create the data directory inside DIR")
    parser.add_argument("--runs", type=int, default=3, help="runs of each mode (3)")
    parser.add_argument("--total-mb", type=int, default=64, help="MB produced per run (64)")
    parser.add_argument("--partitions", type=int, default=1, help="of the topic (1)")
    parser.add_argument("--interval", type=float, default=1.0, help="between scrapes, s (1)")
    parser.add_argument(
        "--cpu-scrapes", type=int, default=200, help="back-to-back scrapes priced (200)"
    )
    parser.add_argument("--quick", action="store_true", help="one small run of each (CI)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_arguments(parser)
    print_result(run(parser.parse_args()))


def print_result(result: dict[str, Any]) -> None:
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
