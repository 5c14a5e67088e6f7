"""Benchmark of the storage engine (log/): appends, raw reads and decoding reads.

Run it as `python -m bench.log_bench` (`--quick` for a CI-sized run, `--help` for the
options); `dmq bench log` calls `run(args)` with the same options (see `add_arguments`).

What is measured, for 1 KiB records (16-byte key, 1024-byte value, no headers, codec none)
in batches of 1, 100 and 1000 records:

1. append: `PartitionLog.append` of batches encoded before the clock starts (the broker
   appends ready batches), with an fsync per append (`FlushPolicy(interval_records=1)`) and
   without (`FlushPolicy(interval_records=None, interval_ms=None)`); MB/s and records/s.
2. raw write baseline, in the same run and directory: `os.write` of the same batch bytes to
   a plain O_APPEND file, with the same fsync choice (`os.fdatasync` after each write).
3. reads of the whole no-fsync log from the page cache, in steps of `max_bytes` 1 MiB after
   `set_high_watermark(log_end_offset)`: the raw-bytes path `read(...).read_bytes()` (what a
   fetch serves) and the decoding path `read_records(...)` (CRC check and Record objects).
4. raw read baseline: `os.pread` of the baseline file in 1 MiB steps.

Each run measures every case; the tables show medians over the runs, and each ratio is the
median of per-run ratios, so dmq is always compared with the baseline of its own run. MB is
10**6 bytes, and bytes are batch bytes as stored (batch headers included). Every timed write
follows a write+delete of as many bytes (see `_warm_page_cache`: a VM hands idle memory
back to its host, and writing into it again is up to 10x slower).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import random
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

from log.config import FlushPolicy, LogConfig
from log.partition_log import PartitionLog
from log.records import HEADER_BYTES, Record, encode_batch

KiB = 1024
MiB = 1024 * KiB
MB = 1_000_000  # rates are in MB/s = 10**6 bytes per second

KEY_BYTES = 16
VALUE_BYTES = 1024
BATCH_RECORDS = (1, 100, 1000)
READ_MAX_BYTES = 1 * MiB  # max_bytes of each read, as a consumer's fetch would ask
# Distinct batches encoded per batch size and then cycled: bounds the memory and the encode
# time of the setup (encoding is not what is measured) while still writing varied bytes.
POOL_BYTES_MAX = 16 * MiB
# Free space required, as a multiple of the per-case volume: the log and the baseline file
# of one case exist at the same time, plus slack for indexes and the filesystem.
FREE_SPACE_FACTOR = 3

# Targets, checked in the output (never in tests: a test must not fail on a slow machine).
APPEND_VS_RAW_PCT_MIN = 70.0  # batched appends of 1000 records, no fsync, vs os.write
READ_BYTES_MB_S_MIN = 1000.0  # raw-bytes reads of 1000-record batches from the page cache
FSYNC_RECORDS_S_MIN = 100_000.0  # fsync per append, 100-record batches
TARGET_BATCH_APPEND = 1000
TARGET_BATCH_READ = 1000
TARGET_BATCH_FSYNC = 100


@dataclass(frozen=True, slots=True)
class Settings:
    total_bytes: int  # per no-fsync case
    fsync_bytes: int  # per fsync case, also capped by fsync_appends_max
    fsync_appends_max: int
    runs: int
    quick: bool
    directory: Path | None  # parent of the temporary work directory; None: choose one
    json_path: Path | None


_FULL = {"total_mb": 256.0, "fsync_mb": 32.0, "fsync_appends_max": 5000, "runs": 3}
_QUICK = {"total_mb": 32.0, "fsync_mb": 4.0, "fsync_appends_max": 1000, "runs": 1}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of this benchmark, for `python -m bench.log_bench` and `dmq bench log`."""
    parser.add_argument(
        "--dir",
        type=Path,
        default=None,
        help="create the temporary work directory inside DIR (default: the system temp dir "
        "if it is on the same filesystem as the current directory, else the current "
        "directory); it is removed at the end",
    )
    parser.add_argument("--total-mb", type=float, default=None, help="MiB per case (256)")
    parser.add_argument("--fsync-mb", type=float, default=None, help="MiB per fsync case (32)")
    parser.add_argument(
        "--fsync-appends-max",
        type=int,
        default=None,
        help="at most this many appends per fsync case (5000), so 1-record batches stay short",
    )
    parser.add_argument("--runs", type=int, default=None, help="runs; medians are shown (3)")
    parser.add_argument(
        "--quick",
        action="store_true",
        help="CI-sized run: 32 MiB per case, 4 MiB per fsync case, 1000 fsyncs, 1 run",
    )
    parser.add_argument("--json", type=Path, default=None, help="also write the result here")


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.log_bench", description=__doc__)
    add_arguments(parser)
    return parser.parse_args(argv)


