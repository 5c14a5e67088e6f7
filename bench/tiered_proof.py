"""`dmq bench tiered --proof`: issue #19's proof figure, on a 3-node cluster.

"2 GiB written to a topic with local_retention_bytes 64 MiB: local disk stays under ~3
segments, every offset from 0 reads back byte-identical, a broker restarted on an empty
disk serves the whole range", as a Kafka or Redpanda operator would check it:

1. three `dmq serve` on loopback sharing one `file://` object store (as brokers share a
   bucket), `--raft-snapshot-entries 256` (the Raft journal is local disk too: a
   snapshot drops what it holds); a topic of one partition, replication factor 3,
   `remote_storage_enable`, `local_retention_bytes` `--local-retention-mb` (64) and
   segments of half that (so "~3 segments" is local retention plus the active one);
2. `--total-mb` of 1 KiB records produced (binary batches of 256, acks=all, 4 requests
   in flight), each record's value its own number and a fixed pad; meanwhile every
   0.5 s each broker's partition directory (segments, indexes, manifest) and the
   partition's Raft group directory (journal, snapshot) are measured: the maximum of
   each, per broker;
3. uploads catch up (the manifest reaches the last closed segment) and local retention
   trims every replica;
4. a follower (not the metadata leader when there is a choice) is killed (-9), its
   partition directory and its partition's Raft group directory deleted: the disk
   holds nothing of the partition. Its whole data directory is not wiped: every broker
   of a 3-node cluster is a metadata voter, and a Raft voter that forgets its term and
   vote may vote twice in one term (dmq/README.md, "Cluster identity": a directory
   without `meta.properties` is a new broker). Restarted, it installs the leader's
   snapshot (the manifest comes with it) and copies only the leader's local tail:
   seconds until its manifest equals the leader's, bytes it holds locally;
5. it is made the partition's leader (a leadership transfer, the internal route leader
   balancing and reassignments use, signed with the cluster secret as a broker signs
   it), and every offset from 0 is read from it
   (binary fetch, 4 MiB per request): offsets dense from 0 to the high watermark, each
   record's value byte-identical to what was sent, each number exactly once. Most of it
   comes from the object store through its chunk cache.

Every process started is killed and the work directory deleted before it returns.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import platform
import shutil
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp

from bench.cluster_bench import (
    Broker,
    ClusterError,
    dmq_cluster,
    json_request,
    post_batch,
    wait_leader,
)
from dmq.internal_auth import read_secret_file, signed_headers
from dmq.partition.replica import GROUPS_PER_TOPIC
from log.records import Record, decode_batch, encode_batch, iter_batches

TOPIC = "proof"
RECORD_BYTES = 1024
ID_BYTES = 10  # the record's number, ASCII, then the pad
BATCH_RECORDS = 256
IN_FLIGHT = 4
SAMPLE_S = 0.5
CATCH_UP_S = 600.0
RESTORE_S = 300.0
LEADER_S = 120.0
READ_BYTES = 4 * 1024 * 1024


def _batch(k: int, pad: bytes, now_ms: int) -> bytes:
    first = k * BATCH_RECORDS
    return encode_batch(
        [Record(None, b"%010d" % (first + j) + pad, (), now_ms) for j in range(BATCH_RECORDS)]
    )


def _tree_bytes(directory: Path) -> int:
    total = 0
    for root, _, files in os.walk(directory):
        for name in files:
            with contextlib.suppress(FileNotFoundError):  # deleted by retention meanwhile
                total += os.stat(os.path.join(root, name)).st_size
    return total


class Disk:
    """The partition's and its Raft group's bytes on each broker's disk, sampled."""

    def __init__(self, work: Path, brokers: list[Broker], group_id: str) -> None:
        self.dirs = {
            b.node_id: (
                work / b.node_id / "partitions" / f"{TOPIC}-0",
                work / b.node_id / "raft" / "groups" / group_id,
            )
            for b in brokers
        }
        self.max_log = dict.fromkeys(self.dirs, 0)
        self.max_raft = dict.fromkeys(self.dirs, 0)

    def now(self) -> dict[str, tuple[int, int]]:
        return {n: (_tree_bytes(p), _tree_bytes(g)) for n, (p, g) in self.dirs.items()}

    def sample(self) -> None:
        for node, (log_bytes, raft_bytes) in self.now().items():
            self.max_log[node] = max(self.max_log[node], log_bytes)
            self.max_raft[node] = max(self.max_raft[node], raft_bytes)

    async def watch(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            await asyncio.to_thread(self.sample)
            await asyncio.sleep(SAMPLE_S)


async def _partition(session: aiohttp.ClientSession, url: str) -> dict[str, Any]:
    return dict((await json_request(session, "GET", f"{url}/v1/topics/{TOPIC}"))["partitions"][0])


async def _produce(
    session: aiohttp.ClientSession, url: str, batches: int, pad: bytes
) -> tuple[float, int]:
    """Every batch, IN_FLIGHT at once; (seconds, bytes sent)."""
    numbers: Iterator[int] = iter(range(batches))
    sent = 0
    now_ms = int(time.time() * 1000)

    async def worker() -> None:
        nonlocal sent
        for k in numbers:
            batch = _batch(k, pad, now_ms)
            await post_batch(session, url, TOPIC, batch)
            sent += len(batch)

    began = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(IN_FLIGHT)))
    return time.perf_counter() - began, sent


