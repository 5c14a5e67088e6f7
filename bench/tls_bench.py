"""`dmq bench tls` (`python -m bench.tls_bench`): batched produce with TLS on against off.

Two clusters of `--nodes` (1; or 3) real `dmq serve` processes run side by side on
loopback (127.0.0.11, ...), one plain and one with TLS everywhere (the HTTP API, the
broker-to-broker calls and, with 3 nodes, the Raft port), with certificates of
dmq/dev_certs.py (EC P-256). Runs alternate between the two so that both see the same
disk and page cache over time. Each run creates a topic of one partition (replication
factor `--nodes`) and POSTs `--total-mb` of ready binary RecordBatches of 1,000 1 KiB
records to the partition's leader (as dmq.client routes) with acks=all, `--in-flight` (4) requests at once, over one
keep-alive connection pool (aiohttp): what a batching producer does. Printed: the median
MB/s of each mode, their ratio (the issue's target, #20: TLS >= 70% of plaintext), the
brokers' and this client's CPU seconds per produced GB in each mode (steadier than MB/s
when other work shares the machine), the setup and the load average.

The brokers and this client share the machine's cores: say so next to any figure.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import ssl
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp

from bench import main_of
from bench.cluster_bench import (
    Broker,
    create_topic,
    dmq_cluster,
    post_batch,
    wait_leader,
)
from bench.cpu import process_cpu_s
from dmq.client import tls_context
from dmq.dev_certs import write_dev_certs
from log.records import Record, encode_batch

RECORD_BYTES = 1024
BATCH_RECORDS = 1000
TARGET_RATIO_MIN = 0.70  # issue #20: TLS batched produce >= 70% of plaintext


def _batches(total_mb: float, seed: int) -> list[bytes]:
    rng = random.Random(seed)
    count = max(1, int(total_mb * 1_000_000) // (RECORD_BYTES * BATCH_RECORDS))
    return [
        encode_batch([Record(None, rng.randbytes(RECORD_BYTES)) for _ in range(BATCH_RECORDS)])
        for _ in range(count)
    ]


async def _one_run(
    brokers: list[Broker], topic: str, batches: list[bytes], in_flight: int
) -> float:
    """MB/s of one run: every batch POSTed to the partition's leader (as dmq.client
    routes), `in_flight` at once."""
    tls = brokers[0].tls
    connector = aiohttp.TCPConnector(ssl=tls if tls is not None else True)
    timeout = aiohttp.ClientTimeout(total=600)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
        await create_topic(session, brokers[0].url, topic, 1, len(brokers))
        broker = await wait_leader(session, brokers, topic)
        await post_batch(session, broker.url, topic, batches[0])  # warm
        queue = list(batches[1:])

        async def worker() -> None:
            while queue:
                await post_batch(session, broker.url, topic, queue.pop())

        start = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(in_flight)))
        elapsed = time.perf_counter() - start
    return sum(map(len, batches[1:])) / elapsed / 1e6


def _tls_args(certs: Path) -> list[str]:
    return [
        "--tls-cert", str(certs / "broker.pem"), "--tls-key", str(certs / "broker-key.pem"),
        "--tls-ca", str(certs / "ca.pem"),
    ]  # fmt: skip


def run(args: argparse.Namespace) -> dict[str, Any]:
    if args.quick:  # CI: one small run of each mode
        args.runs, args.total_mb = 1, 4.0
    batches = _batches(args.total_mb, seed=1)
    hosts = [f"127.0.0.{11 + k}" for k in range(args.nodes)]
    mb_s: dict[str, list[float]] = {"plain": [], "tls": []}
    cpu: dict[str, list[float]] = {"plain": [], "tls": []}  # brokers' CPU s per GB
    client_cpu: dict[str, list[float]] = {"plain": [], "tls": []}  # this process's
    gb = sum(map(len, batches[1:])) / 1e9
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        work = Path(tmp).resolve()  # absolute: cert paths go to brokers in the tree's root
        certs = write_dev_certs(work / "certs", [*hosts, "127.0.0.1", "localhost"]).ca.parent
        client_tls: ssl.SSLContext = tls_context(str(certs / "ca.pem"))
        with (
            dmq_cluster(work / "plain", args.nodes, args.durability) as plain,
            dmq_cluster(
                work / "tls", args.nodes, args.durability,
                extra_args=_tls_args(certs), tls=client_tls,
            ) as tls,
        ):  # fmt: skip
            clusters = {"plain": plain, "tls": tls}
            for run_index in range(args.runs):
                for mode in ("plain", "tls") if run_index % 2 == 0 else ("tls", "plain"):
                    brokers = clusters[mode]
                    before = sum(process_cpu_s(b.proc.pid) for b in brokers)
                    client_before = time.process_time()
                    mb_s[mode].append(
                        asyncio.run(
                            _one_run(
                                brokers, f"bench-tls-{run_index}", batches, args.in_flight,
                            )
                        )
                    )  # fmt: skip
                    cpu[mode].append(
                        (sum(process_cpu_s(b.proc.pid) for b in brokers) - before) / gb
                    )
                    client_cpu[mode].append((time.process_time() - client_before) / gb)
    plain_mb_s, tls_mb_s = statistics.median(mb_s["plain"]), statistics.median(mb_s["tls"])
    result: dict[str, Any] = {
        "setup": f"{args.nodes} broker(s) and the client share this machine's cores "
        f"({os.cpu_count()}); 1 KiB records, {BATCH_RECORDS}-record batches, acks=all, "
        f"{args.in_flight} in flight, raft durability {args.durability}",
        "nodes": args.nodes,
        "produce_mb_s_plain_median": plain_mb_s,
        "produce_mb_s_tls_median": tls_mb_s,
        "tls_over_plain": tls_mb_s / plain_mb_s,
        "target_tls_over_plain_min": TARGET_RATIO_MIN,
        "broker_cpu_s_per_gb_plain_median": statistics.median(cpu["plain"]),
        "broker_cpu_s_per_gb_tls_median": statistics.median(cpu["tls"]),
        # The client encrypts too (Python's asyncio ssl), on the same cores.
        "client_cpu_s_per_gb_plain_median": statistics.median(client_cpu["plain"]),
        "client_cpu_s_per_gb_tls_median": statistics.median(client_cpu["tls"]),
        "runs": args.runs,
        "total_mb": args.total_mb,
        "load_average": os.getloadavg(),
    }
    print(json.dumps(result, indent=2))
    return result


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--dir", help="create the work directory inside DIR")
    parser.add_argument("--nodes", type=int, default=1, help="brokers per cluster (1; or 3)")
    parser.add_argument("--runs", type=int, default=3, help="runs of each mode (3)")
    parser.add_argument("--total-mb", type=float, default=64.0, help="MB per run (64)")
    parser.add_argument("--in-flight", type=int, default=4, help="concurrent requests (4)")
    parser.add_argument(
        "--durability", default="fsync", choices=("fsync", "none"), help="raft durability"
    )
    parser.add_argument("--quick", action="store_true", help="one small run of each (CI)")


main = main_of(__doc__, add_arguments, run)

if __name__ == "__main__":
    raise SystemExit(main())
