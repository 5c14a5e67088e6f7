"""`python -m bench.txn_bench` (`dmq bench txn`): transactions against idempotent produce.

Starts `--nodes` (3) `dmq serve` processes on loopback (bench/cluster_bench.py's launcher,
fsync on) and a topic of 3 partitions, replication factor min(3, nodes). Then, in the
same run, for `--seconds` (5) each, N Python producers (dmq.client's AsyncProducer,
linger 5 ms, RETRIES retries per request, all in this process), each sending units of
`--records` (100) records of `--record-bytes` (1024) spread over the 3 partitions:

a. **baseline**: idempotent producers (`idempotent=True`), one unit then `flush()`;
b. **transactions**: transactional producers (`transactional_id`), one unit per
   transaction: `begin_transaction()`, the sends, `commit_transaction()` with the
   client's default `transaction_commit_wait="decision"` (answered once the decision is
   durable, as Kafka's EndTxn). Each commit's latency is kept: p50 and p99;
c. **transactions, wait complete**: the same with `transaction_commit_wait="complete"`
   (answered once every marker is written: read-your-writes);
d. the baseline again.

N takes each value of `--producers` (4,16,64) in turn, a to d for each, so one run
measures the same cluster from few producers (each producer waits for its unit: the
figure is bound by the latency of a unit, one Raft round for the baseline against a chain
of rounds for a transaction) to many (the cluster saturated: the figure is bound by the
CPU each unit costs the brokers and the client, on a machine whose cores they share).
The ratios divide b and c by the mean of a and d, so that a load that drifts during the
run (other work on the machine) weighs on both sides alike. **Throughput** is the
saturated figure: per run, each mode's best over the producer counts (the ratio of the
two bests; the issue's target: >= 0.60); every count's own figures are printed too. All
figures are medians of `--runs` (3) runs. The brokers, the producers and this process
share the machine's cores (2 shared cores on this project's VM: a 3-node cluster and the
client on 2 cores).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp

from bench import main_of
from bench.cluster_bench import Broker, dmq_cluster, percentile
from bench.cpu import process_cpu_s
from dmq.client import AsyncProducer

PARTITIONS = 3
# Per request, for every producer of both modes. The client's default (5, about a second
# with the broker's retry-after while no leader is known) is shorter than an election on
# 2 cores saturated by 3 brokers and 64 producers: a run once lost a producer to
# not_leader mid-phase (the metadata group went through 3 elections).
RETRIES = 50


async def _create_topic(url: str, name: str, rf: int) -> None:
    body = {"name": name, "partitions": PARTITIONS, "replication_factor": rf}
    async with aiohttp.ClientSession() as s:
        for _ in range(200):
            async with s.post(f"{url}/v1/topics", json=body) as r:
                if r.status in (201, 409):
                    break
            await asyncio.sleep(0.1)
        for p in range(PARTITIONS):  # until each partition answers (it has a leader)
            for _ in range(200):
                async with s.get(f"{url}/v1/topics/{name}/partitions/{p}/offsets") as r:
                    if r.status == 200:
                        break
                await asyncio.sleep(0.1)


async def _produce(
    url: str,
    topic: str,
    args: argparse.Namespace,
    producers: int,
    commit_wait: str | None,
    run: int,
    brokers: list[Broker],
) -> tuple[float, list[float], tuple[float, float, float, float]]:
    """(records/s, commit latencies in ms, cost per unit) of `producers` producers for
    --seconds: transactional ones answered at `commit_wait`, or idempotent ones (None).
    The cost of a unit (--records records): the brokers' CPU ms, this process's (the
    client's) CPU ms, the metadata group's Raft entries and the partition groups' Raft
    entries, as commit index advances (Raft coalesces the concurrent proposals of a group
    into one entry: group commit; the metadata group's count includes the brokers' own
    heartbeats)."""
    transactional = commit_wait is not None
    value = b"x" * args.record_bytes
    commits: list[float] = []
    sent = 0

    async def one(k: int) -> None:
        nonlocal sent
        kwargs: dict[str, Any] = (
            {"transactional_id": f"bench-{run}-{producers}-{k}-{commit_wait}",
             "transaction_commit_wait": commit_wait}
            if transactional
            else {"idempotent": True}
        )  # fmt: skip
        async with AsyncProducer(url, linger_ms=5, retries=RETRIES, **kwargs) as producer:
            while time.perf_counter() < deadline:
                if transactional:
                    await producer.begin_transaction()
                futures = [
                    await producer.send(topic, value, partition=i % PARTITIONS)
                    for i in range(args.records)
                ]
                if transactional:
                    start = time.perf_counter()
                    await producer.commit_transaction()
                    commits.append((time.perf_counter() - start) * 1000)
                else:
                    await producer.flush()
                await asyncio.gather(*futures)
                sent += args.records

    cpu_before, entries_before = (
        sum(process_cpu_s(b.proc.pid) for b in brokers),
        await _entries(url),
    )
    client_before = time.process_time()
    start = time.perf_counter()
    deadline = start + args.seconds
    await asyncio.gather(*(one(k) for k in range(producers)))
    rate = sent / (time.perf_counter() - start)
    client = time.process_time() - client_before
    cpu_after, entries_after = sum(process_cpu_s(b.proc.pid) for b in brokers), await _entries(url)
    units = max(1, sent // args.records)
    advanced = {g: v - entries_before[g] for g, v in entries_after.items() if g in entries_before}
    metadata = advanced.pop(0, 0)
    partitions = sum(advanced.values())
    cost = (
        1000 * (cpu_after - cpu_before) / units,
        1000 * client / units,
        metadata / units,
        partitions / units,
    )
    return rate, sorted(commits), cost


async def _entries(url: str) -> dict[int, int]:
    """Each Raft group's commit index (group 0: the metadata group): the highest any of
    its replicas reports. Not the merged `commit_index`, which is the leader's and 0 when
    the leader's broker did not answer in time (seen at 16 producers: a negative count);
    a group no replica reported is left out."""
    async with aiohttp.ClientSession() as s, s.get(f"{url}/v1/cluster/status") as r:
        doc = await r.json()
    return {
        int(g["group_id"]): max(int(rep["commit_index"]) for rep in g["replicas"])
        for g in doc["groups"]
        if g["replicas"]
    }


def _one_count(
    url: str, topic: str, args: argparse.Namespace, n: int, run: int, brokers: list[Broker]
) -> dict[str, float]:
    """Phases a to d (module docstring) with n producers: their figures."""
    base_a, _, cost_a = asyncio.run(_produce(url, topic, args, n, None, run, brokers))
    txn, commits, cost_t = asyncio.run(_produce(url, topic, args, n, "decision", run, brokers))
    full, full_commits, _ = asyncio.run(_produce(url, topic, args, n, "complete", run, brokers))
    base_d, _, cost_d = asyncio.run(_produce(url, topic, args, n, None, run, brokers))
    base = (base_a + base_d) / 2
    print(f"  run {run + 1}, {n} producers: idempotent {base_a:.0f} then {base_d:.0f} "
          f"records/s, transactions {txn:.0f} records/s (ratio {txn / base:.2f}), wait "
          f"complete {full:.0f} records/s (ratio {full / base:.2f}); per unit (CPU ms of "
          f"the brokers + the client, metadata / partition Raft entries): idempotent "
          f"{cost_a[0]:.0f} + {cost_a[1]:.0f}, {cost_a[2]:.2f} / {cost_a[3]:.2f} then "
          f"{cost_d[0]:.0f} + {cost_d[1]:.0f}, {cost_d[2]:.2f} / {cost_d[3]:.2f}; "
          f"transactions {cost_t[0]:.0f} + {cost_t[1]:.0f}, {cost_t[2]:.2f} / "
          f"{cost_t[3]:.2f}", flush=True)  # fmt: skip
    return {
        "idempotent_records_per_s": base,
        "txn_records_per_s": txn,
        "ratio": txn / base,
        "commit_p50_ms": percentile(commits, 0.5),
        "commit_p99_ms": percentile(commits, 0.99),
        "transactions": float(len(commits)),
        "complete_records_per_s": full,
        "complete_ratio": full / base,
        "complete_commit_p50_ms": percentile(full_commits, 0.5),
        "complete_commit_p99_ms": percentile(full_commits, 0.99),
        "idempotent_cpu_ms_per_unit": (cost_a[0] + cost_d[0]) / 2,
        "idempotent_client_cpu_ms_per_unit": (cost_a[1] + cost_d[1]) / 2,
        "txn_cpu_ms_per_unit": cost_t[0],
        "txn_client_cpu_ms_per_unit": cost_t[1],
        "txn_metadata_entries_per_unit": cost_t[2],
        "txn_partition_entries_per_unit": cost_t[3],
        "idempotent_partition_entries_per_unit": (cost_a[3] + cost_d[3]) / 2,
        # What a unit costs the machine (brokers and client) in CPU, idempotent against
        # transactional: the ratio the throughputs tend to once the cores are saturated,
        # and far less noisy than them on a shared machine.
        "cpu_ratio": (cost_a[0] + cost_a[1] + cost_d[0] + cost_d[1]) / 2 / (cost_t[0] + cost_t[1]),
    }


def _saturated(by_count: dict[int, dict[str, float]]) -> dict[str, float]:
    """One run's throughput: each mode's best records/s over the producer counts, and
    the ratios of those bests."""
    base = max(f["idempotent_records_per_s"] for f in by_count.values())
    txn = max(f["txn_records_per_s"] for f in by_count.values())
    full = max(f["complete_records_per_s"] for f in by_count.values())
    return {
        "idempotent_records_per_s": base,
        "txn_records_per_s": txn,
        "ratio": txn / base,
        "complete_records_per_s": full,
        "complete_ratio": full / base,
    }


def measure(args: argparse.Namespace, counts: list[int]) -> dict[str, float]:
    """Every count's figures (keys `p{N}_...`) and the saturated ones (no prefix), each
    the median over the runs."""
    runs: list[dict[str, float]] = []
    with (
        tempfile.TemporaryDirectory(prefix="dmq-txn-bench-") as tmp,
        dmq_cluster(Path(tmp) / f"n{args.nodes}", args.nodes, "fsync") as brokers,
    ):
        url = brokers[-1].url
        for run in range(args.runs):
            topic = f"txn-bench-{run}"
            asyncio.run(_create_topic(url, topic, min(3, args.nodes)))
            by_count = {n: _one_count(url, topic, args, n, run, brokers) for n in counts}
            figures = {f"p{n}_{k}": v for n, f in by_count.items() for k, v in f.items()}
            runs.append(figures | _saturated(by_count))
    return {k: statistics.median(r[k] for r in runs) for k in runs[0]}


PRODUCERS_DEFAULT = "4,16,64"


def producer_counts(text: str) -> list[int]:
    """`--producers`: a comma-separated list of distinct counts >= 1 (SystemExit naming
    the option otherwise). Kept a string in the options, so that `dmq bench txn` can
    repeat them without importing this module (dmq/cli/bench.py)."""
    try:
        counts = [int(part) for part in text.split(",")]
    except ValueError:
        counts = []
    if not counts or min(counts) < 1 or len(set(counts)) != len(counts):
        raise SystemExit(f"--producers: distinct counts >= 1, comma-separated, not {text!r}")
    return counts


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--nodes", type=int, default=3, help="brokers of the cluster (3)")
    parser.add_argument("--runs", type=int, default=3, help="runs; medians are shown (3)")
    parser.add_argument("--seconds", type=float, default=5.0, help="per measure (5)")
    parser.add_argument(
        "--producers",
        default=PRODUCERS_DEFAULT,
        help=f"concurrent producers: each count of this list in turn ({PRODUCERS_DEFAULT})",
    )
    parser.add_argument("--records", type=int, default=100, help="records per transaction (100)")
    parser.add_argument("--record-bytes", type=int, default=1024, help="value size (1024)")
    parser.add_argument("--quick", action="store_true", help="one small run (CI)")


def run(args: argparse.Namespace) -> dict[str, float]:
    if args.quick:
        args.runs, args.seconds, args.producers = 1, 1.5, "2,4"
    counts = producer_counts(args.producers)
    print(f"txn_bench: {args.nodes} nodes, fsync, {PARTITIONS} partitions, {args.producers} "
          f"producers in turn, {args.records} x {args.record_bytes} B per transaction "
          f"(baseline: the same units, idempotent, flushed), {args.seconds} s each, "
          f"{args.runs} run(s), medians; brokers and client share this machine (2 shared "
          f"cores here); load average {os.getloadavg()[0]:.2f}")  # fmt: skip
    r = measure(args, counts)
    mb = args.record_bytes / 1e6
    print("producers | idempotent records/s | transactions records/s | ratio | wait complete "
          "| ratio | commit p50 / p99 ms | CPU ms per unit, brokers + client: idempotent, "
          "transactions (their ratio) | Raft entries per unit: idempotent, transactions (metadata + "
          "partition)")  # fmt: skip
    for n in counts:

        def f(key: str, n: int = n) -> float:
            return r[f"p{n}_{key}"]

        print(f"{n} | {f('idempotent_records_per_s'):.0f} | {f('txn_records_per_s'):.0f} | "
              f"{f('ratio'):.2f} | {f('complete_records_per_s'):.0f} | "
              f"{f('complete_ratio'):.2f} | {f('commit_p50_ms'):.0f} / "
              f"{f('commit_p99_ms'):.0f} | {f('idempotent_cpu_ms_per_unit'):.0f} + "
              f"{f('idempotent_client_cpu_ms_per_unit'):.0f}, {f('txn_cpu_ms_per_unit'):.0f} + "
              f"{f('txn_client_cpu_ms_per_unit'):.0f} ({f('cpu_ratio'):.2f}) | "
              f"{f('idempotent_partition_entries_per_unit'):.2f}, "
              f"{f('txn_metadata_entries_per_unit'):.2f} + "
              f"{f('txn_partition_entries_per_unit'):.2f}")  # fmt: skip
    print(f"saturated (each mode's best over the counts, per run): idempotent "
          f"{r['idempotent_records_per_s']:.0f} records/s "
          f"({r['idempotent_records_per_s'] * mb:.1f} MB/s), transactions "
          f"{r['txn_records_per_s']:.0f} records/s ({r['txn_records_per_s'] * mb:.1f} MB/s), "
          f"wait complete {r['complete_records_per_s']:.0f} records/s "
          f"(ratio {r['complete_ratio']:.2f})")  # fmt: skip
    print(f"throughput ratio transactions / idempotent, saturated (median of the runs' "
          f"ratios): {r['ratio']:.2f} (target >= 0.60); load average "
          f"{os.getloadavg()[0]:.2f}")  # fmt: skip
    return r


main = main_of(__doc__, add_arguments, run)


if __name__ == "__main__":
    raise SystemExit(main())
