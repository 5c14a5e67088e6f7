"""`dmq bench tiered`: tiered storage's costs, against the same broker without it, same run.

One real `dmq serve` (one node, loopback) with `--remote-storage file://<work>/store`
(the embedded backend, on the same disk as the data directory). Each run:

1. produce `--total-mb` of 1 KiB records in binary batches (4 requests in flight) to a
   topic without tiered storage: the baseline MB/s;
2. the same to a topic with `remote_storage_enable`, `--segment-mb` segments and
   `local_retention_bytes` of two segments: uploads run while it is produced. The ratio
   to (1) is the figure the issue asks >= 80% of;
3. upload MB/s: bytes uploaded during (2) and until the manifest reached the last closed
   segment, over the time spent in puts (/metrics `dmq_tiered_upload_*`: one upload
   stream's rate; two run at once). The broker's bandwidth limit is raised to 1 GiB/s for
   this: the figure is what the upload path does, not the limit;
4. read back every offset with the binary fetch: the part below the local log start
   comes from the object store through the chunk cache (cold: a new topic each run),
   the rest from local segments (sendfile): MB/s of each, and their ratio.

Medians over `--runs`. The broker, its uploads and this client share the machine's cores
(2 here): produce and read figures include that contention. file:// reads mostly hit the
page cache, so the cold read prices the remote read path (ranged reads, chunk files, CRC
checks, copying into the answer), not a network; an S3 store adds its round trips.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import shutil
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp

from bench import main_of
from bench.broker_bench import Server, _produce_binary
from bench.cluster_bench import json_request
from log.records import Record, encode_batch

# --proof: ~64 MiB of 256 KiB entries per journal between snapshots.
SNAPSHOT_ENTRIES = 256

RECORD_BYTES = 1024
BATCH_RECORDS = 256  # ~256 KiB per produce request
IN_FLIGHT = 4


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--dir", help="create the work directory inside DIR")
    parser.add_argument("--runs", type=int, default=3, help="runs; medians are shown (3)")
    parser.add_argument("--total-mb", type=int, default=128, help="MB produced per topic (128)")
    parser.add_argument("--segment-mb", type=int, default=8, help="segment_bytes, MiB (8)")
    parser.add_argument("--quick", action="store_true", help="one small run (CI)")
    parser.add_argument(
        "--proof",
        action="store_true",
        help="issue #19's proof instead: 3 nodes, --total-mb written, local disk bounded, a "
        "follower wiped and restarted serves every offset from 0",
    )
    parser.add_argument(
        "--local-retention-mb", type=int, default=64, help="--proof: local retention, MiB (64)"
    )
    parser.add_argument(
        "--snapshot-entries",
        type=int,
        default=SNAPSHOT_ENTRIES,
        help=f"--proof: the brokers' --raft-snapshot-entries ({SNAPSHOT_ENTRIES}); a wiped "
        "follower restores from a snapshot only once one was taken",
    )


def _batches(total_bytes: int) -> list[bytes]:
    value = os.urandom(RECORD_BYTES // 2).hex().encode()
    count = max(1, total_bytes // (RECORD_BYTES * BATCH_RECORDS))
    now_ms = int(time.time() * 1000)  # within time retention: only size decides here
    return [
        encode_batch(
            [Record(key=None, value=value, timestamp_ms=now_ms) for _ in range(BATCH_RECORDS)]
        )
        for _ in range(count)
    ]


async def _read(
    session: aiohttp.ClientSession, url: str, topic: str, start: int, end: int
) -> tuple[float, int]:
    offset, total = start, 0
    began = time.perf_counter()
    while offset < end:
        async with session.get(
            f"{url}/v1/topics/{topic}/partitions/0/records",
            params={"offset": offset, "format": "binary", "max_bytes": 4 * 1024 * 1024},
        ) as r:
            if r.status != 200:
                raise RuntimeError(await r.text())
            total += len(await r.read())
            offset = int(r.headers["X-Dmq-Next-Offset"])
    return time.perf_counter() - began, total


async def _metrics(session: aiohttp.ClientSession, url: str) -> dict[str, float]:
    async with session.get(f"{url}/metrics") as r:
        text = await r.text()
    return {
        name: float(value)
        for name, _, value in (line.partition(" ") for line in text.splitlines())
        if name.startswith("dmq_tiered_")
    }


async def _partition(session: aiohttp.ClientSession, url: str, topic: str) -> dict[str, Any]:
    return dict((await json_request(session, "GET", f"{url}/v1/topics/{topic}"))["partitions"][0])


async def _one_run(
    url: str, data_dir: Path, run: int, args: argparse.Namespace
) -> dict[str, float]:
    segment = args.segment_mb * 1024 * 1024
    batches = _batches(args.total_mb * 1024 * 1024)
    produced = sum(len(b) for b in batches) / 1e6
    async with aiohttp.ClientSession() as session:
        plain, tiered = f"plain-{run}", f"tiered-{run}"
        await json_request(session, "POST", f"{url}/v1/topics", {
            "name": plain, "partitions": 1, "config": {"segment_bytes": segment},
        })  # fmt: skip
        await json_request(session, "POST", f"{url}/v1/topics", {
            "name": tiered, "partitions": 1, "config": {
                "segment_bytes": segment, "remote_storage_enable": True,
                "local_retention_bytes": 2 * segment,
            },
        })  # fmt: skip
        plain_s = await _produce_binary(session, url, plain, batches, IN_FLIGHT)
        before = await _metrics(session, url)
        began = time.perf_counter()
        tiered_s = await _produce_binary(session, url, tiered, batches, IN_FLIGHT)
        # The manifest reaches the last closed segment: the active one is never uploaded.
        while True:
            p = await _partition(session, url, tiered)
            if (p["remote_end_offset"] or 0) > 0 and p["high_watermark"] - (
                p["remote_end_offset"] or 0
            ) <= segment // (RECORD_BYTES + 16) + BATCH_RECORDS:
                break
            if time.perf_counter() - began > 600:
                raise RuntimeError(f"uploads did not catch up: {p}")
            await asyncio.sleep(0.05)
        after = await _metrics(session, url)
        uploaded = (
            after["dmq_tiered_uploaded_bytes_total"] - before["dmq_tiered_uploaded_bytes_total"]
        )
        upload_s = (
            after["dmq_tiered_upload_seconds_total"] - before["dmq_tiered_upload_seconds_total"]
        )
        # Local retention runs every 200 ms: wait for it, so the local log is the tail.
        while (p := await _partition(session, url, tiered))["local_bytes"] > 4 * segment:
            await asyncio.sleep(0.05)
        hw = p["high_watermark"]
        local_start = _local_start(data_dir, tiered)
        cold_s, cold_bytes = await _read(session, url, tiered, 0, local_start)
        local_s, local_bytes = await _read(session, url, tiered, local_start, hw)
    return {
        "produce_plain_mb_s": produced / plain_s,
        "produce_tiered_mb_s": produced / tiered_s,
        "produce_ratio": plain_s / tiered_s,
        "upload_mb_s": uploaded / 1e6 / upload_s,
        "cold_read_mb_s": cold_bytes / 1e6 / cold_s,
        "local_read_mb_s": local_bytes / 1e6 / local_s,
        "remote_mb": cold_bytes / 1e6,
        "local_mb": local_bytes / 1e6,
    }


def _local_start(data_dir: Path, topic: str) -> int:
    """The local log start of the partition: its log's checkpoint file (log/README.md)."""
    directory = next((data_dir / "partitions").glob(f"{topic}-0*"))
    return int((directory / "log-start-offset").read_text())