def _settings(args: argparse.Namespace) -> Settings:
    """Resolve options; missing attributes take defaults, so any Namespace will do."""
    quick = bool(getattr(args, "quick", False))
    defaults = _QUICK if quick else _FULL

    def pick(name: str) -> Any:
        value = getattr(args, name, None)
        return defaults[name] if value is None else value

    settings = Settings(
        total_bytes=int(float(pick("total_mb")) * MiB),
        fsync_bytes=int(float(pick("fsync_mb")) * MiB),
        fsync_appends_max=int(pick("fsync_appends_max")),
        runs=int(pick("runs")),
        quick=quick,
        directory=getattr(args, "dir", None),
        json_path=getattr(args, "json", None),
    )
    if settings.total_bytes < MiB or settings.fsync_bytes < 1 or settings.fsync_appends_max < 1:
        raise ValueError("need --total-mb >= 1, --fsync-mb > 0 and --fsync-appends-max >= 1")
    if settings.runs < 1:
        raise ValueError("--runs must be >= 1")
    return settings


# --------------------------------------------------------------------------- environment


def _work_parent(requested: Path | None) -> Path:
    """Where to create the work directory: on the filesystem of the current directory."""
    if requested is not None:
        return requested
    temp = Path(tempfile.gettempdir())
    # A tmpfs /tmp would measure memory, not the disk the broker's data lives on.
    if os.stat(temp).st_dev == os.stat(Path.cwd()).st_dev:
        return temp
    return Path.cwd()


def _mount_of(path: Path) -> tuple[str, str, str]:
    """(mount point, device, filesystem type) holding path, from /proc/mounts (Linux)."""
    best = ("?", "?", "?")
    try:
        lines = Path("/proc/mounts").read_text().splitlines()
    except OSError:
        return best
    real = str(path.resolve())
    for line in lines:
        fields = line.split()
        if len(fields) < 3:
            continue
        device, mount_point, fs_type = fields[0], fields[1], fields[2]
        inside = real == mount_point or real.startswith(mount_point.rstrip("/") + "/")
        if inside and (best[0] == "?" or len(mount_point) >= len(best[0])):
            best = (mount_point, device, fs_type)
    return best


def _cpu_description() -> str:
    try:
        count = len(os.sched_getaffinity(0))
    except AttributeError:
        count = os.cpu_count() or 0
    model, shared = platform.processor() or "?", False
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name") and model in ("?", ""):
                model = line.split(":", 1)[1].strip()
            elif line.startswith("flags") and " hypervisor" in line:
                shared = True
    except OSError:
        pass
    where = "shared (virtual machine)" if shared else "(no hypervisor flag)"
    return f"{count} cores {where}, {model}"


def _load_average() -> list[float]:
    """1, 5 and 15-minute load averages: other work on shared cores skews every figure."""
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return []


def _record_bytes() -> int:
    """On-disk size of one record of the benchmark (a 1-record batch minus its header)."""
    record = Record(key=b"k" * KEY_BYTES, value=b"v" * VALUE_BYTES)
    return len(encode_batch([record])) - HEADER_BYTES


