"""A full disk in a cluster (issue #28), with real `dmq serve` processes and n3's data
directory on a small tmpfs (mounted by the test: root only, skipped otherwise).

Proves: with n3's disk filled below its floor by another process while n3 leads a
partition, n3 hands the leadership to a broker with space within seconds; from then on
produce with acks=all keeps succeeding on the other two (n3 stops acknowledging and
applies nothing); n3 does not exit and reports "full" in the cluster status (and in
`dmq cluster status`); once the space is freed n3 catches up by itself (no restart) and
holds every acknowledged record, at the offsets its acknowledgement gave, byte-identical
to the others.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from cluster_harness import DmqCluster, fetch_all, wait_caught_up, wait_for, wait_identical_segments

TMPFS_MIB = 16  # default floor: 5% = 0.8 MiB


def mount_tmpfs(path: Path, size_mib: int) -> None:
    path.mkdir(parents=True, exist_ok=True)
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size_mib}m", "tmpfs", str(path)],
        capture_output=True,
        check=False,
    )
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs (needs root): {done.stderr.decode().strip()}")


def fill(path: Path, leave_bytes: int) -> Path:
    filler = path / "filler"
    with open(filler, "wb") as f:
        while True:
            st = os.statvfs(path)
            free = st.f_bavail * st.f_frsize
            if free <= leave_bytes:
                return filler
            f.write(b"\0" * min(256 * 1024, max(4096, free - leave_bytes)))
            f.flush()


def storage_of(cluster: DmqCluster, node_id: str) -> dict[str, Any]:
    status = cluster.any_live().json("GET", "/v1/cluster/status")
    broker = next(b for b in status["brokers"] if b["node_id"] == node_id)
    return broker.get("storage_status") or {}


def test_a_full_follower_stops_acknowledging_and_catches_up_when_space_returns(
    dmq_cluster: Callable[..., DmqCluster], tmp_path: Path
) -> None:
    disk = tmp_path / "n3-disk"
    mount_tmpfs(disk, TMPFS_MIB)
    try:
        cluster = dmq_cluster(3)
        n3 = cluster["n3"]
        args = n3.args
        args[args.index("--data-dir") + 1] = str(disk / "data")
        n3.data_dir = disk / "data"
        cluster.start_all()
        cluster.create_topic("full", partitions=1, replication_factor=3)
        topic_id = 1  # the cluster's first topic (ids start at 1)
        n1 = cluster["n1"]
        acked: dict[int, str] = {}

        def produce_one(tag: str) -> int:
            records = [{"value": f"{tag}-{k}", "partition": 0} for k in range(50)]
            resp = n1.request("POST", "/v1/topics/full/records?acks=all", {"records": records})
            if resp.status == 200:
                offsets = [item["offset"] for item in resp.json()["offsets"]]
                for k, offset in enumerate(offsets):
                    acked[offset] = f"{tag}-{k}"
            return resp.status

        for k in range(5):
            assert produce_one(f"before{k}") == 200
        # n3 leads the partition when its disk fills: it must hand the leadership over.
        leader = cluster[cluster.group("full", 0)["leader"]]
        if leader is not n3:
            resp = leader.request(
                "POST",
                f"/v1/internal/partitions/full/0/transfer?topic_id={topic_id}",
                {"target": "n3"},
            )
            assert resp.status == 200, resp
            wait_for(lambda: cluster.group("full", 0)["leader"] == "n3", 10, "n3 leads")
        filler = fill(disk, 200 * 1024)  # below the 0.8 MiB floor
        filled_at = time.monotonic()
        # Leader balancing may have moved the leadership off n3 again meanwhile (it leads
        # two groups if it also leads the metadata group): then there is nothing to hand.
        led_when_full = cluster.group("full", 0)["leader"] == "n3"
        wait_for(lambda: storage_of(cluster, "n3").get("level") == "full", 10, "n3 full")
        # If n3 led the partition it refuses (507) until it hands the leadership over
        # (within a couple of storage checks); from then on every produce succeeds.
        first_ok = wait_for(
            lambda: time.monotonic() if produce_one("handoff") == 200 else None,
            15,
            "a produce accepted with n3 full",
        )
        print(f"disk filled: produce accepted again after {first_ok - filled_at:.1f} s")
        statuses = [produce_one(f"full{k}") for k in range(20)]
        assert statuses == [200] * 20, statuses
        assert n3.alive, n3.log_tail()
        if led_when_full:
            assert "leadership of full-0 handed to" in n3.log_tail(100_000)
        print(f"n3 led full-0 when its disk filled: {led_when_full}")
        # `dmq cluster status` shows n3's storage level and free space.
        table = subprocess.run(
            [sys.executable, "-m", "dmq", "cluster", "status", "--url", n1.url],
            capture_output=True,
            text=True,
            timeout=60,
            cwd=Path(__file__).resolve().parents[2],
            check=True,
        ).stdout
        (n3_row,) = [line for line in table.splitlines() if line.startswith("n3 ")]
        assert " full " in f"{n3_row} " and "floor 0.8 MiB" in n3_row, table
        group = cluster.group("full", 0)
        assert group["leader"] != "n3"
        n3_applied = next(r for r in group["replicas"] if r["node_id"] == "n3")["last_applied"]
        assert n3_applied < group["commit_index"], group  # n3 took none of them
        filler.unlink()
        wait_caught_up(cluster, "full", 0, timeout_s=30)
        for node in cluster.nodes.values():
            records = fetch_all(node, "full", 0)
            held = {offset: value for offset, _, value in records}
            assert all(held.get(o) == v for o, v in acked.items()), node.node_id
        wait_identical_segments(cluster, "full", 1)
        assert storage_of(cluster, "n3").get("level") != "full"
        assert all(node.alive for node in cluster.nodes.values())
    finally:
        for node in cluster.nodes.values() if "cluster" in locals() else []:
            node.kill9()
        subprocess.run(["umount", "-l", str(disk)], check=False)
