"""The most one write per replica could give (#22): this tree against a copy of it whose
partition log never writes a batch's bytes, the two alternated in one run.

`python -m bench.ceiling_bench [--runs 3] [--seconds 8] [--durability fsync|none]`

A broker writes each produced batch twice: into its Raft journal (fdatasync'ed before any
answer), then, once committed, into the partition's segment (raft/README.md, "How the
broker uses it, and what is left"). The design that stores it once is not built. Before
building it, this measures its ceiling: the copy ("one write") is this tree with one
line of log/segment.py changed so that `Segment.append_parts` counts the batch as written
without calling `os.writev`. The journal, the apply, the offsets, the checkpoint records,
the write-back kicks and every answer are unchanged; only the segment's bytes never reach
the page cache or the disk. No real design can do better than leaving the write out, so
its figures bound what one write per replica could reach on this machine. The copy's data
cannot be read back: it is a benchmark, never a broker to run.

Each run starts fresh brokers from each tree in turn (a tree's brokers import that tree:
bench/tree.py) and measures, for `--seconds` after a warm-up, closed loops of binary
acks=all batches of 1 KiB records to partition 0's leader:
- 3 nodes, 128-record batches, 8 in flight (`dmq bench --nodes 3`'s batched shape);
- 1 node, the same;
- 1 node, 1000-record batches, 4 in flight (`dmq bench broker`'s binary produce),
  against `PartitionLog.append` of the same batches with fsync per append in the same run
  (`dmq bench broker`'s baseline).
Each figure also reports the bytes of the brokers' segment files, which proves which tree
ran: the "one write" brokers' stay empty.

Read the figures with the machine's memory in mind (`memory_state`, printed with them). On
a VM that hands free memory back to its host, a run that grows the page cache into free
memory pays the host's page faults for every segment byte, and the copy pays none: the
gain it shows there is more than one write per replica could give, since that design
still writes each batch into the segment's pages. Only a run with the page cache full
(as on a broker that has run for a while) bounds the design. The baseline is warmed as in
`dmq bench broker` (as many bytes written and deleted just before it).
"""

from __future__ import annotations

import argparse
import asyncio
import compileall
import contextlib
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import aiohttp

from bench.broker_bench import baseline_append
from bench.cluster_bench import closed_loop, create_topic, dmq_cluster, records, wait_leader
from bench.memory import memory_state
from bench.tree import TREE_ROOT
from log.records import encode_batch

# The one line the "one write" copy changes (log/segment.py, Segment.append_parts).
WRITE_LINE = "written = os.writev(self.fd, parts)"
NO_WRITE_LINE = "written = expected  # bench/ceiling_bench.py: the segment's write left out"
TREES = ("as-is", "one-write")
# (nodes, records per batch, requests in flight)
SHAPES: tuple[tuple[int, int, int], ...] = ((3, 128, 8), (1, 128, 8), (1, 1000, 4))
WARMUP_S = 1.5
CHILD_STOP_S = 15.0  # a child asked to stop, before its process group is killed


def copy_tree(destination: Path, *, one_write: bool) -> Path:
    """This tree's top-level Python packages, copied (and patched for "one write")."""
    destination.mkdir(parents=True)
    for package in sorted(TREE_ROOT.iterdir()):
        if (package / "__init__.py").is_file() and package.name not in ("tests", "jepsen"):
            shutil.copytree(package, destination / package.name,
                            ignore=shutil.ignore_patterns("__pycache__"))  # fmt: skip
    if one_write:
        segment = destination / "log" / "segment.py"
        text = segment.read_text()
        if text.count(WRITE_LINE) != 1:
            raise RuntimeError(f"{segment}: the line to change is gone: {WRITE_LINE!r}")
        segment.write_text(text.replace(WRITE_LINE, NO_WRITE_LINE))
    # Compiled once here, not by each of the ~50 processes a run starts from the copy.
    compileall.compile_dir(destination, quiet=1)
    return destination