def _setup(settings: Settings, work_dir: Path) -> dict[str, Any]:
    mount_point, device, fs_type = _mount_of(work_dir)
    config = LogConfig()
    return {
        "python": f"{platform.python_version()} ({platform.python_implementation()}, "
        f"{sys.executable})",
        "cpu": _cpu_description(),
        "load_average_start": _load_average(),
        "directory": str(work_dir),
        "filesystem": f"{fs_type} on {device}, mounted at {mount_point}",
        "same_filesystem_as_cwd": os.stat(work_dir).st_dev == os.stat(Path.cwd()).st_dev,
        "cwd": str(Path.cwd()),
        "key_bytes": KEY_BYTES,
        "value_bytes": VALUE_BYTES,
        "record_bytes_on_disk": _record_bytes(),
        "batch_header_bytes": HEADER_BYTES,
        "batch_records": list(BATCH_RECORDS),
        "total_bytes": settings.total_bytes,
        "fsync_bytes": settings.fsync_bytes,
        "fsync_appends_max": settings.fsync_appends_max,
        "runs": settings.runs,
        "quick": settings.quick,
        "read_max_bytes": READ_MAX_BYTES,
        "segment_bytes": config.segment_bytes,
        "index_interval_bytes": config.index_interval_bytes,
    }


# --------------------------------------------------------------------------- workload


