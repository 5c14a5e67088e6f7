"""The fault schedule: drawn up front from the seed, so that every fault kind of
`--nemesis` strikes in every run, the first strike of each kind aimed where a broken
promise shows, and the same seed gives the same schedule.

A schedule is a list of windows on the workload's clock (seconds since the workers
started): quiet, fault, quiet, fault, ..., quiet. Each window holds one fault of a
process or network kind (partition, kill, pause, power), sometimes two of different
kinds (never with power, which strikes every broker), and the background kinds
(reassign, join, leave, voters) ride along with a process or network fault, never with
power (nemesis.py).

How it is drawn (`draw`):

1. Windows: as many as the fault interval fits in the time limit (a fault and a quiet
   period each take `interval_s`, drawn uniformly), and never fewer than the process and
   network kinds: each of those kinds leads one window, in a seeded order, and the
   windows left over are led by a kind drawn at random. Power windows come last: every
   broker restarts after one and the cluster serves again only 5-11 s later on the 2
   shared cores, so a fault aimed at a leader right after it would find none.
2. Variants: the first strike of a kind gets an aimed variant (AIMED: a partition
   leader, a minority holding one, the metadata leader; power cuts every broker), the
   later ones any variant of the kind (VARIANTS). An aimed strike runs alone: a second
   fault beside it could take the majority that must elect a new leader (on 3 nodes, a
   kill beside a cut-off leader leaves no majority anywhere, and its acknowledgements
   survive). A later window gets a second process or network kind (not power) with
   probability PAIR_P, with any variant.
3. Background kinds: each rides along with one window not led by power or disk, drawn
   at random, and with each other such window with probability PAIR_P. They start
   before the window's process and network faults (nemesis.py `start`): a leave or a
   voter change reads the catalogue first, which a kill of every broker would deny it.
4. Times: the 2W + 1 periods (quiet, then fault and quiet W times) are drawn in
   `interval_s` and scaled down together when they overrun the time limit, never below
   FAULT_MIN_S and QUIET_MIN_S; if even those floors overrun it, the windows left over
   are dropped first, then kinds (a 10-s run cannot strike four times).

What a variant targets, and where the workers are pinned meanwhile, is decided when the
window opens (nemesis.py): a leader is whoever leads then. `--nemesis kind:variant`
(`fixed`) gives every strike of that kind that variant, aimed or not (`partition:bridge`:
only bridge partitions); the draws are the same, so the rest of the schedule is too.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

# healed at window end
PROCESS_KINDS = ("partition", "kill", "pause", "power", "disk", "clock", "disk-full", "upgrade")
ALONE_KINDS = ("power", "disk")  # strike every node (or cut files): alone, and last
BACKGROUND_KINDS = ("reassign", "join", "leave", "voters")  # run on in threads

# Every variant of a kind; `ring` needs exactly 5 brokers, `minority-leader` more than
# 3 (with 3 the minority is one node: the same as `leader`).
VARIANTS: dict[str, tuple[str, ...]] = {
    "partition": (
        "one", "majority-minority", "bridge", "leader", "minority-leader",
        "metadata-leader", "ring",
    ),
    "kill": ("one", "minority", "leader", "minority-leader", "metadata-leader", "all"),
    "pause": ("one", "minority", "leader", "minority-leader", "metadata-leader"),
    "power": ("all",),
    "disk": ("one", "leader", "all"),
    "clock": ("one", "leader", "metadata-leader", "all"),
    "disk-full": ("one", "leader", "minority"),
    "upgrade": ("one",),  # a rolling upgrade restarts one broker at a time
}  # fmt: skip
# The first strike of each kind: where acknowledged writes, reads and commits are at
# stake. A partition cuts off a data partition's leader (alone, or in a minority) with
# the clients pinned to it: its acknowledgements and its reads, and the followers' on
# the other partitions it holds, are what a cut tests (the metadata leader's cut comes
# in later windows: it may lead no data partition). Kills and pauses strike a leader,
# a minority holding one, or the metadata leader (the group offsets' keeper).
AIMED: dict[str, tuple[str, ...]] = {
    "partition": ("leader", "minority-leader"),
    "kill": ("leader", "minority-leader", "metadata-leader"),
    "pause": ("leader", "minority-leader", "metadata-leader"),
    "power": ("all",),
    "disk": ("leader", "all"),
    "clock": ("metadata-leader", "all"),  # it stamps the time into group commands
    "disk-full": ("leader",),  # it must hand its leaderships to a broker with space
    "upgrade": ("one",),
}
PAIR_P = 0.3  # a second kind in a window
FAULT_MIN_S = 4.0  # a fault shorter than this ends before a leader steps down (1.5 s) and the
# others elect one (0.4-0.8 s), with time to spare for the clients pinned to the cut side
QUIET_MIN_S = 4.0  # a broker restarted after kill or power needs about this to serve again


@dataclass(frozen=True, slots=True)
class Window:
    """One fault window: [start_s, stop_s) on the workload's clock, and its faults as
    (kind, variant); a background kind's variant is "" (decided when it starts)."""

    start_s: float
    stop_s: float
    faults: tuple[tuple[str, str], ...]

    @property
    def kinds(self) -> tuple[str, ...]:
        return tuple(kind for kind, _ in self.faults)


