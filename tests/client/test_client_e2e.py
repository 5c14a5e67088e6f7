"""The client and the `dmq` command work against a real broker: `python -m dmq serve`.

A broker process is started once for this module on a free port with its own data
directory (fixture `broker`), and stopped with SIGTERM (SIGKILL if it hangs). Proves that:
- records produced in zstd batches with keys, headers and timestamps come back from the
  consumer with the same keys, values, headers and timestamps, on the murmur2 partition
  of their key, at dense offsets in send order, and with the offsets `send` reported;
- the asyncio API does the same, including a topic the broker auto-creates on the first
  record, tombstones and empty values;
- a consumer at "latest" is woken by a record produced during its long-poll; seek to a
  timestamp lands on the first record at or after it; an offset past the end falls back
  to earliest;
- Admin creates, lists, describes, alters (config and partitions) and deletes topics, and
  the broker's refusals arrive as TopicAlreadyExists, InvalidConfig, TopicNotFound;
- a keyed producer learns that partitions were added from the next produce answer (not
  after metadata_max_age) and maps later keys over every partition;
- `dmq produce` then `dmq consume` (real subprocesses) round-trip lines, keys and JSON,
  and `dmq topic ...` drives the admin calls.

Skipped, with the reason, while `dmq.server` cannot be imported.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from dmq import errors
from dmq.client import (
    Admin,
    AsyncAdmin,
    AsyncConsumer,
    AsyncProducer,
    Consumer,
    ConsumerRecord,
    Producer,
    RecordMetadata,
)
from dmq.partitioner import partition_for_key

ROOT = Path(__file__).resolve().parents[2]
STARTUP_S = 20
SHUTDOWN_S = 15


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def healthy(url: str) -> bool:
    try:
        with urllib.request.urlopen(url + "/readyz", timeout=1) as answer:
            return bool(answer.status == 200)
    except (urllib.error.URLError, OSError):
        return False


def clean_env() -> dict[str, str]:
    """This environment without DMQ_* settings, which would change the broker's config."""
    return {k: v for k, v in os.environ.items() if not k.startswith("DMQ_")}


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A running `dmq serve`; yields its URL."""
    work = tmp_path_factory.mktemp("broker")
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    log = (work / "broker.log").open("wb")
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "dmq",
            "serve",
            "--data-dir",
            str(work / "data"),
            "--http-addr",
            f"127.0.0.1:{port}",
            "--raft-addr",
            f"127.0.0.1:{free_port()}",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
        cwd=ROOT,
        env=clean_env(),
    )
    try:
        deadline = time.monotonic() + STARTUP_S
        while not healthy(url):
            if process.poll() is not None or time.monotonic() > deadline:
                log.flush()
                pytest.fail(
                    f"dmq serve did not answer /readyz within {STARTUP_S} s "
                    f"(exit code {process.poll()}):\n{(work / 'broker.log').read_text()}"
                )
            time.sleep(0.05)
        yield url
    finally:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(SHUTDOWN_S)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        log.close()


def poll_until(consumer: Consumer, count: int, timeout_s: float = 15) -> list[ConsumerRecord]:
    got: list[ConsumerRecord] = []
    deadline = time.monotonic() + timeout_s
    while len(got) < count and time.monotonic() < deadline:
        got += consumer.poll(timeout_ms=500)
    return got


# --------------------------------------------------------------------------- client


def test_batched_zstd_keyed_records_come_back_exactly(broker: str) -> None:
    with Admin(broker) as admin:
        admin.create_topic("orders", partitions=3)
    sent = [
        ConsumerRecord(
            topic="orders",
            partition=-1,  # not known before sending
            offset=-1,
            timestamp_ms=1_700_000_000_000 + i,
            key=f"customer-{i % 37}".encode(),
            value=f"order {i} ".encode() * 5,
            headers=(("seq", str(i).encode()), ("kind", b"\x00\xff")),
        )
        for i in range(600)
    ]
    with Producer(broker, compression="zstd", linger_ms=20, batch_bytes=16 * 1024) as producer:
        futures = [
            producer.send(
                r.topic, r.value, key=r.key, headers=r.headers, timestamp_ms=r.timestamp_ms
            )
            for r in sent
        ]
        producer.flush()
    metas = [f.result(timeout=30) for f in futures]
    with Consumer(broker, topic="orders") as consumer:
        got = poll_until(consumer, len(sent))
    assert len(got) == len(sent)
    by_place = {(r.partition, r.offset): r for r in got}
    for record, meta in zip(sent, metas, strict=True):
        assert record.key is not None and meta.offset is not None
        assert meta.partition == partition_for_key(record.key, 3)
        back = by_place[(meta.partition, meta.offset)]
        assert back == replace(record, partition=meta.partition, offset=meta.offset)
    for p in range(3):  # dense offsets, in send order
        offsets = [m.offset for m in metas if m.partition == p]
        assert offsets == list(range(len(offsets)))


def test_async_api_with_an_auto_created_topic(broker: str) -> None:
    async def scenario() -> tuple[list[RecordMetadata], list[ConsumerRecord]]:
        async with AsyncProducer(broker, linger_ms=2) as producer:
            futures = [await producer.send("auto-created", b"first")]
            futures.append(await producer.send("auto-created", None, key=b"gone"))  # tombstone
            futures.append(await producer.send("auto-created", b""))
            futures += [await producer.send("auto-created", b"v%d" % i) for i in range(50)]
            metas = list(await asyncio.gather(*futures))
        got: list[ConsumerRecord] = []
        async with AsyncConsumer(broker, topic="auto-created") as consumer:
            while len(got) < len(metas):
                batch = await consumer.poll(timeout_ms=5000)
                assert batch, "no record within 5 s"
                got += batch
        return metas, got

    metas, got = asyncio.run(scenario())
    assert [m.offset for m in metas] == list(range(53))  # one partition: the default
    assert [r.value for r in got] == [b"first", None, b""] + [b"v%d" % i for i in range(50)]
    assert got[1].key == b"gone" and got[0].key is None


def test_long_poll_seek_to_timestamp_and_out_of_range(broker: str) -> None:
    with Admin(broker) as admin:
        admin.create_topic("clock", partitions=1)
    with Producer(broker) as producer:
        for i in range(5):
            producer.send("clock", b"%d" % i, timestamp_ms=1_000 * (i + 1))
        producer.flush()
        with Consumer(broker) as consumer:
            consumer.assign([("clock", 0)])
            consumer.seek("clock", 0, "latest")
            assert consumer.position(("clock", 0)) == 5
            late = threading.Timer(0.3, lambda: producer.send("clock", b"late", timestamp_ms=9_000))
            late.start()
            started = time.monotonic()
            records = consumer.poll(timeout_ms=10_000)
            assert [r.value for r in records] == [b"late"]
            assert time.monotonic() - started < 8
            consumer.seek_to_timestamp("clock", 0, 2_500)
            assert [r.value for r in poll_until(consumer, 4)] == [b"2", b"3", b"4", b"late"]
            consumer.seek("clock", 0, 1000)  # past the end: back to earliest
            assert [r.offset for r in poll_until(consumer, 6)] == list(range(6))


def test_admin_create_describe_alter_delete(broker: str) -> None:
    with Admin(broker) as admin:
        created = admin.create_topic("admin-t", partitions=2, config={"retention_ms": 3_600_000})
        assert (created.name, created.partition_count) == ("admin-t", 2)
        assert created.config["retention_ms"] == 3_600_000
        with pytest.raises(errors.TopicAlreadyExists):
            admin.create_topic("admin-t")
        with pytest.raises(errors.InvalidConfig):
            admin.create_topic("bad-config", config={"no_such_key": 1})
        assert "admin-t" in {t.name for t in admin.list_topics()}
        altered = admin.alter_config("admin-t", {"retention_ms": 60_000})
        assert altered.config["retention_ms"] == 60_000
        assert admin.describe_topic("admin-t").config["retention_ms"] == 60_000
        assert admin.add_partitions("admin-t", 4).partition_count == 4
        offsets = admin.offsets("admin-t", 3)
        assert (offsets.log_start_offset, offsets.high_watermark) == (0, 0)
        assert admin.cluster().cluster_id
        admin.delete_topic("admin-t")
        with pytest.raises(errors.TopicNotFound):
            admin.describe_topic("admin-t")


def test_keyed_producer_follows_added_partitions_without_waiting_for_metadata_age(
    broker: str,
) -> None:
    """Partitions added while a producer runs: the next produce answer carries the new
    count (X-Dmq-Partition-Count), the producer re-reads the topic, and later keys map
    over all partitions (as in Kafka, earlier records stay where they were)."""
    keys = [b"key-%d" % i for i in range(40)]

    async def scenario() -> list[RecordMetadata]:
        async with AsyncAdmin(broker) as admin, AsyncProducer(broker, linger_ms=1) as producer:
            await admin.create_topic("grows", partitions=2)
            await (await producer.send("grows", b"before", key=keys[0]))
            await admin.add_partitions("grows", 8)
            # This answer tells the producer; the sends after it use 8 partitions.
            await (await producer.send("grows", b"tells", key=keys[0]))
            futures = [await producer.send("grows", b"after", key=k) for k in keys]
            return list(await asyncio.gather(*futures))

    after = asyncio.run(scenario())
    assert [m.partition for m in after] == [partition_for_key(k, 8) for k in keys]
    assert max(m.partition for m in after) >= 2  # the new partitions are in use


# --------------------------------------------------------------------------- CLI


def run_dmq(broker: str, *argv: str, stdin: bytes = b"") -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(
        [sys.executable, "-m", "dmq", "--url", broker, *argv],
        input=stdin,
        capture_output=True,
        cwd=ROOT,
        env=clean_env(),
        timeout=60,
    )


def test_cli_produce_then_consume_round_trip(broker: str, tmp_path: Path) -> None:
    created = run_dmq(
        broker, "topic", "create", "cli-t", "--partitions", "1", "--config", "retention_ms=-1"
    )
    assert created.returncode == 0, created.stderr
    lines = [f"k{i}\tvalue number {i}" for i in range(1000)]
    source = tmp_path / "lines.txt"
    source.write_text("\n".join(lines) + "\n")
    produced = run_dmq(
        broker,
        "produce",
        "cli-t",
        "--file",
        str(source),
        "--key-separator",
        "\\t",
        "--compression",
        "zstd",
        "--progress",
    )
    assert produced.returncode == 0, produced.stderr
    assert b"produced 1000 records" in produced.stderr and b"100.0%" in produced.stderr
    piped = run_dmq(broker, "produce", "cli-t", stdin=b"plain one\nplain two\n")
    assert piped.returncode == 0, piped.stderr

    consumed = run_dmq(broker, "consume", "cli-t", "--key-separator", "\t")
    assert consumed.returncode == 0, consumed.stderr
    assert consumed.stdout.decode().splitlines() == lines + ["\tplain one", "\tplain two"]

    tail = run_dmq(broker, "consume", "cli-t", "--from", "999", "--output", "json")
    objects = [json.loads(line) for line in tail.stdout.splitlines()]
    assert [(o["offset"], o["key"], o["value"]) for o in objects] == [
        (999, "k999", "value number 999"),
        (1000, None, "plain one"),
        (1001, None, "plain two"),
    ]
    first = run_dmq(broker, "consume", "cli-t", "--max-records", "2")
    assert first.stdout == b"value number 0\nvalue number 1\n"


def test_cli_topic_commands_and_errors(broker: str) -> None:
    assert run_dmq(broker, "topic", "create", "cli-admin", "--partitions", "2").returncode == 0
    listing = run_dmq(broker, "topic", "list")
    assert b"cli-admin" in listing.stdout
    described = json.loads(run_dmq(broker, "topic", "describe", "cli-admin", "--json").stdout)
    assert len(described["partitions"]) == 2
    altered = run_dmq(
        broker, "topic", "alter", "cli-admin", "--partitions", "3", "--config", "retention_ms=1000"
    )
    assert altered.returncode == 0, altered.stderr
    assert b"3 partitions" in altered.stdout
    again = run_dmq(broker, "topic", "create", "cli-admin")
    assert again.returncode == 1
    assert again.stderr.startswith(b"error: topic_already_exists: ")
    assert run_dmq(broker, "topic", "delete", "cli-admin").returncode == 0
    missing = run_dmq(broker, "consume", "cli-admin")
    assert missing.returncode == 1
    assert missing.stderr.startswith(b"error: topic_not_found: ")


def test_a_producer_cancelled_with_its_loop_lets_asyncio_run_return(broker: str) -> None:
    """asyncio.run cancels every task left when its main coroutine raises, the producer's
    sender among them. A producer closing in one of those tasks waited for records its
    cancelled sender would never send, and asyncio.run never returned (found when a
    benchmark's producer failed). Now what a cancelled sender leaves fails at once."""
    script = f"""
import asyncio
from dmq.client import AsyncProducer
from dmq.errors import DmqError

async def worker(started, left):
    async with AsyncProducer({broker!r}, linger_ms=60_000) as producer:
        await (await producer.send("cancel-me", b"first"))  # creates the topic
        left.append(await producer.send("cancel-me", b"queued"))  # lingers
        started.set()
        await asyncio.sleep(3600)

async def main(left):
    started = asyncio.Event()
    asyncio.get_running_loop().create_task(worker(started, left))
    await started.wait()
    raise RuntimeError("the main coroutine failed")

left = []
try:
    asyncio.run(main(left))
except RuntimeError as error:
    print("raised:", error)
print("queued record:", type(left[0].exception()).__name__)
"""
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=False
    )
    assert "raised: the main coroutine failed" in done.stdout, (done.stdout, done.stderr)
    assert "queued record: DmqError" in done.stdout, (done.stdout, done.stderr)
