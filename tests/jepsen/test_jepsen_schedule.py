"""Proves the fault schedule (jepsen/schedule.py), without brokers:

- every process and network kind of `--nemesis` strikes in every run (seeds 1-300, the
  power measurement's setup: 3 nodes, partition,kill,pause,power, 45 s), and every
  background kind rides along with a non-power fault (5 nodes, the `make jepsen` set);
- the first strike of each kind is aimed (a leader, a minority with a leader, the
  metadata leader; power cuts all) and runs alone, power is never paired with another fault and
  strikes last (the cluster takes longest to serve again after it);
- windows are ordered, inside the time limit, at least FAULT_MIN_S long and at least
  QUIET_MIN_S apart (from the start, too);
- the same seed draws the same schedule, other seeds other ones;
- `--nemesis partition:bridge` (a fixed variant): every partition strike is a bridge, the
  windows are those of plain `partition`, and `jepsen.run` parses it; an unknown variant
  is refused;
- a run too short for every kind keeps what fits (no window below the floors), and
  an empty nemesis draws no window;
- the runner starts and heals each window in order; a wait for leaders before a window
  shifts it and the later ones (every window runs whole, the run overruns by the wait).
"""

from __future__ import annotations

import time

import pytest

from jepsen.schedule import (
    AIMED,
    BACKGROUND_KINDS,
    FAULT_MIN_S,
    QUIET_MIN_S,
    VARIANTS,
    Window,
    draw,
    variants,
)

POWER_SET = ["partition", "kill", "pause", "power"]
MAKE_SET = ["partition", "kill", "pause", "power", "reassign", "join", "leave", "voters"]
EPSILON_S = 1e-6


def check_times(schedule: list[Window], time_limit_s: float) -> None:
    clock = 0.0
    for window in schedule:
        assert window.start_s - clock >= QUIET_MIN_S - EPSILON_S, schedule
        assert window.stop_s - window.start_s >= FAULT_MIN_S - EPSILON_S, schedule
        clock = window.stop_s
    assert clock <= time_limit_s + EPSILON_S


def test_every_kind_strikes_in_every_run_first_aimed() -> None:
    for seed in range(1, 301):
        check_power_setup(seed)


def check_power_setup(seed: int) -> None:
    schedule = draw(POWER_SET, 3, 45.0, (10.0, 15.0), seed)
    leads = [w.faults[0][0] for w in schedule]
    assert sorted(leads) == sorted(POWER_SET), schedule
    first: dict[str, str] = {}
    for window in schedule:
        if window.faults[0][0] not in first:
            assert len(window.faults) == 1, f"an aimed strike runs alone: {window}"
        for kind, variant in window.faults:
            assert variant in variants(kind, 3), (kind, variant)
            first.setdefault(kind, variant)
        if "power" in window.kinds:
            assert window.kinds == ("power",), "power strikes alone"
    assert all(first[k] in AIMED[k] for k in POWER_SET), first
    assert leads[-1] == "power", "power strikes last: a leader is needed before it"
    check_times(schedule, 45.0)


def test_background_kinds_ride_with_a_non_power_fault() -> None:
    for seed in range(1, 101):
        check_make_setup(seed)


def check_make_setup(seed: int) -> None:
    schedule = draw(MAKE_SET, 5, 120.0, (10.0, 15.0), seed)
    kinds = [k for w in schedule for k in w.kinds]
    assert set(kinds) == set(MAKE_SET), schedule
    for window in schedule:
        assert window.faults[0][0] not in BACKGROUND_KINDS, window
        if window.faults[0][0] == "power":
            assert window.kinds == ("power",)
        assert len(set(window.kinds)) == len(window.kinds), window
    check_times(schedule, 120.0)


def test_the_same_seed_draws_the_same_schedule() -> None:
    assert draw(POWER_SET, 3, 45.0, (10.0, 15.0), 12) == draw(POWER_SET, 3, 45.0, (10.0, 15.0), 12)
    drawn = {tuple(draw(POWER_SET, 3, 45.0, (10.0, 15.0), s)) for s in range(1, 21)}
    assert len(drawn) == 20