async def _read_all(
    session: aiohttp.ClientSession, url: str, end: int, pad: bytes
) -> tuple[float, int]:
    """Every offset from 0 to end, checked (module docstring, step 5); (seconds, bytes)."""
    seen = bytearray(end)
    offset, total = 0, 0
    began = time.perf_counter()
    while offset < end:
        async with session.get(
            f"{url}/v1/topics/{TOPIC}/partitions/0/records",
            params={"offset": offset, "format": "binary", "max_bytes": READ_BYTES},
        ) as r:
            if r.status != 200:
                raise ClusterError(f"read at {offset}: {r.status} {await r.text()}")
            data = await r.read()
        total += len(data)
        for pos, header in iter_batches(data):
            for record in decode_batch(memoryview(data)[pos : pos + header.size_bytes]).records:
                value = record.value or b""
                number = int(value[:ID_BYTES])
                if record.offset != offset or value[ID_BYTES:] != pad or seen[number]:
                    raise ClusterError(
                        f"offset {record.offset} (expected {offset}): {value[:40]!r}"
                    )
                seen[number] = 1
                offset += 1
    if offset != end or not all(seen):
        raise ClusterError(f"read up to {offset} of {end}; numbers missing: {seen.count(0)}")
    return time.perf_counter() - began, total


async def _make_leader(
    session: aiohttp.ClientSession,
    brokers: list[Broker],
    target: Broker,
    group_id: int,
    secret: bytes,
) -> float:
    """The partition's leadership handed to `target` (the internal transfer route the
    brokers' own leader balancing and reassignments use, signed with the cluster secret);
    seconds until it leads."""
    topic_id = group_id // GROUPS_PER_TOPIC
    began, answer = time.monotonic(), ""
    while time.monotonic() - began < LEADER_S:
        leader = await wait_leader(session, brokers, TOPIC)
        if leader is target:
            return time.monotonic() - began
        path = f"/v1/internal/partitions/{TOPIC}/0/transfer?topic_id={topic_id}"
        body = json.dumps({"target": target.node_id}).encode()
        headers = {"Content-Type": "application/json", **signed_headers(secret, "POST", path, body)}
        with contextlib.suppress(aiohttp.ClientError):
            async with session.post(leader.url + path, data=body, headers=headers) as r:
                answer = f"{r.status} {(await r.read())[:200]!r}"
        await asyncio.sleep(1.0)
    raise ClusterError(f"{target.node_id} not the leader in {LEADER_S:.0f} s; transfer: {answer}")


