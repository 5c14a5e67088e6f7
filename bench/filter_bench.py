"""`dmq bench filter`: broker-side filtering against an unfiltered fetch of the same range.

Starts a real `dmq serve` (one node, loopback), produces `--records` records of about
200 B in one partition, 1% of them with the header tag=hit (the others tag=miss), then,
in each run, reads the whole range three ways, page after page until next_offset
reaches the end, in the JSON format:

- unfiltered: every record (the baseline);
- `tags=hit`;
- `filter=tag = 'hit' AND n >= 0` (the SQL92 selector path: two predicates a record).

For each it counts the bytes of the HTTP bodies and the broker process's CPU time
(user + system, from /proc/<pid>/stat) spent serving them, and checks the filtered
reads returned exactly the 1% (`hits`). Figures are medians over --runs; ratios are
against the unfiltered read of the same run. The targets: bytes <= 2% and CPU <= 2x of
the unfiltered read. The machine has 2 shared cores: the broker and this client share
them (the CPU figures are the broker's alone).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import tempfile
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

from bench import main_of
from bench.broker_bench import Server
from bench.cpu import process_cpu_s

MATCH_EVERY = 100  # 1% of records match
VALUE_CHARS = 200
PRODUCE_RECORDS = 1_000  # records per produce request


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--dir", help="data directory (default: a temp dir here, removed after)")
    parser.add_argument("--records", type=int, default=200_000, help="records in the topic")
    parser.add_argument("--runs", type=int, default=5, help="runs; medians are shown (5)")
    parser.add_argument("--quick", action="store_true", help="one small run (CI)")


def _get(url: str) -> tuple[bytes, dict[str, Any]]:
    with urllib.request.urlopen(url, timeout=60) as resp:  # noqa: S310 - http://127.0.0.1
        body = resp.read()
    return body, json.loads(body)


def _post(url: str, doc: dict[str, Any]) -> None:
    data = json.dumps(doc).encode()
    headers = {"Content-Type": "application/json"}
    req = urllib.request.Request(url, data=data, headers=headers, method="POST")  # noqa: S310
    with urllib.request.urlopen(req, timeout=60) as resp:  # noqa: S310 - http://127.0.0.1
        resp.read()


def _produce(url: str, records: int) -> None:
    value = "v" * VALUE_CHARS
    for first in range(0, records, PRODUCE_RECORDS):
        body = {
            "records": [
                {
                    "key": f"k{i}",
                    "value": value,
                    "partition": 0,
                    "headers": {"tag": "hit" if i % MATCH_EVERY == 0 else "miss", "n": str(i)},
                }
                for i in range(first, min(records, first + PRODUCE_RECORDS))
            ]
        }
        _post(f"{url}/v1/topics/bench/records", body)


def _read_range(url: str, pid: int, end: int, query: dict[str, str]) -> tuple[int, float, int]:
    """(body bytes, broker CPU seconds, records) of reading [0, end) page by page."""
    offset, nbytes, nrecords = 0, 0, 0
    cpu_before = process_cpu_s(pid)
    while offset < end:
        params = {"offset": str(offset), "max_records": "10000", "max_bytes": str(8 << 20)}
        body, doc = _get(
            f"{url}/v1/topics/bench/partitions/0/records?{urllib.parse.urlencode(params | query)}"
        )
        nbytes += len(body)
        nrecords += len(doc["records"])
        offset = doc["next_offset"]
    return nbytes, process_cpu_s(pid) - cpu_before, nrecords


def run(args: argparse.Namespace) -> dict[str, Any]:
    quick = bool(getattr(args, "quick", False))
    runs = 1 if quick else int(args.runs)
    records = 10_000 if quick else int(args.records)
    base = Path(getattr(args, "dir", None) or tempfile.mkdtemp(prefix="dmq-bench-", dir="."))
    base.mkdir(parents=True, exist_ok=True)
    cases = {
        "unfiltered": {},
        "tags": {"tags": "hit"},
        "selector": {"filter": "tag = 'hit' AND n >= 0"},
    }
    print("dmq bench filter: one broker over HTTP on loopback, JSON fetches of one partition")
    print(f"  python {platform.python_version()}, {os.cpu_count()} cores (2 shared: broker and")
    print(f"  client on the same machine), {records} records of ~{VALUE_CHARS} B, 1% match,")
    print(f"  {runs} runs; CPU is the broker process's user+system time")
    samples: dict[str, list[float]] = {}
    hits: dict[str, int] = {}
    with Server(base / "broker") as server:
        assert server.proc is not None
        _post(f"{server.url}/v1/topics", {"name": "bench", "partitions": 1})
        _produce(server.url, records)
        for _ in range(runs):
            got = {
                name: _read_range(server.url, server.proc.pid, records, query)
                for name, query in cases.items()
            }
            base_bytes, base_cpu, _ = got["unfiltered"]
            for name, (nbytes, cpu_s, nrecords) in got.items():
                samples.setdefault(f"{name}_bytes", []).append(nbytes)
                samples.setdefault(f"{name}_cpu_ms", []).append(cpu_s * 1000)
                samples.setdefault(f"{name}_bytes_ratio", []).append(nbytes / base_bytes)
                samples.setdefault(f"{name}_cpu_ratio", []).append(cpu_s / max(base_cpu, 1e-9))
                hits[name] = nrecords
    medians = {k: statistics.median(v) for k, v in samples.items()}
    expected_hits = len(range(0, records, MATCH_EVERY))
    checks = {
        "tags_returned_exactly_the_matches": hits["tags"] == expected_hits,
        "selector_returned_exactly_the_matches": hits["selector"] == expected_hits,
        "unfiltered_returned_everything": hits["unfiltered"] == records,
        "tags_bytes_at_most_2pct": medians["tags_bytes_ratio"] <= 0.02,
        "selector_bytes_at_most_2pct": medians["selector_bytes_ratio"] <= 0.02,
        "tags_cpu_at_most_2x": medians["tags_cpu_ratio"] <= 2.0,
        "selector_cpu_at_most_2x": medians["selector_cpu_ratio"] <= 2.0,
    }
    print(f"\n  {'read':<12}{'bytes':>14}{'vs unfiltered':>15}{'CPU ms':>10}{'vs unfiltered':>15}")
    for name in cases:
        print(
            f"  {name:<12}{medians[f'{name}_bytes']:>14,.0f}"
            f"{medians[f'{name}_bytes_ratio']:>14.2%} {medians[f'{name}_cpu_ms']:>10.0f}"
            f"{medians[f'{name}_cpu_ratio']:>14.2f}x"
        )
    print()
    for name, ok in checks.items():
        print(f"  {'ok  ' if ok else 'MISS'} {name}")
    if getattr(args, "dir", None) is None:
        import shutil

        shutil.rmtree(base, ignore_errors=True)
    return {"medians": medians, "checks": checks, "hits": hits}


main = main_of(__doc__, add_arguments, run)
