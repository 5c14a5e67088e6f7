"""A busy partition's Raft journal stays near `raft_snapshot_bytes` and recycles its files.

Against a real `dmq serve` with `--raft-snapshot-bytes 1048576` (1 MiB): a producer
streams 64 KiB binary batches with acks=all; the partition group's journal is compacted
by size, not only every 4096 entries (raft/config.py `log_compaction_bytes`), so the file
stays within a few MiB while tens of MiB go through, and compactions write into the file
the one before retired (`journal.spare`, raft/journal.py). kill -9 mid-stream, then a
restart: every acknowledged record is there once, at its offset, in order (the recovery
of a recycled journal stops at the spare's old records, never reading them back).
"""

from __future__ import annotations

import json
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

from log.records import Record, encode_batch

RECORD_BYTES = 2048
BATCH_RECORDS = 32  # 64 KiB a request
SNAPSHOT_BYTES = 1024 * 1024


def partition_group_dir(data_dir: Path) -> Path:
    (group,) = [d for d in (data_dir / "raft" / "groups").iterdir() if d.name != "0"]
    return group


def metric(url: str, name: str) -> float:
    with urllib.request.urlopen(url + "/metrics", timeout=10) as resp:
        for line in resp.read().decode().splitlines():
            if line.startswith(name + " "):
                return float(line.split()[1])
    raise AssertionError(f"{name} not in /metrics")


def all_values(url: str, topic: str) -> list[tuple[int, str]]:
    out: list[tuple[int, str]] = []
    offset = 0
    while True:
        with urllib.request.urlopen(
            f"{url}/v1/topics/{topic}/partitions/0/records"
            f"?offset={offset}&max_records=10000&max_bytes=8388608",
            timeout=30,
        ) as resp:
            body = json.loads(resp.read())
        out += [(r["offset"], r["value"][:16].rstrip(".")) for r in body["records"]]
        if not body["records"]:
            return out
        offset = body["next_offset"]


def test_a_busy_journal_stays_small_recycles_its_files_and_survives_kill9(
    broker_factory: Any,
) -> None:
    broker = broker_factory(extra_args=["--raft-snapshot-bytes", str(SNAPSHOT_BYTES)]).start()
    broker.json("POST", "/v1/topics", {"name": "j", "partitions": 1})
    acked: list[tuple[int, str]] = []
    journal_sizes: list[int] = []
    stop = threading.Event()
    group = partition_group_dir(broker.data_dir)

    def produce() -> None:
        n = 0
        while not stop.is_set():
            values = [f"v{n + k:08d}" for k in range(BATCH_RECORDS)]
            batch = encode_batch(
                [Record(None, v.encode().ljust(RECORD_BYTES, b"."), (), 0) for v in values]
            )
            req = urllib.request.Request(
                broker.url + "/v1/topics/j/records?partition=0&acks=all", data=batch,
                headers={"Content-Type": "application/vnd.dmq.batch"}, method="POST",
            )  # fmt: skip
            try:
                with urllib.request.urlopen(req, timeout=10) as resp:
                    offsets = [o["offset"] for o in json.loads(resp.read())["offsets"]]
            except OSError:
                return  # the broker died: this batch may or may not have landed
            acked.extend(zip(offsets, values, strict=True))
            journal_sizes.append((group / "journal").stat().st_size)
            n += BATCH_RECORDS

    thread = threading.Thread(target=produce)
    thread.start()
    deadline = time.monotonic() + 60
    while len(acked) * RECORD_BYTES < 12 * SNAPSHOT_BYTES:  # 12 MiB through the journal
        assert time.monotonic() < deadline and thread.is_alive(), len(acked)
        time.sleep(0.05)
    assert (group / "journal.spare").exists(), sorted(p.name for p in group.iterdir())
    spare = (group / "journal.spare").stat()
    spare_inode = spare.st_ino
    # One compaction per bound: the retired journal had passed it (asked again in the
    # ticks before the first compaction ended, a second ran on a journal of a few MiB).
    assert spare.st_size > SNAPSHOT_BYTES, spare.st_size
    # Compacted by size: the journal never held much more than the bound (a compaction
    # runs a tick after the bound is passed, and keeps the entries after the snapshot).
    assert max(journal_sizes) < 4 * SNAPSHOT_BYTES, max(journal_sizes)
    # ... and the two files swap: the spare of a moment ago becomes the journal.
    while (group / "journal").stat().st_ino != spare_inode:
        assert time.monotonic() < deadline and thread.is_alive(), len(acked)
        time.sleep(0.01)
    broker.kill9()
    stop.set()
    thread.join(10)

    broker.start()

    # What the journals take of the disk, as a metric: every journal file (a recycled one
    # past its records) and the retired files kept for the next compactions. Read until
    # the two agree: a group's first entries after the restart may land between them.
    def journal_files() -> int:
        names = ("journal", "journal.spare")
        return sum(p.stat().st_size for p in broker.data_dir.rglob("journal*") if p.name in names)

    assert journal_files() > SNAPSHOT_BYTES  # the spare alone had passed the bound
    deadline = time.monotonic() + 10
    while metric(broker.url, "dmq_raft_journal_disk_bytes") != journal_files():
        assert time.monotonic() < deadline, (
            metric(broker.url, "dmq_raft_journal_disk_bytes"),
            journal_files(),
        )
        time.sleep(0.1)
    stored = all_values(broker.url, "j")
    assert stored[: len(acked)] == acked
    assert len(stored) - len(acked) <= BATCH_RECORDS  # at most the batch in flight
    assert len({v for _, v in stored}) == len(stored)