def segment_bytes(data_dir: Path) -> int:
    """Bytes of the brokers' segment files (`<20-digit base offset>.log`; each broker's
    own output is `n1.log` beside them)."""
    return sum(p.stat().st_size for p in data_dir.rglob("*.log")
               if p.stem.isdigit() and len(p.stem) == 20 and p.is_file())  # fmt: skip


async def _measure(work_dir: Path, nodes: int, batch_records: int, in_flight: int,
                   seconds: float, durability: str) -> dict[str, Any]:  # fmt: skip
    batches = [encode_batch(records(batch_records, i * batch_records)) for i in range(32)]
    with dmq_cluster(work_dir, nodes, durability) as brokers:
        connector = aiohttp.TCPConnector(limit=100)
        async with aiohttp.ClientSession(connector=connector) as session:
            await create_topic(session, brokers[0].url, "ceiling", 1, nodes)
            leader = await wait_leader(session, brokers, "ceiling")
            await closed_loop(session, leader.url, "ceiling", batches, in_flight, WARMUP_S)
            elapsed, requests, nbytes, _ = await closed_loop(
                session, leader.url, "ceiling", batches, in_flight, seconds
            )
    return {"mb_s": nbytes / elapsed / 1e6, "requests": requests,
            "segment_bytes": segment_bytes(work_dir)}  # fmt: skip


def _baseline_mb_s(work_dir: Path) -> float:
    batches = [encode_batch(records(1000, i * 1000)) for i in range(256)]
    return baseline_append(work_dir / "baseline", batches)


def _child(spec: dict[str, Any]) -> None:
    """Runs inside a tree (started with that tree as its working directory)."""
    work_dir = Path(spec["work_dir"])
    if spec.get("baseline"):
        result: dict[str, Any] = {"mb_s": _baseline_mb_s(work_dir)}
    else:
        result = asyncio.run(_measure(work_dir, spec["nodes"], spec["batch_records"],
                                      spec["in_flight"], spec["seconds"], spec["durability"]))  # fmt: skip
    print(json.dumps(result))


def _in_tree(tree: Path, spec: dict[str, Any]) -> dict[str, Any]:
    """One phase in a child started in `tree` (its brokers import that tree), in a process
    group of its own: interrupted, the child and every broker it started are stopped."""
    child = subprocess.Popen(
        [sys.executable, "-m", "bench.ceiling_bench", "--child", json.dumps(spec)],
        cwd=tree, env={**os.environ, "PYTHONPATH": str(tree)},
        stdout=subprocess.PIPE, text=True, start_new_session=True,
    )  # fmt: skip
    try:
        out, _ = child.communicate()
    except BaseException:
        _stop_group(child)
        raise
    if child.returncode != 0:  # its traceback and the brokers' log tails are on stderr
        raise RuntimeError(f"a phase in {tree} failed (exit {child.returncode}): {spec}")
    result: dict[str, Any] = json.loads(out.strip().splitlines()[-1])
    return result


def _stop_group(child: subprocess.Popen[str]) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(child.pid, signal.SIGTERM)
    with contextlib.suppress(subprocess.TimeoutExpired):
        child.wait(CHILD_STOP_S)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(child.pid, signal.SIGKILL)  # brokers left behind, if any
    child.wait()