async def _prove(work: Path, brokers: list[Broker], args: argparse.Namespace) -> dict[str, Any]:
    retention = args.local_retention_mb * 1024 * 1024
    segment = retention // 2
    batches = max(1, args.total_mb * 1024 * 1024 // (RECORD_BYTES * BATCH_RECORDS))
    end = batches * BATCH_RECORDS
    pad = os.urandom((RECORD_BYTES - ID_BYTES) // 2 + 1).hex().encode()[: RECORD_BYTES - ID_BYTES]
    timeout = aiohttp.ClientTimeout(total=120)
    async with aiohttp.ClientSession(timeout=timeout) as session:
        url = brokers[0].url
        config = {
            "segment_bytes": segment, "remote_storage_enable": True,
            "local_retention_bytes": retention,
        }  # fmt: skip
        body = {"name": TOPIC, "partitions": 1, "replication_factor": 3, "config": config}
        await json_request(session, "POST", f"{url}/v1/topics", body)
        leader = await wait_leader(session, brokers, TOPIC)
        status = await json_request(session, "GET", f"{url}/v1/cluster/status")
        group = next(g for g in status["groups"] if g.get("topic") == TOPIC)
        group_id = int(group["group_id"])
        disk = Disk(work, brokers, str(group_id))
        stop = asyncio.Event()
        watcher = asyncio.create_task(disk.watch(stop))
        produce_s, sent = await _produce(session, leader.url, batches, pad)
        began = time.monotonic()
        while True:  # uploads reach the last closed segment, local retention trims
            p = await _partition(session, leader.url)
            uploaded = (p["remote_end_offset"] or 0) >= end - segment // RECORD_BYTES
            sizes = disk.now()
            trimmed = all(s[0] <= retention + 2 * segment for s in sizes.values())
            if uploaded and trimmed:
                break
            if time.monotonic() - began > CATCH_UP_S:
                raise ClusterError(f"uploads or retention did not catch up: {p} {sizes}")
            await asyncio.sleep(0.5)
        catch_up_s = time.monotonic() - began
        stop.set()
        await watcher
        at_rest = disk.now()

        meta = (await json_request(session, "GET", f"{url}/v1/cluster/status")).get("metadata", {})
        followers = [b for b in brokers if b is not leader]
        wiped = next((b for b in followers if b.node_id != meta.get("leader")), followers[0])
        wiped.kill()
        partition_dir, group_dir = disk.dirs[wiped.node_id]
        shutil.rmtree(partition_dir)
        shutil.rmtree(group_dir)
        began = time.monotonic()
        wiped.restart()
        mine, theirs = partition_dir / "remote-manifest", disk.dirs[leader.node_id][0]
        while not (
            mine.exists()
            and mine.read_bytes() == (theirs / "remote-manifest").read_bytes()
            and (partition_dir / "log-start-offset").exists()
        ):
            if not wiped.alive():
                raise ClusterError(f"{wiped.node_id} exited while restoring")
            if time.monotonic() - began > RESTORE_S:
                found = (
                    sorted(p.name for p in partition_dir.glob("*"))
                    if partition_dir.exists()
                    else None
                )
                raise ClusterError(f"{wiped.node_id} did not restore in {RESTORE_S:.0f} s: {found}")
            await asyncio.sleep(0.2)
        restore_s = time.monotonic() - began
        restored = disk.now()[wiped.node_id]
        local_start = int((partition_dir / "log-start-offset").read_text())
        secret = read_secret_file(str(work / "cluster-secret"))
        assert secret is not None
        lead_s = await _make_leader(session, brokers, wiped, group_id, secret)
        before = await _remote_read_bytes(session, wiped.url)
        read_s, read_bytes = await _read_all(session, wiped.url, end, pad)
        from_store = await _remote_read_bytes(session, wiped.url) - before
        cache = _tree_bytes(work / wiped.node_id / "remote-cache")
    return {
        "records": end,
        "sent_bytes": sent,
        "produce_s": produce_s,
        "catch_up_s": catch_up_s,
        "segment_bytes": segment,
        "local_retention_bytes": retention,
        "max_log_bytes": disk.max_log,
        "max_raft_bytes": disk.max_raft,
        "at_rest": at_rest,
        "wiped": wiped.node_id,
        "restore_s": restore_s,
        "restored_bytes": restored,
        "restored_local_start": local_start,
        "lead_s": lead_s,
        "read_s": read_s,
        "read_bytes": read_bytes,
        "read_from_store_bytes": from_store,
        "cache_bytes": cache,
        "store_bytes": _tree_bytes(work / "store"),
    }


async def _remote_read_bytes(session: aiohttp.ClientSession, url: str) -> float:
    async with session.get(f"{url}/metrics") as r:
        text = await r.text()
    for line in text.splitlines():
        name, _, value = line.partition(" ")
        if name == "dmq_tiered_remote_read_bytes_total":
            return float(value)
    return 0.0


def run(args: argparse.Namespace) -> dict[str, Any]:
    # Absolute: the store's URL goes to brokers running in the tree's root (bench/tree.py).
    work = Path(tempfile.mkdtemp(prefix="dmq-bench-tiered-proof-", dir=args.dir)).resolve()
    began = time.monotonic()
    try:
        extra = (
            "--remote-storage", f"file://{work / 'store'}",
            "--remote-upload-interval-ms", "500",
            "--retention-check-interval-ms", "1000",
            "--raft-snapshot-entries", str(args.snapshot_entries),
            "--fetch-bytes-max", str(8 * 1024 * 1024),
        )  # fmt: skip
        with dmq_cluster(work, 3, "fsync", extra_args=extra) as brokers:
            found = asyncio.run(_prove(work, brokers, args))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    found["wall_s"] = time.monotonic() - began
    load = os.getloadavg()
    found["load"] = load
    mib = 1024 * 1024
    print(
        f"dmq bench tiered --proof: 3 nodes and this client share {os.cpu_count()} cores "
        f"({platform.python_implementation()} {platform.python_version()}); file:// store "
        f"shared, on the data disk; RF 3; {args.total_mb} MB of 1 KiB records; segments "
        f"{found['segment_bytes'] // mib} MiB, local retention "
        f"{found['local_retention_bytes'] // mib} MiB; load average "
        f"{load[0]:.2f} {load[1]:.2f} {load[2]:.2f}"
    )
    print(
        f"  produced {found['records']} records, {found['sent_bytes'] / mib:.0f} MiB in "
        f"{found['produce_s']:.0f} s ({found['sent_bytes'] / 1e6 / found['produce_s']:.1f} MB/s); "
        f"uploads and retention caught up {found['catch_up_s']:.0f} s later; store "
        f"{found['store_bytes'] / mib:.0f} MiB"
    )
    for node in sorted(found["max_log_bytes"]):
        log_now, raft_now = found["at_rest"][node]
        print(
            f"  {node}: partition dir at most {found['max_log_bytes'][node] / mib:.0f} MiB "
            f"({found['max_log_bytes'][node] / found['segment_bytes']:.1f} segments; at rest "
            f"{log_now / mib:.0f} MiB), Raft group dir at most "
            f"{found['max_raft_bytes'][node] / mib:.0f} MiB (at rest {raft_now / mib:.0f} MiB)"
        )
    print(
        f"  {found['wiped']} wiped (partition and Raft group dirs) and restarted: restored in "
        f"{found['restore_s']:.1f} s, local start {found['restored_local_start']}, "
        f"{found['restored_bytes'][0] / mib:.0f} MiB local; leader after "
        f"{found['lead_s']:.1f} s"
    )
    print(
        f"  read from it, offsets 0..{found['records'] - 1}: {found['read_bytes'] / mib:.0f} MiB "
        f"in {found['read_s']:.0f} s, {found['read_from_store_bytes'] / mib:.0f} MiB from the "
        f"store (its chunk cache then {found['cache_bytes'] / mib:.0f} MiB); every value "
        f"byte-identical, each once; wall {found['wall_s']:.0f} s"
    )
    return found
