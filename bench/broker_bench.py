"""`dmq bench broker`: a single-node broker measured end to end over HTTP.

Starts a real `dmq serve` process on loopback with a fresh data directory and
measures, for 1 KiB records:

- produce MB/s and records/s through the binary path (ready RecordBatches of 1000
  records, as the Python client sends them) and the JSON path (1000 records/request);
- fetch MB/s through the binary path (raw batches, sendfile);
- p50/p99 latency of single-record acks=all produce at a fixed rate (open loop);
- the baseline, in the same run and directory: PartitionLog.append of the same
  batches, in process, with the broker's default flush policy (fsync per append).

Every figure is the median of --runs runs. The broker and this client share the
machine (2 cores): say so next to any figure quoted from here.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import shutil
import signal
import socket
import statistics
import subprocess
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

import aiohttp

from bench.cluster_bench import RawBody
from bench.memory import memory_state
from bench.tree import start_python
from log.config import FlushPolicy, LogConfig
from log.partition_log import PartitionLog
from log.records import Record, encode_batch

RECORD_BYTES = 1024
BATCH_RECORDS = 1000
BATCH_CONTENT_TYPE = "application/vnd.dmq.batch"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _records(n: int, seed: int) -> list[Record]:
    now = int(time.time() * 1000)
    payload = os.urandom(RECORD_BYTES)
    return [Record(b"key-%012d" % (seed + i), payload, (), now) for i in range(n)]


def _warm_page_cache(directory: Path, nbytes: int) -> None:
    """Write and delete nbytes first: this VM hands idle memory back to the host, and
    the first writes into it run several times slower (see bench/README.md). Both
    the baseline and the broker get the same warm-up."""
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / "warmup"
    chunk = os.urandom(1 << 20)
    with open(path, "wb") as f:
        for _ in range(max(1, nbytes >> 20)):
            f.write(chunk)
    path.unlink()


class Server:
    def __init__(self, data_dir: Path, extra_args: tuple[str, ...] = ()) -> None:
        self.data_dir = data_dir.resolve()  # absolute: the broker runs in the tree's root
        self.extra_args = extra_args  # any path in them absolute, for the same reason
        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc: subprocess.Popen[bytes] | None = None

    def __enter__(self) -> Server:
        self.proc = start_python(  # this tree's broker (bench/tree.py)
            [
                "-m",
                "dmq",
                "serve",
                "--data-dir",
                str(self.data_dir),
                "--http-addr",
                f"127.0.0.1:{self.port}",
                "--raft-addr",
                f"127.0.0.1:{_free_port()}",
                "--log-level",
                "warning",
                *self.extra_args,
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:  # listening comes first; ready once it joined its one-node cluster
                with urllib.request.urlopen(self.url + "/readyz", timeout=1):  # noqa: S310 - http://127.0.0.1
                    return self
            except OSError:
                time.sleep(0.05)
        raise RuntimeError("dmq serve did not start")

    def __exit__(self, *exc: object) -> None:
        if self.proc is not None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


async def _create(session: aiohttp.ClientSession, url: str, topic: str) -> None:
    async with session.post(f"{url}/v1/topics", json={"name": topic, "partitions": 1}) as r:
        await r.read()


async def _produce_binary(
    session: aiohttp.ClientSession, url: str, topic: str, batches: list[bytes], concurrency: int
) -> float:
    queue = list(batches)

    async def worker() -> None:
        while queue:
            batch = queue.pop()
            async with session.post(
                f"{url}/v1/topics/{topic}/records?partition=0",
                data=RawBody(batch, BATCH_CONTENT_TYPE),
            ) as r:
                if r.status != 200:
                    raise RuntimeError(await r.text())
                await r.read()

    start = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return time.perf_counter() - start


async def _produce_json(
    session: aiohttp.ClientSession, url: str, topic: str, requests: int, concurrency: int
) -> float:
    value = "x" * RECORD_BYTES
    body = json.dumps(
        {"records": [{"key": f"k{i}", "value": value} for i in range(BATCH_RECORDS)]}
    ).encode()
    remaining = [requests]

    async def worker() -> None:
        while remaining[0] > 0:
            remaining[0] -= 1
            async with session.post(
                f"{url}/v1/topics/{topic}/records?partition=0",
                data=RawBody(body, "application/json"),
                headers={"Content-Type": "application/json"},
            ) as r:
                if r.status != 200:
                    raise RuntimeError(await r.text())
                await r.read()

    start = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return time.perf_counter() - start


async def _fetch_binary(
    session: aiohttp.ClientSession, url: str, topic: str, end_offset: int
) -> tuple[float, int]:
    offset = 0
    total = 0
    start = time.perf_counter()
    while offset < end_offset:
        async with session.get(
            f"{url}/v1/topics/{topic}/partitions/0/records",
            params={"offset": offset, "format": "binary", "max_bytes": 4 * 1024 * 1024},
        ) as r:
            total += len(await r.read())
            offset = int(r.headers["X-Dmq-Next-Offset"])
    return time.perf_counter() - start, total


async def _latency(
    session: aiohttp.ClientSession, url: str, topic: str, rate: int, seconds: float
) -> list[float]:
    count = int(rate * seconds)
    batch = encode_batch(_records(1, 0))
    latencies: list[float] = []
    start = time.perf_counter()

    async def one(i: int) -> None:
        delay = start + i / rate - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        sent = time.perf_counter()
        async with session.post(
            f"{url}/v1/topics/{topic}/records?partition=0&acks=all",
            data=batch,
            headers={"Content-Type": BATCH_CONTENT_TYPE},
        ) as r:
            await r.read()
        latencies.append(time.perf_counter() - sent)

    await asyncio.gather(*(one(i) for i in range(count)))
    return latencies


def baseline_append(directory: Path, batches: list[bytes]) -> float:
    """MB/s of PartitionLog.append of the same batches, fsync per append (the broker's default)."""
    _warm_page_cache(directory.parent, sum(len(b) for b in batches))
    log = PartitionLog.open(directory, LogConfig(flush=FlushPolicy(interval_records=1)))
    start = time.perf_counter()
    for b in batches:
        log.append(b)
    elapsed = time.perf_counter() - start
    log.close()
    return sum(len(b) for b in batches) / elapsed / 1e6


async def _one_run(
    url: str, run: int, batches: list[bytes], json_requests: int, rate: int, latency_s: float
) -> dict[str, float]:
    timeout = aiohttp.ClientTimeout(total=120)
    async with aiohttp.ClientSession(timeout=timeout) as session:
        topics = {kind: f"bench-{kind}-{run}" for kind in ("bin", "json", "lat")}
        for t in topics.values():
            await _create(session, url, t)
        elapsed = await _produce_binary(session, url, topics["bin"], batches, concurrency=4)
        total_bytes = sum(len(b) for b in batches)
        records = len(batches) * BATCH_RECORDS
        json_elapsed = await _produce_json(
            session, url, topics["json"], json_requests, concurrency=4
        )
        fetch_elapsed, fetched = await _fetch_binary(session, url, topics["bin"], records)
        # Warm up first: the client opens its connections during the first requests.
        await _latency(session, url, topics["lat"], rate, min(1.0, latency_s))
        lat = sorted(await _latency(session, url, topics["lat"], rate, latency_s))
    return {
        "binary_produce_mb_s": total_bytes / elapsed / 1e6,
        "binary_produce_records_s": records / elapsed,
        "json_produce_records_s": json_requests * BATCH_RECORDS / json_elapsed,
        "json_produce_mb_s": json_requests * BATCH_RECORDS * RECORD_BYTES / json_elapsed / 1e6,
        "binary_fetch_mb_s": fetched / fetch_elapsed / 1e6,
        "latency_p50_ms": lat[len(lat) // 2] * 1000,
        "latency_p99_ms": lat[min(len(lat) - 1, int(len(lat) * 0.99))] * 1000,
    }


async def _relaxed_latency(url: str, rate: int, latency_s: float) -> dict[str, float]:
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=120)) as session:
        await _create(session, url, "bench-relaxed")
        await _latency(session, url, "bench-relaxed", rate, min(1.0, latency_s))
        lat = sorted(await _latency(session, url, "bench-relaxed", rate, latency_s))
    return {
        "relaxed_latency_p50_ms": lat[len(lat) // 2] * 1000,
        "relaxed_latency_p99_ms": lat[min(len(lat) - 1, int(len(lat) * 0.99))] * 1000,
    }


def run(args: argparse.Namespace) -> dict[str, Any]:
    quick = bool(getattr(args, "quick", False))
    runs = 1 if quick else int(getattr(args, "runs", 3))
    total_mb = 8 if quick else int(getattr(args, "total_mb", 128))
    rate = int(getattr(args, "rate", 500))
    latency_s = 1.0 if quick else float(getattr(args, "latency_seconds", 5.0))
    n_batches = max(1, total_mb * 1024 * 1024 // (BATCH_RECORDS * RECORD_BYTES))
    batches = [encode_batch(_records(BATCH_RECORDS, i * BATCH_RECORDS)) for i in range(n_batches)]
    json_requests = max(4, n_batches // 4)
    base = Path(getattr(args, "dir", None) or tempfile.mkdtemp(prefix="dmq-bench-", dir="."))
    base.mkdir(parents=True, exist_ok=True)
    print("dmq bench broker: single node over HTTP on loopback")
    print(
        f"  python {platform.python_version()}, {os.cpu_count()} cores shared by broker and client; "
        f"{memory_state()}"
    )
    print(
        f"  data dir {base.resolve()}, records {RECORD_BYTES} B, {BATCH_RECORDS} per batch/request, "
        f"{n_batches} batches/run, {runs} runs, latency at {rate} req/s for {latency_s:.0f} s"
    )
    samples: dict[str, list[float]] = {}
    try:
        for run_index in range(runs):
            samples.setdefault("log_append_mb_s", []).append(
                baseline_append(base / f"baseline-{run_index}", batches)
            )
            _warm_page_cache(base, sum(len(b) for b in batches))
            with Server(base / f"broker-{run_index}") as server:
                result = asyncio.run(
                    _one_run(server.url, run_index, batches, json_requests, rate, latency_s)
                )
            # The same latency run with relaxed durability (the Raft journal is written
            # but not fsynced before the answer), to show what the fsync costs.
            relaxed = ("--raft-durability", "none")
            with Server(base / f"relaxed-{run_index}", relaxed) as server:
                result.update(asyncio.run(_relaxed_latency(server.url, rate, latency_s)))
            for k, v in result.items():
                samples.setdefault(k, []).append(v)
    finally:
        if getattr(args, "dir", None) is None:
            shutil.rmtree(base, ignore_errors=True)
    medians = {k: statistics.median(v) for k, v in samples.items()}
    ratio = medians["binary_produce_mb_s"] / medians["log_append_mb_s"]
    print(f"\n{'figure':38} {'median':>12}")
    for k, v in medians.items():
        print(f"{k:38} {v:12.1f}")
    checks = [
        (f"binary produce >= 50% of log append (fsync/append): {ratio:.0%}", ratio >= 0.5),
        (
            f"JSON produce >= 50k records/s: {medians['json_produce_records_s']:.0f}",
            medians["json_produce_records_s"] >= 50_000,
        ),
        (
            f"binary fetch >= 300 MB/s: {medians['binary_fetch_mb_s']:.0f}",
            medians["binary_fetch_mb_s"] >= 300,
        ),
        (
            f"single-record p99 < 5 ms at {rate} req/s, fsync before each answer: "
            f"{medians['latency_p99_ms']:.2f} ms",
            medians["latency_p99_ms"] < 5.0,
        ),
        (
            f"single-record p99 < 5 ms at {rate} req/s, raft durability none: "
            f"{medians['relaxed_latency_p99_ms']:.2f} ms",
            medians["relaxed_latency_p99_ms"] < 5.0,
        ),
    ]
    print()
    for text, ok in checks:
        print(f"  {'PASS' if ok else 'FAIL'}  {text}")
    return {
        "medians": medians,
        "samples": samples,
        "produce_vs_log_append": ratio,
        "checks": {text: ok for text, ok in checks},
    }


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--dir", help="data directory (default: a temp dir here, removed after)")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--total-mb", type=int, default=128, help="MB produced per run")
    parser.add_argument("--rate", type=int, default=500, help="single-record requests/s")
    parser.add_argument("--latency-seconds", type=float, default=5.0)
    parser.add_argument("--quick", action="store_true", help="one small run (CI)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    add_arguments(parser)
    run(parser.parse_args())


if __name__ == "__main__":
    main()