def run(args: argparse.Namespace) -> dict[str, Any]:
    if args.quick:
        args.runs, args.seconds = 1, 1.5
    shapes = SHAPES[1:] if args.quick else SHAPES
    print(f"ceiling of one write per replica: {args.runs} runs, {args.seconds} s each after "
          f"{WARMUP_S} s of warm-up, durability {args.durability}, 1 KiB records, acks=all; "
          f"{os.cpu_count()} cores shared by the brokers and this client; "
          f"load average {os.getloadavg()[0]:.1f}; {memory_state()}")  # fmt: skip
    figures: dict[str, dict[str, list[float]]] = {tree: {} for tree in TREES}
    segments: dict[str, list[int]] = {tree: [] for tree in TREES}
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp_name:
        tmp = Path(tmp_name).resolve()  # absolute: each child runs in its tree's root
        trees = {tree: copy_tree(tmp / tree, one_write=tree == "one-write")
                 for tree in TREES}  # fmt: skip
        for run_index in range(args.runs):
            order = TREES if run_index % 2 == 0 else TREES[::-1]
            for nodes, batch_records, in_flight in shapes:
                key = f"{nodes} node{'s' if nodes > 1 else ''}, {batch_records} x 1 KiB, {in_flight} in flight"
                for tree in order:
                    spec = {"work_dir": str(tmp / f"data-{tree}-{run_index}-{key[:1]}{batch_records}"),
                            "nodes": nodes, "batch_records": batch_records, "in_flight": in_flight,
                            "seconds": args.seconds, "durability": args.durability}  # fmt: skip
                    result = _in_tree(trees[tree], spec)
                    figures[tree].setdefault(key, []).append(result["mb_s"])
                    segments[tree].append(result["segment_bytes"])
                    shutil.rmtree(spec["work_dir"], ignore_errors=True)
                    print(f"  run {run_index + 1} {tree:9s} {key}: {result['mb_s']:.1f} MB/s "
                          f"(segment files {result['segment_bytes'] / 1e6:.1f} MB)", flush=True)  # fmt: skip
            baseline = _in_tree(trees["as-is"], {"work_dir": str(tmp / f"base-{run_index}"),
                                                 "baseline": True})  # fmt: skip
            figures["as-is"].setdefault("PartitionLog.append, fsync", []).append(baseline["mb_s"])
            shutil.rmtree(tmp / f"base-{run_index}", ignore_errors=True)
    medians = {tree: {k: statistics.median(v) for k, v in f.items()} for tree, f in figures.items()}
    result: dict[str, Any] = {"medians_mb_s": medians, "runs_mb_s": figures,
                              "segment_bytes": segments, "load_end": os.getloadavg()[0]}  # fmt: skip
    three, one = "3 nodes, 128 x 1 KiB, 8 in flight", "1 node, 128 x 1 KiB, 8 in flight"
    binary, base = (
        "1 node, 1000 x 1 KiB, 4 in flight",
        medians["as-is"]["PartitionLog.append, fsync"],
    )
    print(f"medians (MB/s), load average at the end {result['load_end']:.1f}; {memory_state()}:")
    for key in medians["as-is"]:
        line = f"  {key}: as-is {medians['as-is'][key]:.1f}"
        if key in medians["one-write"]:
            gain = medians["one-write"][key] / medians["as-is"][key]
            line += f", one write {medians['one-write'][key]:.1f} ({gain:.2f}x)"
        print(line)
    for tree in TREES:
        m = medians[tree]
        ratios = {"binary_of_baseline": m[binary] / base}
        if three in m:
            ratios["three_over_one"] = m[three] / m[one]
        result[f"{tree}_ratios"] = ratios
        print(f"  {tree}: " + ", ".join(f"{k} {v:.2f}" for k, v in ratios.items()))
    return result


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--runs", type=int, default=3, help="runs; medians are shown (3)")
    parser.add_argument("--seconds", type=float, default=8.0, help="each phase (8)")
    parser.add_argument("--durability", choices=("fsync", "none"), default="fsync")
    parser.add_argument("--dir", default=None, help="where the trees and data go (a temp dir)")
    parser.add_argument("--quick", action="store_true", help="one short run, 1 node only (CI)")
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    add_arguments(parser)
    args = parser.parse_args(argv)
    if args.child is not None:
        _child(json.loads(args.child))
        return 0
    # Stopped by SIGTERM (a timeout, a CI runner) as by Ctrl-C: the phase's child and its
    # brokers are stopped and the trees and data removed on the way out.
    signal.signal(signal.SIGTERM, _exit_on_sigterm)
    run(args)
    return 0


def _exit_on_sigterm(signum: int, frame: object) -> None:
    raise SystemExit(128 + signum)


if __name__ == "__main__":
    sys.exit(main())
