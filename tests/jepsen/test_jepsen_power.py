"""Proves the detection-power table's arithmetic (jepsen/power.py), without brokers:

- a planted bug's power is its invalid runs over all its runs (an unknown run counts as
  a run, not as a catch); the correct build's is its valid runs over all its runs;
- the target is met only when every bug reaches it and the correct build is valid on
  every run;
- a row is read from results.json (verdict, anomaly counts, faults in order), and the
  anomalies that caught a run are listed most frequent first;
- `all` expands to every planted bug and then the correct build, once each;
- each build runs with the workloads its bug needs (WORKLOADS): the share, transaction
  and delay bugs with theirs, the older bugs with none beyond the log and groups, and the
  correct build with every one of them at the largest count any bug asks; the options
  become jepsen.run arguments that its parser accepts;
- a campaign with a budget starts no run once the budget is spent (campaign.json holds
  the runs it made); without one it makes every run;
- a campaign (jepsen/campaign.py) draws distinct seeds, the same for the same campaign
  seed, and its summary sums verdicts, fault windows by kind, sends (acknowledged) and
  anomalies and names the seeds to rerun.
"""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path

import pytest

from dmq.planted import PLANTED_BUGS
from jepsen.power import (
    CORRECT,
    WORKLOADS,
    Row,
    builds,
    caught_by,
    met,
    power_table,
    row_from_results,
    runs_table,
    tally,
    workload_args,
    workloads_for,
)


def row(bug: str, seed: int, valid: str, **anomalies: int) -> Row:
    return Row(bug, seed, valid, anomalies, ["partition/leader"], 60.0)


ROWS = [
    row("stale-read", 1, "invalid", **{"log:stale-read": 3}),
    row("stale-read", 2, "valid"),
    row("stale-read", 3, "unknown"),
    row("stale-read", 4, "invalid", **{"log:stale-read": 1}),
    row(CORRECT, 1, "valid"),
    row(CORRECT, 2, "valid"),
    row(CORRECT, 3, "invalid", **{"log:lost-write": 1}),
]


def test_power_counts_invalid_for_a_bug_and_valid_for_the_correct_build() -> None:
    bug, correct = tally(ROWS)
    assert (bug.bug, bug.runs, bug.invalid, bug.valid, bug.unknown) == ("stale-read", 4, 2, 1, 1)
    assert bug.hits == 2 and bug.fraction == 0.5
    assert (correct.runs, correct.hits, correct.invalid) == (3, 2, 1)
    table = power_table(ROWS)
    assert "| stale-read | 1,2,3,4 | 2 / 4 invalid | 1 | 50 % |" in table
    assert "| none | 1,2,3 | 2 / 3 valid | 0 | 67 % |" in table
    assert "| stale-read | 1 | invalid | log:stale-read 3 |" in runs_table(ROWS)


def test_the_target_needs_every_bug_caught_and_the_correct_build_always_valid() -> None:
    caught = [row("no-fsync", s, "invalid", **{"log:lost-write": 2}) for s in range(1, 11)]
    assert met(caught, 0.9)
    assert met([*caught[:9], row("no-fsync", 10, "valid")], 0.9)
    assert not met([*caught[:8], row("no-fsync", 9, "valid"), row("no-fsync", 10, "unknown")], 0.9)
    assert met([*caught, row(CORRECT, 1, "valid")], 0.9)
    assert not met([*caught, row(CORRECT, 1, "valid"), row(CORRECT, 2, "unknown")], 0.9)


def test_a_row_reads_results_json_and_names_what_caught_it() -> None:
    doc = {
        "valid": "invalid",
        "anomalies": {"log:unseen": {"count": 2}, "log:lost-write": {"count": 7}},
        "unavailability": [{"fault": "partition/leader"}, {"fault": "power/all"}],
        "harness_error": None,
    }
    found = row_from_results("ack-before-commit", 4, doc, 61.26)
    assert found.faults == ["partition/leader", "power/all"] and found.wall_s == 61.3
    assert (found.sends, found.sends_ok) == (0, 0)  # no log stats: none counted
    doc["checkers"] = {"log": {"stats": {"sends": 812, "sends_ok": 790}}}
    counted = row_from_results("ack-before-commit", 4, doc, 61.26)
    assert (counted.sends, counted.sends_ok) == (812, 790)
    assert "| 812 (790) | 61 |" in runs_table([counted])
    assert caught_by(found) == "log:lost-write 7, log:unseen 2"
    assert caught_by(row(CORRECT, 1, "valid")) == "none"