def _encode_pool(batch_records: int, total_bytes: int, seed: int) -> list[bytes]:
    """Distinct ready batches of `batch_records` records, about min(total, pool max) bytes."""
    rng = random.Random(seed)
    timestamp_ms = 1_700_000_000_000
    first = encode_batch(
        [Record(key=b"k" * KEY_BYTES, value=rng.randbytes(VALUE_BYTES))] * batch_records
    )
    count = max(1, min(total_bytes, POOL_BYTES_MAX) // len(first))
    pool = []
    for b in range(count):
        records = [
            Record(
                key=b"key-%012d" % (b * batch_records + i),
                value=rng.randbytes(VALUE_BYTES),
                timestamp_ms=timestamp_ms,
            )
            for i in range(batch_records)
        ]
        pool.append(encode_batch(records))
    return pool


def _warm_page_cache(work_dir: Path, size_bytes: int) -> float:
    """Write and delete size_bytes so that the page cache has memory in hand.

    Called just before each timed write. On a virtual machine, memory left free for a
    few seconds goes back to the host (free page reporting, ballooning), and the next
    write into it runs up to 10x slower (measured here: 570 vs 6000 MB/s after a 3 s
    pause). A broker's page cache is always full and recycled, so this step measures
    the log rather than the hypervisor.
    """
    path = work_dir / "warm-up"
    chunk = bytes(MiB)
    start = time.perf_counter()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        for _ in range(max(1, size_bytes // MiB)):
            os.write(fd, chunk)
    finally:
        os.close(fd)
        path.unlink()
    return time.perf_counter() - start


def _flush_policy(fsync: bool) -> FlushPolicy:
    if fsync:
        return FlushPolicy(interval_records=1)
    return FlushPolicy(interval_records=None, interval_ms=None)


def _timed_append(directory: Path, batches: list[bytes], fsync: bool) -> tuple[PartitionLog, float]:
    log = PartitionLog.open(directory, LogConfig(flush=_flush_policy(fsync)))
    append = log.append
    _warm_page_cache(directory.parent, sum(len(b) for b in batches))
    gc.collect()
    start = time.perf_counter()
    for batch in batches:
        append(batch)
    seconds = time.perf_counter() - start
    expected = sum(len(b) for b in batches)
    if log.size_bytes != expected:
        raise RuntimeError(f"log holds {log.size_bytes} bytes after appending {expected}")
    log.set_high_watermark(log.log_end_offset)
    return log, seconds


def _timed_raw_write(path: Path, batches: list[bytes], fsync: bool) -> float:
    _warm_page_cache(path.parent, sum(len(b) for b in batches))
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_APPEND, 0o644)
    write, sync = os.write, os.fdatasync
    try:
        gc.collect()
        start = time.perf_counter()
        if fsync:
            for batch in batches:
                write(fd, batch)
                sync(fd)
        else:
            for batch in batches:
                write(fd, batch)
        seconds = time.perf_counter() - start
        if os.fstat(fd).st_size != sum(len(b) for b in batches):
            raise RuntimeError(f"short write to {path}")
    finally:
        os.close(fd)
    return seconds


def _timed_raw_read(path: Path) -> tuple[int, float]:
    fd = os.open(path, os.O_RDONLY)
    pread = os.pread
    try:
        size = os.fstat(fd).st_size
        gc.collect()
        start = time.perf_counter()
        position = 0
        while position < size:
            data = pread(fd, READ_MAX_BYTES, position)
            if not data:
                raise RuntimeError(f"{path} ended at {position} of {size} bytes")
            position += len(data)
        seconds = time.perf_counter() - start
    finally:
        os.close(fd)
    return position, seconds


def _timed_read_bytes(log: PartitionLog) -> tuple[int, float]:
    """The fetch path: raw batches, no decoding, in steps of READ_MAX_BYTES."""
    offset, end, total = log.log_start_offset, log.high_watermark, 0
    gc.collect()
    start = time.perf_counter()
    while offset < end:
        with log.read(offset, READ_MAX_BYTES) as result:
            total += len(result.read_bytes())
        offset = result.next_offset
    seconds = time.perf_counter() - start
    if total != log.size_bytes:
        raise RuntimeError(f"read {total} bytes of a {log.size_bytes}-byte log")
    return total, seconds


def _timed_read_records(log: PartitionLog) -> tuple[int, float]:
    """The decoding path: CRC-checked batches turned into Record objects."""
    offset, end, count = log.log_start_offset, log.high_watermark, 0
    gc.collect()
    start = time.perf_counter()
    while offset < end:
        records = log.read_records(offset, READ_MAX_BYTES)
        if not records:
            raise RuntimeError(f"read_records({offset}) returned nothing below {end}")
        count += len(records)
        offset = records[-1].offset + 1
    seconds = time.perf_counter() - start
    if count != end - log.log_start_offset:
        raise RuntimeError(f"decoded {count} records of {end - log.log_start_offset}")
    return count, seconds


# --------------------------------------------------------------------------- one run


def _measure_case(
    work_dir: Path, batches: list[bytes], batch_records: int, fsync: bool, baseline_first: bool
) -> tuple[dict[str, Any], dict[str, Any] | None]:
    """One (batch size, fsync) case: dmq append and raw write; reads of the no-fsync log."""
    name = f"b{batch_records}-{'fsync' if fsync else 'nofsync'}"
    log_dir, raw_path = work_dir / name, work_dir / (name + ".raw")
    log: PartitionLog | None = None
    try:
        if baseline_first:
            raw_write_s = _timed_raw_write(raw_path, batches, fsync)
        log, append_s = _timed_append(log_dir, batches, fsync)
        if not baseline_first:
            raw_write_s = _timed_raw_write(raw_path, batches, fsync)
        size = log.size_bytes
        append = {
            "batch_records": batch_records,
            "fsync": fsync,
            "appends": len(batches),
            "records": len(batches) * batch_records,
            "bytes": size,
            "segments": len(log.segments),
            "append_s": append_s,
            "raw_write_s": raw_write_s,
        }
        read = None
        if not fsync:
            raw_bytes, raw_read_s = _timed_raw_read(raw_path)
            _, read_bytes_s = _timed_read_bytes(log)
            records, read_records_s = _timed_read_records(log)
            read = {
                "batch_records": batch_records,
                "bytes": size,
                "records": records,
                "read_bytes_s": read_bytes_s,
                "read_records_s": read_records_s,
                "raw_read_s": raw_read_s,
            }
        return append, read
    finally:
        if log is not None:
            log.close()
        shutil.rmtree(log_dir, ignore_errors=True)
        raw_path.unlink(missing_ok=True)


def _one_run(
    settings: Settings, work_dir: Path, pools: dict[int, list[bytes]], run_index: int
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    appends: list[dict[str, Any]] = []
    reads: list[dict[str, Any]] = []
    for batch_records in BATCH_RECORDS:
        pool = pools[batch_records]
        batch_bytes = len(pool[0])
        for fsync in (False, True):
            if fsync:
                count = min(settings.fsync_bytes // batch_bytes, settings.fsync_appends_max)
            else:
                count = settings.total_bytes // batch_bytes
            batches = [pool[i % len(pool)] for i in range(max(1, count))]
            # Alternate which goes first so neither side always meets a warmer cache or
            # the other's writeback.
            append, read = _measure_case(
                work_dir, batches, batch_records, fsync, baseline_first=run_index % 2 == 0
            )
            appends.append(append)
            if read is not None:
                reads.append(read)
    return appends, reads


# --------------------------------------------------------------------------- figures


def _append_figures(raw: dict[str, Any]) -> dict[str, float]:
    return {
        "append_mb_s": raw["bytes"] / raw["append_s"] / MB,
        "append_records_s": raw["records"] / raw["append_s"],
        "append_us": raw["append_s"] / raw["appends"] * 1e6,
        "raw_write_mb_s": raw["bytes"] / raw["raw_write_s"] / MB,
        "append_vs_raw_pct": raw["raw_write_s"] / raw["append_s"] * 100,
    }


def _read_figures(raw: dict[str, Any]) -> dict[str, float]:
    return {
        "read_bytes_mb_s": raw["bytes"] / raw["read_bytes_s"] / MB,
        "read_records_mb_s": raw["bytes"] / raw["read_records_s"] / MB,
        "read_records_records_s": raw["records"] / raw["read_records_s"],
        "raw_read_mb_s": raw["bytes"] / raw["raw_read_s"] / MB,
        "read_bytes_vs_raw_pct": raw["raw_read_s"] / raw["read_bytes_s"] * 100,
    }


_DESCRIPTORS = ("batch_records", "fsync", "appends", "records", "bytes", "segments")


def _medians(rows_per_run: list[list[dict[str, Any]]], figures: Any) -> list[dict[str, Any]]:
    """Per case: its descriptors, then the median over runs of each derived figure."""
    medians = []
    for case_rows in zip(*rows_per_run, strict=True):
        derived = [figures(row) for row in case_rows]
        row = {k: v for k, v in case_rows[0].items() if k in _DESCRIPTORS}
        for key in derived[0]:
            row[key] = statistics.median(d[key] for d in derived)
        medians.append(row)
    return medians


def _find(rows: list[dict[str, Any]], batch_records: int, fsync: bool | None) -> dict[str, Any]:
    for row in rows:
        if row["batch_records"] == batch_records and (fsync is None or row["fsync"] == fsync):
            return row
    raise KeyError((batch_records, fsync))


def _targets(append: list[dict[str, Any]], read: list[dict[str, Any]]) -> list[dict[str, Any]]:
    checks = [
        (
            f"append {TARGET_BATCH_APPEND} x 1 KiB batches, no fsync, as % of raw os.write",
            _find(append, TARGET_BATCH_APPEND, False)["append_vs_raw_pct"],
            APPEND_VS_RAW_PCT_MIN,
            "%",
        ),
        (
            f"raw-bytes read of {TARGET_BATCH_READ}-record batches from the page cache",
            _find(read, TARGET_BATCH_READ, None)["read_bytes_mb_s"],
            READ_BYTES_MB_S_MIN,
            "MB/s",
        ),
        (
            f"append {TARGET_BATCH_FSYNC}-record batches with fsync per append",
            _find(append, TARGET_BATCH_FSYNC, True)["append_records_s"],
            FSYNC_RECORDS_S_MIN,
            "records/s",
        ),
    ]
    return [
        {"name": name, "value": value, "target": target, "unit": unit, "passed": value >= target}
        for name, value, target, unit in checks
    ]


# --------------------------------------------------------------------------- output


def _print_setup(setup: dict[str, Any], out: TextIO) -> None:
    same = "same filesystem as" if setup["same_filesystem_as_cwd"] else "NOT the filesystem of"
    fsync_case = f"min({setup['fsync_bytes'] / MiB:g} MiB, {setup['fsync_appends_max']} appends)"
    lines = [
        "dmq log benchmark (bench/log_bench.py)" + ("  [--quick]" if setup["quick"] else ""),
        f"  python      {setup['python']}",
        f"  cpu         {setup['cpu']}; load average {setup['load_average_start']} at start",
        f"  directory   {setup['directory']}",
        f"  filesystem  {setup['filesystem']}; {same} the working directory {setup['cwd']}",
        f"  records     {setup['key_bytes']} B key + {setup['value_bytes']} B value, no headers, "
        f"codec none: {setup['record_bytes_on_disk']} B per record on disk, "
        f"+{setup['batch_header_bytes']} B per batch",
        f"  batches     {', '.join(map(str, setup['batch_records']))} records, encoded before "
        "timing",
        f"  volume      {setup['total_bytes'] / MiB:g} MiB per case without fsync; "
        f"{fsync_case} per case with fsync per append",
        f"  runs        {setup['runs']} (tables show medians; ratios are medians of per-run "
        "ratios)",
        f"  log         segment_bytes {setup['segment_bytes'] // MiB} MiB, index_interval_bytes "
        f"{setup['index_interval_bytes']} B; reads of max_bytes "
        f"{setup['read_max_bytes'] // KiB} KiB from the page cache",
        "  units       MB = 10^6 bytes of batches as stored (headers included)",
        "  page cache  each timed write follows a write+delete of as many bytes, so it "
        "writes into memory the VM has not handed back to the host",
    ]
    print("\n".join(lines), file=out, flush=True)


def _notes(result: dict[str, Any]) -> list[str]:
    """Other batch sizes under the same thresholds: not targets, but worth seeing."""
    notes = []
    for r in result["append"]:
        pct = r["append_vs_raw_pct"]
        other = not r["fsync"] and r["batch_records"] != TARGET_BATCH_APPEND
        if other and pct < APPEND_VS_RAW_PCT_MIN:
            notes.append(
                f"append of {r['batch_records']}-record batches, no fsync, is "
                f"{pct:.1f}% of raw os.write (below the {APPEND_VS_RAW_PCT_MIN:.0f}% "
                "threshold; not a target)"
            )
    over = [r for r in result["append"] if r["append_vs_raw_pct"] > 100]
    if over:
        notes.append(_over_raw_note(over, result["setup"]["runs"]))
    for r in result["read"]:
        mb_s = r["read_bytes_mb_s"]
        if r["batch_records"] != TARGET_BATCH_READ and mb_s < READ_BYTES_MB_S_MIN:
            notes.append(
                f"raw-bytes read of {r['batch_records']}-record batches is {mb_s:,.1f} MB/s "
                f"(below the {READ_BYTES_MB_S_MIN:,.0f} MB/s threshold; not a target)"
            )
    return notes


def _over_raw_note(over: list[dict[str, Any]], runs: int) -> str:
    """Why `% raw` can pass 100 %: the log does the same write (one writev of the batch)
    plus its own work, so it is not faster than the disk; the baseline's timing was slowed
    more than the log's. Three consecutive `--quick` runs on a shared 2-core machine gave
    52-122 % (1000-record batches, no fsync) and 89-228 % (with fsync: 3 appends)."""
    cases = ", ".join(
        f"{r['batch_records']}-record batches{' with fsync' if r['fsync'] else ''} "
        f"({r['appends']} appends)"
        for r in over
    )
    few = " in one run of few appends (--quick)" if runs == 1 else ""
    return (
        f"% raw above 100 for {cases}: not a log that writes faster than os.write (it makes the "
        f"same write plus its own work) but timing noise{few}: the baseline's one timing was "
        "slowed more (other processes, page-cache reclaim, the device queue); compare the "
        "medians of a full run (3 runs of 256 MiB)"
    )


def _print_tables(result: dict[str, Any], out: TextIO) -> None:
    print("\nappend (PartitionLog.append) vs raw os.write of the same bytes", file=out)
    print(
        f"{'batch':>6} {'fsync':>5} {'appends':>8} {'MiB':>7} {'MB/s':>8} {'records/s':>11} "
        f"{'us/append':>10} {'raw MB/s':>9} {'% raw':>6}",
        file=out,
    )
    for r in result["append"]:
        print(
            f"{r['batch_records']:>6} {'yes' if r['fsync'] else 'no':>5} {r['appends']:>8} "
            f"{r['bytes'] / MiB:>7.1f} {r['append_mb_s']:>8.1f} {r['append_records_s']:>11,.0f} "
            f"{r['append_us']:>10.1f} {r['raw_write_mb_s']:>9.1f} {r['append_vs_raw_pct']:>5.1f}%",
            file=out,
        )
    print("\nread from the page cache (max_bytes 1 MiB per read) vs raw os.pread", file=out)
    print(
        f"{'batch':>6} {'MiB':>7} {'read_bytes MB/s':>16} {'% raw':>6} "
        f"{'read_records MB/s':>18} {'records/s':>11} {'raw pread MB/s':>15}",
        file=out,
    )
    for r in result["read"]:
        print(
            f"{r['batch_records']:>6} {r['bytes'] / MiB:>7.1f} {r['read_bytes_mb_s']:>16.1f} "
            f"{r['read_bytes_vs_raw_pct']:>5.1f}% {r['read_records_mb_s']:>18.1f} "
            f"{r['read_records_records_s']:>11,.0f} {r['raw_read_mb_s']:>15.1f}",
            file=out,
        )
    print("\ntargets", file=out)
    for t in result["targets"]:
        verdict = "PASS" if t["passed"] else "FAIL"
        short = t["target"] - t["value"]
        unit = "points" if t["unit"] == "%" else t["unit"]
        below_pct = short / t["target"] * 100
        gap = "" if t["passed"] else f": short by {short:,.1f} {unit}, {below_pct:.0f}% below"
        print(
            f"  {verdict}  {t['name']}: {t['value']:,.1f} {t['unit']} "
            f"(target >= {t['target']:,.0f} {t['unit']}){gap}",
            file=out,
        )
    for note in _notes(result):
        print(f"  note  {note}", file=out)
    print(
        f"\ntotal time {result['seconds']:.1f} s; load average {result['load_average_end']} "
        "at end (1, 5, 15 min)",
        file=out,
        flush=True,
    )


# --------------------------------------------------------------------------- entry points


def run(args: argparse.Namespace, out: TextIO | None = None) -> dict[str, Any]:
    """Run the benchmark, print its setup and then its tables; return every figure.

    The result holds "setup", "append" and "read" (one row of medians per case),
    "targets" (name, value, target, unit, passed) and "runs" (the raw timings of each run).
    """
    out = sys.stdout if out is None else out
    settings = _settings(args)
    started = time.perf_counter()
    parent = _work_parent(settings.directory)
    free = shutil.disk_usage(parent).free
    if free < FREE_SPACE_FACTOR * settings.total_bytes:
        raise ValueError(
            f"{parent} has {free // MiB} MiB free; the benchmark needs "
            f"{FREE_SPACE_FACTOR * settings.total_bytes // MiB} MiB"
        )
    work_dir = Path(tempfile.mkdtemp(prefix="dmq-bench-", dir=parent))
    try:
        setup = _setup(settings, work_dir)
        _print_setup(setup, out)
        pools = {n: _encode_pool(n, settings.total_bytes, seed=n) for n in BATCH_RECORDS}
        runs = []
        for index in range(settings.runs):
            run_started = time.perf_counter()
            appends, reads = _one_run(settings, work_dir, pools, index)
            runs.append({"append": appends, "read": reads})
            print(
                f"  run {index + 1}/{settings.runs}: {time.perf_counter() - run_started:.1f} s",
                file=out,
                flush=True,
            )
    finally:
        shutil.rmtree(work_dir, ignore_errors=True)
    append = _medians([r["append"] for r in runs], _append_figures)
    read = _medians([r["read"] for r in runs], _read_figures)
    result: dict[str, Any] = {
        "setup": setup,
        "append": append,
        "read": read,
        "targets": _targets(append, read),
        "runs": runs,
        "seconds": time.perf_counter() - started,
        "load_average_end": _load_average(),
    }
    _print_tables(result, out)
    if settings.json_path is not None:
        settings.json_path.write_text(json.dumps(result, indent=2) + "\n")
    return result


def main(argv: Sequence[str] | None = None) -> int:
    try:
        run(parse_args(argv))
    except ValueError as exc:
        print(f"log_bench: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