def variants(kind: str, nodes: int, aimed: bool = False) -> tuple[str, ...]:
    """The variants of `kind` that make sense with `nodes` brokers."""
    found = (AIMED if aimed else VARIANTS)[kind]
    return tuple(
        v
        for v in found
        if not (v == "ring" and nodes != 5) and not (v == "minority-leader" and nodes <= 3)
    )


def _count(leads: int, time_limit_s: float, interval_s: tuple[float, float]) -> int:
    """How many windows: the interval's fill of the time limit, at least `leads`, at
    most what the floors allow."""
    fill = int(time_limit_s // (interval_s[0] + interval_s[1]))
    fit = int((time_limit_s - QUIET_MIN_S) // (FAULT_MIN_S + QUIET_MIN_S))
    return max(0, min(max(leads, fill), fit))


def _times(
    count: int, time_limit_s: float, interval_s: tuple[float, float], rng: random.Random
) -> list[tuple[float, float]]:
    """(start, stop) of `count` windows: periods drawn in interval_s, scaled to fit."""
    periods = [rng.uniform(*interval_s) for _ in range(2 * count + 1)]
    scale = min(1.0, time_limit_s / sum(periods))
    floors = [QUIET_MIN_S if k % 2 == 0 else FAULT_MIN_S for k in range(len(periods))]
    periods = [max(floor, p * scale) for p, floor in zip(periods, floors, strict=True)]
    excess = sum(periods) - time_limit_s
    room = sum(p - f for p, f in zip(periods, floors, strict=True))
    if excess > 0 and room > 0:  # the floors pushed it over: take it from above them
        periods = [p - (p - f) * excess / room for p, f in zip(periods, floors, strict=True)]
    out, clock = [], 0.0
    for k in range(count):
        start = clock + periods[2 * k]
        stop = start + periods[2 * k + 1]
        out.append((round(start, 3), round(stop, 3)))
        clock = stop
    return out


def draw(
    kinds: list[str],
    nodes: int,
    time_limit_s: float,
    interval_s: tuple[float, float],
    seed: int,
    fixed: dict[str, str] | None = None,
) -> list[Window]:
    """The schedule of a run (the module docstring gives the steps); `fixed`: kind ->
    the only variant its strikes take."""
    fixed = fixed or {}
    for kind, variant in fixed.items():
        if variant not in VARIANTS.get(kind, ()):
            raise ValueError(f"unknown variant {kind}:{variant}")
    unknown = set(kinds) - set(PROCESS_KINDS) - set(BACKGROUND_KINDS)
    if unknown:
        raise ValueError(f"unknown fault kinds {sorted(unknown)}")
    rng = random.Random(seed * 7919 + 3)
    leads = [k for k in PROCESS_KINDS if k in kinds]
    background = [k for k in BACKGROUND_KINDS if k in kinds]
    if not leads and not background:
        return []
    count = _count(max(len(leads), 1), time_limit_s, interval_s)
    order = rng.sample(leads, len(leads)) + [
        rng.choice(leads) for _ in range(count - len(leads)) if leads
    ]
    order = order[:count]
    order.sort(key=lambda kind: kind in ALONE_KINDS)  # stable: power and disk last
    faults: list[list[tuple[str, str]]] = []
    seen: set[str] = set()
    for kind in order:
        aimed = kind not in seen
        window = [(kind, fixed.get(kind, rng.choice(variants(kind, nodes, aimed=aimed))))]
        seen.add(kind)
        others = [k for k in leads if k != kind and k not in ALONE_KINDS]
        if kind not in ALONE_KINDS and not aimed and others and rng.random() < PAIR_P:
            other = rng.choice(others)
            window.append((other, fixed.get(other, rng.choice(variants(other, nodes)))))
        faults.append(window)
    if not faults:  # only background kinds: they run alone
        faults = [[] for _ in range(count)]
    _add_background(faults, background, rng)
    return [
        Window(start, stop, tuple(window))
        for (start, stop), window in zip(
            _times(len(faults), time_limit_s, interval_s, rng), faults, strict=True
        )
    ]


def _add_background(
    faults: list[list[tuple[str, str]]], background: list[str], rng: random.Random
) -> None:
    """Each background kind rides with one window not led by power or disk, and with
    each other one with probability PAIR_P."""
    hosts = [w for w in faults if not w or w[0][0] not in ALONE_KINDS]
    if not hosts:
        return
    for kind in background:
        rng.choice(hosts).append((kind, ""))
    for window in hosts:
        for kind in background:
            if kind not in {k for k, _ in window} and rng.random() < PAIR_P:
                window.append((kind, ""))


def describe(schedule: list[Window]) -> str:
    """One line per window, for the run's log."""
    return "\n".join(
        f"  {w.start_s:6.1f}-{w.stop_s:6.1f} s: "
        + ", ".join(f"{k}/{v}" if v else k for k, v in w.faults)
        for w in schedule
    )
