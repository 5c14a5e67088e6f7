"""results.json, the one-line summary and the latency plot of a run."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from jepsen.checker import Verdict
from jepsen.history import Op, pairs
from jepsen.nemesis import MEMBERSHIP, Fault

EXAMPLES_MAX = 3
COLOURS = {
    "partition": "tab:red",
    "kill": "tab:purple",
    "pause": "tab:orange",
    "power": "tab:gray",
    "reassign": "tab:green",
    "join": "tab:cyan",
    "leave": "tab:brown",
    "clock": "tab:olive",
    "disk": "tab:pink",
    "disk-full": "tab:blue",
    "upgrade": "gold",
}


def percentiles(values: list[float]) -> dict[str, float]:
    if not values:
        return {}
    ordered = sorted(values)

    def at(q: float) -> float:
        return round(ordered[min(len(ordered) - 1, math.ceil(q * len(ordered)) - 1)] * 1000, 2)

    return {"p50_ms": at(0.5), "p90_ms": at(0.9), "p99_ms": at(0.99), "max_ms": at(1.0)}


def latencies(ops: list[Op]) -> dict[str, dict[str, float]]:
    by_f: dict[str, list[float]] = {}
    for pair in pairs(ops):
        if pair.complete is not None and pair.type == "ok" and pair.invoke.f in ("send", "poll"):
            by_f.setdefault(pair.invoke.f, []).append(pair.complete.time - pair.invoke.time)
    return {f: percentiles(values) for f, values in by_f.items()}


def unavailability(ops: list[Op], faults: list[Fault]) -> list[dict[str, Any]]:
    """Per fault window: the longest stretch without an acknowledged send from its start
    until 30 s after its stop or the next window's start, whichever comes first
    (seconds), from the acks' completion times. (Until 30 s after the stop only, a
    window was charged with the next one's stretch: three bridge windows 12 s apart
    reported 4.83, 4.83, 4.38 s for stretches of 1.32, 4.83 and 4.38 s.)"""
    acks = sorted(op.time for op in ops if op.f == "send" and op.type == "ok")
    starts = sorted(f.start for f in faults)
    out = []
    for fault in faults:
        stop = fault.stop if fault.stop is not None else (acks[-1] if acks else fault.start)
        end = min([stop + 30.0, *(s for s in starts if s > fault.start)])
        points = [fault.start, *[t for t in acks if fault.start < t < end]]
        gaps = [b - a for a, b in zip(points, points[1:], strict=False)]
        longest = max(gaps, default=stop - fault.start)
        out.append(
            {
                "fault": f"{fault.kind}/{fault.variant}",
                "targets": fault.targets,
                "start_s": round(fault.start, 2),
                "stop_s": None if fault.stop is None else round(fault.stop, 2),
                "longest_without_ack_s": round(longest, 2),
            }
        )
    return out


def results(
    verdicts: dict[str, Verdict],
    valid: str,
    ops: list[Op],
    faults: list[Fault],
    setup: dict[str, Any],
) -> dict[str, Any]:
    anomalies = {
        f"{name}:{kind}": {"count": len(found), "examples": found[:EXAMPLES_MAX]}
        for name, verdict in verdicts.items()
        for kind, found in sorted(verdict.anomalies.items())
    }
    return {
        "valid": valid,
        **setup,
        "anomalies": anomalies,
        "checkers": {name: {"valid": v.valid, "stats": v.stats} for name, v in verdicts.items()},
        "latency": latencies(ops),
        "unavailability": unavailability(ops, faults),
        "membership": membership(faults),
        "operations": len(ops),
    }


def membership(faults: list[Fault]) -> list[dict[str, Any]]:
    """Every join, leave and voter change: node (the first target), targets, start and
    end (seconds), outcome (joined, left, changed, refused, failed, skipped, unfinished)
    and its details."""
    return [
        {
            "kind": f.kind,
            "node": f.targets[0] if f.targets else None,
            "targets": f.targets,  # a voter change's target set
            "start_s": round(f.start, 2),
            "stop_s": None if f.stop is None else round(f.stop, 2),
            **f.detail,
        }
        for f in faults
        if f.kind in MEMBERSHIP
    ]


def summary_line(doc: dict[str, Any], directory: Path) -> str:
    counts = " ".join(f"{k}={v['count']}" for k, v in doc["anomalies"].items()) or "none"
    first = next(iter(doc["anomalies"].values()), None)
    example = f" first: {json.dumps(first['examples'][0])[:300]}" if first else ""
    stats = doc["checkers"].get("log", {}).get("stats", {})
    done = [m.get("outcome") for m in doc.get("membership", [])]
    members = f"joined={done.count('joined')} left={done.count('left')} " if done else ""
    return (
        f"jepsen: {doc['valid'].upper()} seed={doc['seed']} nodes={doc['nodes']} "
        f"nemesis={','.join(doc['nemesis']) or 'none'} planted_bug={doc['planted_bug'] or 'none'} "
        f"sends={stats.get('sends', 0)} ok={stats.get('sends_ok', 0)} "
        f"polls={stats.get('polls', 0)} {members}anomalies: {counts}{example} -> {directory}"
    )


def plot(ops: list[Op], faults: list[Fault], path: Path) -> None:
    """Latency of every completed send and poll over time, log scale, fault windows
    shaded by kind, as Jepsen's latency-raw plot."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(12, 5))
    markers = {"ok": "o", "info": "x", "fail": "v"}
    for f, colour in (("send", "tab:blue"), ("poll", "tab:green")):
        for type_, marker in markers.items():
            points = [
                (p.invoke.time, max(p.end - p.invoke.time, 1e-4) * 1000)
                for p in pairs(ops)
                if p.invoke.f == f and p.type == type_ and p.complete is not None
            ]
            if points:
                xs, ys = zip(*points, strict=True)
                ax.scatter(
                    xs, ys, s=4, marker=marker, color=colour, label=f"{f} {type_}", alpha=0.6
                )
    end = max((op.time for op in ops), default=1.0)
    shown: set[str] = set()
    for fault in faults:
        label = None if fault.kind in shown else fault.kind
        shown.add(fault.kind)
        stop = fault.stop if fault.stop is not None else end
        colour = COLOURS.get(fault.kind, "tab:gray")
        if fault.kind in MEMBERSHIP:  # long, overlapping: a line at each end, named
            if fault.targets:
                ax.axvline(fault.start, color=colour, linestyle="--", label=label)
                ax.axvline(stop, color=colour, linestyle=":")
                outcome = fault.detail.get("outcome", "?")
                ax.annotate(
                    f"{fault.kind} {fault.targets[0]}: {outcome}",
                    (fault.start, 1.0),
                    xycoords=("data", "axes fraction"),
                    rotation=90,
                    fontsize="x-small",
                    va="top",
                    color=colour,
                )
            continue
        ax.axvspan(fault.start, stop, color=colour, alpha=0.15, label=label)
    ax.set_yscale("log")
    ax.set_xlabel("time (s)")
    ax.set_ylabel("latency (ms)")
    ax.set_title("dmq jepsen: operation latency, fault windows shaded, joins and leaves as lines")
    ax.legend(loc="upper right", fontsize="small", markerscale=3)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