def run(args: argparse.Namespace) -> dict[str, Any]:
    if args.proof:
        from bench import tiered_proof

        return tiered_proof.run(args)
    if args.quick:
        args.runs, args.total_mb, args.segment_mb = 1, 8, 1
    # Absolute: the store's URL goes to a broker running in the tree's root (bench/tree.py).
    work = Path(tempfile.mkdtemp(prefix="dmq-bench-tiered-", dir=args.dir)).resolve()
    try:
        extra = (
            "--remote-storage", f"file://{work / 'store'}",
            "--remote-upload-interval-ms", "200",
            "--remote-upload-bytes-per-s", str(1024**3),
            "--retention-check-interval-ms", "200",
            "--fetch-bytes-max", str(8 * 1024 * 1024),
        )  # fmt: skip
        with Server(work / "data", extra) as server:
            runs = [
                asyncio.run(_one_run(server.url, work / "data", i, args)) for i in range(args.runs)
            ]
    finally:
        shutil.rmtree(work, ignore_errors=True)
    medians = {k: statistics.median(r[k] for r in runs) for k in runs[0]}
    load = os.getloadavg()
    print(
        f"dmq bench tiered: 1 broker and this client share {os.cpu_count()} cores "
        f"({platform.python_implementation()} {platform.python_version()}); file:// store "
        f"on the data disk; {args.total_mb} MB of 1 KiB records per topic, "
        f"{args.segment_mb} MiB segments, local retention 2 segments; "
        f"medians of {args.runs} runs; load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}"
    )
    m = medians
    print(f"  produce, no tiered storage   {m['produce_plain_mb_s']:8.1f} MB/s")
    print(
        f"  produce, uploads running     {m['produce_tiered_mb_s']:8.1f} MB/s "
        f"({100 * m['produce_ratio']:.0f}% of the baseline; target >= 80%)"
    )
    print(f"  upload                       {m['upload_mb_s']:8.1f} MB/s")
    print(
        f"  cold read from the store     {m['cold_read_mb_s']:8.1f} MB/s "
        f"({m['remote_mb']:.0f} MB; {m['cold_read_mb_s'] / m['local_read_mb_s']:.2f}x local)"
    )
    print(
        f"  local read (sendfile)        {m['local_read_mb_s']:8.1f} MB/s ({m['local_mb']:.0f} MB)"
    )
    return {"runs": runs, "medians": medians}


main = main_of(__doc__, add_arguments, run)