def test_a_fixed_variant_strikes_every_time_and_keeps_the_windows() -> None:
    from jepsen.run import parse

    for seed in range(1, 40):
        plain = draw(["partition", "kill"], 5, 90, (6, 9), seed)
        fixed = draw(["partition", "kill"], 5, 90, (6, 9), seed, {"partition": "bridge"})
        assert [(w.start_s, w.stop_s) for w in fixed] == [(w.start_s, w.stop_s) for w in plain]
        strikes = [v for w in fixed for k, v in w.faults if k == "partition"]
        assert strikes and set(strikes) == {"bridge"}
    args = parse(["--nodes", "5", "--nemesis", "partition:bridge", "--seed", "3"])
    assert args.nemesis == ["partition"] and args.nemesis_variants == {"partition": "bridge"}
    with pytest.raises(ValueError):
        draw(["partition"], 5, 90, (6, 9), 1, {"partition": "sideways"})
    with pytest.raises(SystemExit):
        parse(["--nemesis", "partition:sideways"])


def test_power_and_disk_strike_alone_and_last() -> None:
    for seed in range(1, 101):
        schedule = draw([*POWER_SET, "disk", "clock", "join"], 5, 60.0, (10.0, 15.0), seed)
        leads = [w.faults[0][0] for w in schedule]
        assert sorted(leads) == sorted([*POWER_SET, "disk", "clock"]), schedule
        assert set(leads[-2:]) == {"power", "disk"}, leads
        for window in schedule:
            if window.faults[0][0] in ("power", "disk"):
                assert len(window.faults) == 1, window
        check_times(schedule, 60.0)


def test_a_long_run_with_a_short_interval_strikes_more_and_varies() -> None:
    schedule = draw(POWER_SET, 5, 120.0, (6.0, 9.0), 3)
    assert len(schedule) == 8
    variants_seen = {f for w in schedule for f in w.faults}
    assert len(variants_seen) > 4
    check_times(schedule, 120.0)


def test_a_run_too_short_for_every_kind_keeps_what_fits() -> None:
    schedule = draw(POWER_SET, 3, 15.0, (10.0, 15.0), 1)
    assert len(schedule) == 1
    check_times(schedule, 15.0)
    assert draw(POWER_SET, 3, 6.0, (10.0, 15.0), 1) == []
    assert draw([], 3, 45.0, (10.0, 15.0), 1) == []


def test_variants_fit_the_cluster_size() -> None:
    assert "ring" not in variants("partition", 3) and "ring" in variants("partition", 5)
    assert "minority-leader" not in variants("kill", 3)
    assert "minority-leader" in variants("kill", 5, aimed=True)
    assert set(AIMED["partition"]) <= set(VARIANTS["partition"])
    with pytest.raises(ValueError, match="unknown fault kinds"):
        draw(["flood"], 3, 45.0, (10.0, 15.0), 1)


class ScriptedNemesis:
    """Records what the runner asks for; its first leader wait takes WAIT_S."""

    WAIT_S = 0.2

    def __init__(self) -> None:
        self.calls: list[tuple[str, float, object]] = []
        self.waits = 0

    def wait_leaders(self, timeout_s: float) -> float:
        self.waits += 1
        return self.WAIT_S if self.waits == 1 else 0.0

    def start(self, faults: tuple[tuple[str, str], ...]) -> None:
        self.calls.append(("start", time.monotonic(), faults))

    def heal_all(self) -> None:
        self.calls.append(("heal", time.monotonic(), None))


def test_the_runner_follows_the_schedule_and_a_leader_wait_shifts_the_rest() -> None:
    from jepsen.run import follow_schedule

    schedule = [
        Window(0.05, 0.15, (("kill", "leader"),)),
        Window(0.25, 0.35, (("power", "all"),)),
    ]
    nem = ScriptedNemesis()
    began = time.monotonic()
    shift = follow_schedule(nem, schedule, began, 0.4)  # type: ignore[arg-type]
    assert shift == ScriptedNemesis.WAIT_S
    assert [(c[0], c[2]) for c in nem.calls] == [
        ("start", (("kill", "leader"),)),
        ("heal", None),
        ("start", (("power", "all"),)),
        ("heal", None),
    ]
    at = [c[1] - began for c in nem.calls]
    assert at[1] >= 0.15 + shift and at[3] >= 0.35 + shift, at  # every window runs whole
    assert time.monotonic() - began >= 0.4 + shift
