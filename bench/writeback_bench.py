"""The stall of sealing a segment, with and without early write-back (log/writeback.py), #22.

    python -m bench.writeback_bench [--quick] [--segment-mib N] [--repeats N] [--dir DIR]

A PartitionLog with segments of --segment-mib (default 256, the broker's default) and no
flush per append (the broker's: Raft's journal is what is synced) takes batches of
1000 x 1 KiB until its first segment is sealed, once with a `Writeback` (the broker's
setup) and once without, alternated, --repeats times. Per run: the seal's append (its
fdatasync of the whole segment: the stall a Raft tick thread would take), the slowest
other append and how many took over 5 ms, and the whole run's MB/s; medians of the repeats, with the load average.
The page cache is not dropped between runs: each run writes a fresh file.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path

from bench import main_of
from log import FlushPolicy, LogConfig, PartitionLog, Record, encode_batch
from log.limits import MiB
from log.writeback import Writeback


def one_run(directory: Path, segment_bytes: int, writeback: Writeback | None) -> dict[str, float]:
    log = PartitionLog.open(
        directory, LogConfig(segment_bytes=segment_bytes, flush=FlushPolicy(interval_records=None))
    )
    if writeback is not None:
        log.writeback = writeback.kick
    records = [Record(None, os.urandom(1024), (), 1_700_000_000_000 + i) for i in range(1000)]
    batch = encode_batch(records)
    slowest_other, seal = 0.0, 0.0
    written, over_5ms = 0, 0
    started = time.perf_counter()
    while len(log.segments) < 2:
        before = time.perf_counter()
        log.append(batch)
        took = time.perf_counter() - before
        if len(log.segments) == 2:
            seal = took
        else:
            slowest_other = max(slowest_other, took)
            over_5ms += took > 0.005
        written += len(batch)
    elapsed = time.perf_counter() - started
    log.close()
    return {"seal_ms": seal * 1e3, "slowest_other_ms": slowest_other * 1e3,
            "over_5ms": over_5ms, "mb_s": written / elapsed / 1e6}  # fmt: skip


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--quick", action="store_true", help="64 MiB segments, 2 repeats")
    parser.add_argument("--segment-mib", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--dir", type=Path, default=None, help="work directory parent")


def run(args: argparse.Namespace) -> dict[str, dict[str, float]]:
    """Run as `args` say; print the medians per mode and return them ({} off Linux)."""
    segment_mib, repeats = (64, 2) if args.quick else (args.segment_mib, args.repeats)
    writeback = Writeback()
    if not writeback.available:
        print("no sync_file_range here (not Linux): nothing to compare")
        return {}
    print(f"load average at start: {os.getloadavg()[0]:.2f}")
    print(f"segments of {segment_mib} MiB, batches of 1000 x 1 KiB, no flush per append; "
          f"{repeats} repeats, alternated, medians")  # fmt: skip
    results: dict[str, list[dict[str, float]]] = {"without": [], "with": []}
    base = Path(tempfile.mkdtemp(prefix="dmq-writeback-bench-", dir=args.dir))
    try:
        for k in range(repeats):
            for mode in ("without", "with"):
                directory = base / f"{mode}-{k}"
                directory.mkdir()
                chosen = writeback if mode == "with" else None
                results[mode].append(one_run(directory, segment_mib * MiB, chosen))
                shutil.rmtree(directory)
    finally:
        writeback.close()
        shutil.rmtree(base, ignore_errors=True)
    print(f"{'write-back':12} {'seal (fdatasync) ms':>20} {'slowest other ms':>17} "
          f"{'others > 5 ms':>14} {'MB/s':>8}")  # fmt: skip
    medians = {
        mode: {key: statistics.median(r[key] for r in runs) for key in runs[0]}
        for mode, runs in results.items()
    }
    for mode, m in medians.items():
        print(f"{mode:12} {m['seal_ms']:20.1f} {m['slowest_other_ms']:17.1f} "
              f"{m['over_5ms']:14.0f} {m['mb_s']:8.0f}")  # fmt: skip
    print(f"load average at the end: {os.getloadavg()[0]:.2f}")
    return medians


main = main_of(__doc__, add_arguments, run)

if __name__ == "__main__":
    raise SystemExit(main())
