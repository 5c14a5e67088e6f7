"""`python -m jepsen.power`: the harness's detection power, measured.

    python -m jepsen.power --bug ack-before-commit --seeds 10
    python -m jepsen.power --bug none --seeds 10        # the correct build
    python -m jepsen.power --bug all --seeds 10         # every planted bug, then none

For each build (a planted bug of dmq/planted.py, or `none`) it runs `python -m
jepsen.run` on seeds 1..N one after another (never two at once: the machine is shared),
each with the same setup (3 nodes, the default nemesis set, 45 s) plus the workloads
that bug needs (WORKLOADS: a bug of the share group, the transactions, delayed
delivery or tiered storage shows only while that workload runs; the correct build runs
with every workload any bug needs, so "valid on every seed" covers them all), and prints
a table: for a planted bug how many seeds ended invalid (the bug was caught), for the
correct build how many ended valid, and per run the anomalies that caught it. A run that ends
unknown (a harness error) counts as neither: it is shown in its own column, and the
power is counted over every run, so an unknown lowers it.

Each run's directory is `<dir>/<build>-seed<N>/` (history, results.json, broker logs);
`<dir>/power.json` holds every row, written after each run (an interrupted measurement
keeps what it measured). Exit status 0 when every planted bug was caught on at least
`--target` of its runs and the correct build was valid on all of its runs, else 1.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from dmq.planted import PLANTED_BUGS

CORRECT = "none"
DEFAULT_NEMESIS = "partition,kill,pause,power"
RUN_SLACK_S = 600.0  # beyond the time limit: start, heal, final reads, checkers
STOP_GRACE_S = 60.0  # after SIGTERM, for the run to heal and kill its brokers
STORE = Path("jepsen") / "store"

# The jepsen.run workloads beyond the log and consumer-group ones (always on) that each
# planted bug needs to show: option -> value (an int count, or True for a flag). A bug not
# listed needs none. The correct build gets the union (the largest count of each).
WORKLOADS: dict[str, dict[str, int | bool]] = {
    "delay-early": {"--delay-workers": 1},
    "read-committed-leak": {"--txn-workers": 3, "--ctp": True},
    "share-double-delivery": {"--share-workers": 3},
    "tiered-delete-before-upload": {"--tiered": True},
    "txn-partial-markers": {"--txn-workers": 3, "--ctp": True},
}


@dataclass(frozen=True, slots=True)
class Row:
    """One run: the build, its seed and what the checkers said."""

    bug: str  # a planted bug's name, or "none"
    seed: int
    valid: str  # valid | invalid | unknown
    anomalies: dict[str, int]  # "checker:anomaly" -> count
    faults: list[str]  # kind/variant of each fault window, in order
    wall_s: float
    harness_error: str | None = None
    directory: str = ""
    sends: int = 0  # the log workload's sends, and those acknowledged
    sends_ok: int = 0


@dataclass(frozen=True, slots=True)
class Power:
    """A build's totals over its runs."""

    bug: str
    runs: int
    invalid: int
    valid: int
    unknown: int

    @property
    def hits(self) -> int:
        """Runs that ended as they should: invalid for a planted bug, valid for none."""
        return self.valid if self.bug == CORRECT else self.invalid

    @property
    def fraction(self) -> float:
        return self.hits / self.runs if self.runs else 0.0


def row_from_results(bug: str, seed: int, doc: dict[str, Any], wall_s: float) -> Row:
    """A row from a run's results.json."""
    log = doc.get("checkers", {}).get("log", {}).get("stats", {})
    return Row(
        bug=bug,
        seed=seed,
        valid=str(doc.get("valid", "unknown")),
        anomalies={k: int(v["count"]) for k, v in doc.get("anomalies", {}).items()},
        faults=[u["fault"] for u in doc.get("unavailability", [])],
        wall_s=round(wall_s, 1),
        harness_error=doc.get("harness_error"),
        sends=int(log.get("sends", 0)),
        sends_ok=int(log.get("sends_ok", 0)),
    )


def tally(rows: Iterable[Row]) -> list[Power]:
    """Totals per build, in the order the builds first appear."""
    order: dict[str, list[Row]] = {}
    for row in rows:
        order.setdefault(row.bug, []).append(row)
    return [
        Power(
            bug,
            runs=len(found),
            invalid=sum(r.valid == "invalid" for r in found),
            valid=sum(r.valid == "valid" for r in found),
            unknown=sum(r.valid not in ("valid", "invalid") for r in found),
        )
        for bug, found in order.items()
    ]


def caught_by(row: Row) -> str:
    """The anomalies of a run, most frequent first ("none" when there is none)."""
    if not row.anomalies:
        return "none"
    ranked = sorted(row.anomalies.items(), key=lambda kv: (-kv[1], kv[0]))
    return ", ".join(f"{name} {count}" for name, count in ranked)


def power_table(rows: list[Row]) -> str:
    """The summary table (markdown): per build, runs as they should end / runs."""
    lines = [
        "| build | seeds | as it should (invalid for a bug, valid for none) / run | unknown | power |",
        "|---|---|---|---|---|",
    ]
    for p in tally(rows):
        seeds = ",".join(str(r.seed) for r in rows if r.bug == p.bug)
        what = "valid" if p.bug == CORRECT else "invalid"
        lines.append(
            f"| {p.bug} | {seeds} | {p.hits} / {p.runs} {what} | {p.unknown} | "
            f"{100 * p.fraction:.0f} % |"
        )
    return "\n".join(lines)


