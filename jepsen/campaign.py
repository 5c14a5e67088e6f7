"""`python -m jepsen.campaign --runs N`: N runs of the correct build under every fault, on
seeds drawn at random, one after another, then a summary table.

    python -m jepsen.campaign --runs 100            # make jepsen-campaign N=100
    python -m jepsen.campaign --runs 3 --campaign-seed 7 --time-limit-s 60
    python -m jepsen.campaign --runs 100 --time-limit-s 45 --budget-s 3600   # an hour's worth

Each run is `python -m jepsen.run` with 5 nodes, the full nemesis (FULL_NEMESIS) and the
time limit given; the seeds come from `--campaign-seed` (printed, so a campaign can be
drawn again) and each invalid or unknown run names the seed that reproduces it. Runs
go one at a time (never two at once: the machine is shared). `<dir>/campaign.json`
holds every row, written after each run. Exit status 0 when every run was valid, 1 if
one was invalid, 2 if none was invalid but one ended unknown (a harness error).
With `--budget-s S` no run starts once S seconds have passed since the campaign began
(the run under way ends whole): the campaign stops early, with fewer runs, and says so.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from dataclasses import asdict
from pathlib import Path

from jepsen.power import CORRECT, STORE, Row, caught_by, run_one, runs_table

FULL_NEMESIS = "partition,kill,pause,power,disk,clock,reassign,join,leave,voters"
SEED_MAX = 1 << 31


def draw_seeds(campaign_seed: int, runs: int) -> list[int]:
    """`runs` distinct seeds, the same for the same campaign seed."""
    rng = random.Random(campaign_seed)
    seeds: list[int] = []
    while len(seeds) < runs:
        seed = rng.randrange(1, SEED_MAX)
        if seed not in seeds:
            seeds.append(seed)
    return seeds


def summary(rows: list[Row]) -> str:
    """Counts of each verdict, the fault windows of each kind, the sends (acknowledged),
    each anomaly's total and the seeds to rerun."""
    verdicts = {v: sum(r.valid == v for r in rows) for v in ("valid", "invalid", "unknown")}
    anomalies: dict[str, int] = {}
    kinds: dict[str, int] = {}
    for row in rows:
        for name, count in row.anomalies.items():
            anomalies[name] = anomalies.get(name, 0) + count
        for fault in row.faults:
            kind = fault.partition("/")[0]
            kinds[kind] = kinds.get(kind, 0) + 1
    rerun = [f"{r.seed} ({r.valid})" for r in rows if r.valid != "valid"]
    faults = ", ".join(f"{k} {v}" for k, v in sorted(kinds.items())) or "none"
    sends = f"{sum(r.sends for r in rows)} ({sum(r.sends_ok for r in rows)})"
    lines = [
        "| runs | valid | invalid | unknown | fault windows (by kind) | sends (ok) "
        "| anomalies (total) | seeds to rerun |",
        "|---|---|---|---|---|---|---|---|",
        f"| {len(rows)} | {verdicts['valid']} | {verdicts['invalid']} | {verdicts['unknown']} | "
        f"{faults} | {sends} | "
        + (", ".join(f"{k} {v}" for k, v in sorted(anomalies.items())) or "none")
        + f" | {', '.join(rerun) or 'none'} |",
    ]
    return "\n".join(lines)


def parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m jepsen.campaign", description=__doc__.split("\n")[0]
    )
    p.add_argument("--runs", type=int, required=True)
    p.add_argument("--campaign-seed", type=int, default=None, help="default: drawn, printed")
    p.add_argument("--nodes", type=int, default=5)
    p.add_argument("--nemesis", default=FULL_NEMESIS)
    p.add_argument("--time-limit-s", type=float, default=60.0)
    p.add_argument("--run-arg", action="append", default=[], help="an extra jepsen.run argument")
    p.add_argument(
        "--budget-s",
        type=float,
        default=None,
        help="start no run once this many seconds have passed (default: no limit)",
    )
    p.add_argument("--dir", type=Path, default=None, help="default: jepsen/store/campaign-<time>")
    args = p.parse_args(argv)
    if args.campaign_seed is None:
        args.campaign_seed = random.randrange(SEED_MAX)
    if args.dir is None:
        args.dir = STORE / f"campaign-{time.strftime('%Y%m%dT%H%M%S')}"
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    args.dir.mkdir(parents=True, exist_ok=True)
    seeds = draw_seeds(args.campaign_seed, args.runs)
    print(
        f"jepsen.campaign: {args.runs} runs, campaign seed {args.campaign_seed}, "
        f"{args.nodes} nodes, nemesis {args.nemesis}, {args.time_limit_s:g} s -> {args.dir}",
        flush=True,
    )
    rows: list[Row] = []
    began = time.monotonic()
    for k, seed in enumerate(seeds, 1):
        if args.budget_s is not None and time.monotonic() - began >= args.budget_s:
            print(f"  budget of {args.budget_s:g} s spent: {len(rows)} of {args.runs} runs",
                  flush=True)  # fmt: skip
            break
        row = run_one(args, CORRECT, seed)
        rows.append(row)
        print(f"  {k}/{args.runs} seed {seed}: {row.valid}: {caught_by(row)}", flush=True)
        (args.dir / "campaign.json").write_text(
            json.dumps([asdict(r) for r in rows], indent=2) + "\n"
        )
    print(summary(rows))
    print()
    print(runs_table(rows))
    if any(r.valid == "invalid" for r in rows):
        return 1
    return 2 if any(r.valid != "valid" for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