def test_all_is_every_planted_bug_then_the_correct_build() -> None:
    assert builds(["all"]) == [*PLANTED_BUGS, CORRECT]
    assert builds(["none", "all"]) == [CORRECT, *PLANTED_BUGS]
    assert builds(["stale-read", "stale-read"]) == ["stale-read"]


def test_each_build_runs_the_workloads_its_bug_needs_and_none_runs_them_all() -> None:
    from jepsen.run import parse

    assert set(WORKLOADS) <= set(PLANTED_BUGS)
    assert workload_args(workloads_for("share-double-delivery")) == ["--share-workers", "3"]
    assert workload_args(workloads_for("delay-early")) == ["--delay-workers", "1"]
    for bug in ("read-committed-leak", "txn-partial-markers"):
        assert workload_args(workloads_for(bug)) == ["--ctp", "--txn-workers", "3"]
    for bug in ("ack-before-commit", "no-fsync", "stale-read", "lease-read"):
        assert workloads_for(bug) == {} and workload_args({}) == []
    union = workloads_for(CORRECT)
    assert workload_args(workloads_for("tiered-delete-before-upload")) == ["--tiered"]
    assert union == {
        "--delay-workers": 1, "--ctp": True, "--share-workers": 3, "--tiered": True,
        "--txn-workers": 3,
    }  # fmt: skip
    for options in WORKLOADS.values():
        assert all(union[o] is v or union[o] >= v for o, v in options.items())
    # a zero or False option is left out
    assert workload_args({"--txn-workers": 0, "--ctp": False}) == []
    args = parse(["--seed", "1", *workload_args(union)])
    assert (args.ctp, args.delay_workers, args.share_workers, args.txn_workers) == (True, 1, 3, 3)
    assert args.tiered


def test_a_campaign_draws_the_same_distinct_seeds_and_sums_its_runs() -> None:
    from jepsen.campaign import draw_seeds, summary

    seeds = draw_seeds(7, 20)
    assert seeds == draw_seeds(7, 20) and len(set(seeds)) == 20
    assert draw_seeds(8, 20) != seeds
    rows = [
        row(CORRECT, 11, "valid"),
        row(CORRECT, 12, "invalid", **{"log:stale-read": 2}),
        row(CORRECT, 13, "unknown"),
        row(CORRECT, 14, "invalid", **{"log:stale-read": 1, "log:lost-write": 4}),
    ]
    rows[1] = Row(**{**asdict(rows[1]), "sends": 100, "sends_ok": 90})
    rows[3] = Row(**{**asdict(rows[3]), "faults": ["kill/leader", "partition/leader"]})
    line = summary(rows).splitlines()[-1]
    assert line.startswith(
        "| 4 | 1 | 2 | 1 | kill 1, partition 4 | 100 (90) | log:lost-write 4, log:stale-read 3 |"
    ), line
    assert "12 (invalid), 13 (unknown), 14 (invalid)" in line


def test_a_campaign_starts_no_run_once_its_budget_is_spent(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import jepsen.campaign as campaign

    clock = iter(range(0, 1000, 10))  # each look at the clock: 10 s later
    started: list[int] = []

    def fake_run(args: object, bug: str, seed: int) -> Row:
        started.append(seed)
        return row(bug, seed, "valid")

    monkeypatch.setattr(campaign, "run_one", fake_run)
    monkeypatch.setattr(campaign.time, "monotonic", lambda: float(next(clock)))
    argv = ["--runs", "8", "--campaign-seed", "3", "--dir", str(tmp_path)]
    assert campaign.main([*argv, "--budget-s", "25"]) == 0
    # began at 0 s; the looks at 10 and 20 s start a run each, the one at 30 s none
    assert started == campaign.draw_seeds(3, 8)[:2]
    assert len(json.loads((tmp_path / "campaign.json").read_text())) == 2
    started.clear()
    assert campaign.main(argv) == 0 and len(started) == 8


def test_a_windows_unavailability_ends_where_the_next_window_starts() -> None:
    """A stretch inside the next window is that window's, not this one's."""
    from jepsen.history import Op
    from jepsen.nemesis import Fault
    from jepsen.report import unavailability

    acks = [1.0, 2.0, 3.0, 12.0, 20.0, 21.0]
    ops = [Op(i, t, 0, "ok", "send", "n1", {}) for i, t in enumerate(acks)]
    faults = [
        Fault("partition", "bridge", ["n1"], 0.5, 4.0),
        Fault("partition", "bridge", ["n2"], 10.0, 14.0),
    ]
    got = [u["longest_without_ack_s"] for u in unavailability(ops, faults)]
    assert got == [1.0, 8.0]  # not 9.0 (3.0 -> 12.0, inside the next); then 12.0 -> 20.0