def runs_table(rows: list[Row]) -> str:
    """One line per run (markdown): verdict, the anomalies that caught it, the faults,
    the log workload's sends (acknowledged)."""
    lines = [
        "| build | seed | result | anomalies (count) | faults that ran | sends (ok) | wall s |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        result = r.valid + (" (harness error)" if r.harness_error else "")
        faults = ", ".join(r.faults) or "none"
        lines.append(
            f"| {r.bug} | {r.seed} | {result} | {caught_by(r)} | {faults} | "
            f"{r.sends} ({r.sends_ok}) | {r.wall_s:.0f} |"
        )
    return "\n".join(lines)


def met(rows: list[Row], target: float) -> bool:
    """Every planted bug caught on at least `target` of its runs, the correct build
    valid on all of its."""
    for p in tally(rows):
        if p.bug == CORRECT and p.valid != p.runs:
            return False
        if p.bug != CORRECT and p.fraction < target:
            return False
    return True


def builds(names: list[str]) -> list[str]:
    """The builds to measure: names, with `all` expanded to every bug and none."""
    out: list[str] = []
    for name in names:
        for build in (*PLANTED_BUGS, CORRECT) if name == "all" else (name,):
            if build not in out:
                out.append(build)
    return out


def workloads_for(bug: str) -> dict[str, int | bool]:
    """The workload options a build runs with: its bug's, or for the correct build every
    bug's (the largest count of each option)."""
    if bug != CORRECT:
        return dict(WORKLOADS.get(bug, {}))
    union: dict[str, int | bool] = {}
    for options in WORKLOADS.values():
        for option, value in options.items():
            union[option] = max(union.get(option, value), value)
    return union


def workload_args(options: dict[str, int | bool]) -> list[str]:
    """jepsen.run arguments for workload options (sorted: one spelling per build)."""
    out: list[str] = []
    for option, value in sorted(options.items()):
        if value is True:
            out.append(option)
        elif value:
            out += [option, str(value)]
    return out


def run_one(args: argparse.Namespace, bug: str, seed: int, workload: Sequence[str] = ()) -> Row:
    """`python -m jepsen.run` for one build and seed with the workload arguments given,
    in a session of its own (so a run that overruns its budget is stopped, brokers
    included)."""
    directory = args.dir / f"{bug}-seed{seed}"
    command = [
        sys.executable, "-m", "jepsen.run",
        "--nodes", str(args.nodes), "--nemesis", args.nemesis,
        "--time-limit-s", str(args.time_limit_s), "--seed", str(seed),
        "--dir", str(directory), *workload, *args.run_arg,
    ]  # fmt: skip
    if bug != CORRECT:
        command += ["--planted-bug", bug]
    started = time.monotonic()
    log = (args.dir / f"{bug}-seed{seed}.out").open("w")
    with log, subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT) as proc:
        try:
            proc.wait(args.time_limit_s + RUN_SLACK_S)
        except subprocess.TimeoutExpired:
            proc.send_signal(signal.SIGTERM)  # the run heals, kills its brokers, reports
            try:
                proc.wait(STOP_GRACE_S)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
    wall_s = time.monotonic() - started
    results = directory / "results.json"
    if not results.exists():
        error = f"no results.json (exit {proc.returncode})"
        return Row(bug, seed, "unknown", {}, [], round(wall_s, 1), error, str(directory))
    row = row_from_results(bug, seed, json.loads(results.read_text()), wall_s)
    return Row(**{**asdict(row), "directory": str(directory)})


def parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m jepsen.power", description=__doc__.split("\n")[0])
    p.add_argument(
        "--bug",
        action="append",
        required=True,
        choices=[*PLANTED_BUGS, CORRECT, "all"],
        help="a planted bug, none (the correct build) or all; repeatable",
    )
    p.add_argument("--seeds", type=int, default=10, help="seeds first..first+N-1")
    p.add_argument("--first-seed", type=int, default=1)
    p.add_argument("--nodes", type=int, default=3)
    p.add_argument("--nemesis", default=DEFAULT_NEMESIS)
    p.add_argument("--time-limit-s", type=float, default=45.0)
    p.add_argument("--target", type=float, default=0.9, help="power each bug must reach")
    p.add_argument(
        "--run-arg",
        action="append",
        default=[],
        help="an extra argument for jepsen.run (repeat; e.g. --run-arg=--idempotent)",
    )
    p.add_argument("--dir", type=Path, default=None, help="default: jepsen/store/power-<time>")
    args = p.parse_args(argv)
    if args.dir is None:
        args.dir = STORE / f"power-{time.strftime('%Y%m%dT%H%M%S')}"
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    args.dir.mkdir(parents=True, exist_ok=True)
    rows: list[Row] = []
    print(
        f"jepsen.power: {args.nodes} nodes, nemesis {args.nemesis}, {args.time_limit_s:g} s, "
        f"seeds {args.first_seed}..{args.first_seed + args.seeds - 1}, pid {os.getpid()} "
        f"-> {args.dir}",
        flush=True,
    )
    for bug in builds(args.bug):
        workload = workload_args(workloads_for(bug))
        print(f"  {bug}: workloads {' '.join(workload) or 'log and groups only'}", flush=True)
        for seed in range(args.first_seed, args.first_seed + args.seeds):
            row = run_one(args, bug, seed, workload)
            rows.append(row)
            print(f"  {bug} seed {seed}: {row.valid}: {caught_by(row)} ({row.wall_s:.0f} s)",
                  flush=True)  # fmt: skip
            (args.dir / "power.json").write_text(
                json.dumps([asdict(r) for r in rows], indent=2) + "\n"
            )
    print(power_table(rows))
    print()
    print(runs_table(rows))
    return 0 if met(rows, args.target) else 1


if __name__ == "__main__":
    sys.exit(main())
