"""Proves the checkers flag what they must and nothing else: for every anomaly type of the
log checker a minimal golden history flagged with exactly that type; valid histories
(info sends, empty long-polls, seeks back) that pass; a real history recorded from a
live run (tests/jepsen/data) mutated by dropping, swapping or duplicating a record must
be flagged; the WGL linearizability checker on registers (valid, invalid, info writes,
the timeout answering unknown); the total-queue checker."""

from __future__ import annotations

import functools
import gzip
import json
import math
import random
from pathlib import Path
from typing import Any

import pytest

from jepsen.checker import INVALID, UNKNOWN, VALID
from jepsen.checker.log import ANOMALIES, check_log
from jepsen.checker.queue import check_total_queue
from jepsen.checker.wgl import LinOp, check_linearizable
from jepsen.history import Op, pairs, read_jsonl

REAL_HISTORY = Path(__file__).parent / "data" / "history-valid-seed3.jsonl.gz"


class H:
    """A tiny history builder: each call appends an invoke and its completion."""

    def __init__(self) -> None:
        self.ops: list[Op] = []
        self.t = 0.0

    def _add(self, process: Any, type_: str, f: str, value: Any, node: str | None = "n1") -> None:
        self.t += 1.0
        self.ops.append(Op(len(self.ops), self.t, process, type_, f, node, value))

    def send(self, proc: int, part: int, value: str, offset: int | None, type_: str = "ok") -> H:
        self._add(proc, "invoke", "send", {"partition": part, "value": value})
        done: dict[str, Any] = {"partition": part, "value": value}
        if type_ == "ok":
            done["offset"] = offset
        self._add(proc, type_, "send", done)
        return self

    def invoke_send(self, proc: int, part: int, value: str) -> H:
        self._add(proc, "invoke", "send", {"partition": part, "value": value})
        return self

    def complete_send(self, proc: int, part: int, value: str, offset: int) -> H:
        self._add(proc, "ok", "send", {"partition": part, "value": value, "offset": offset})
        return self

    def poll(
        self,
        proc: int,
        part: int,
        at: int,
        records: list[tuple[int, str]],
        hw: int | None = None,
        f: str = "poll",
        node: str = "n1",
    ) -> H:
        nxt = records[-1][0] + 1 if records else at
        self._add(proc, "invoke", f, {"partition": part, "offset": at}, node)
        done = {
            "partition": part,
            "offset": at,
            "records": [list(r) for r in records],
            "next_offset": nxt,
            "high_watermark": nxt if hw is None else hw,
        }
        self._add(proc, "ok", f, done, node)
        return self

    def assign(self, proc: int, part: int, offset: int) -> H:
        self._add(proc, "invoke", "assign", {"partition": part, "offset": offset}, None)
        self._add(proc, "ok", "assign", {"partition": part, "offset": offset}, None)
        return self

    def replica(self, node: str, part: int, end: int, sha256: str) -> H:
        value = {"partition": part, "end_offset": end}
        proc = 100 + int(node[1:])
        self._add(proc, "invoke", "replica-read", value, node)
        self._add(proc, "ok", "replica-read", {**value, "sha256": sha256}, node)
        return self


def base() -> H:
    """Three acknowledged sends to partition 0, read back by a final poll."""
    return H().send(0, 0, "a", 0).send(1, 0, "b", 1).send(0, 0, "c", 2)


def final(h: H, records: list[tuple[int, str]], hw: int | None = None) -> H:
    return h.assign(9, 0, 0).poll(9, 0, 0, records, hw=hw, f="final-poll")


GOLDEN: dict[str, H] = {
    "inconsistent-offsets": final(
        base().send(4, 0, "y", None, "info"), [(0, "a"), (1, "b"), (2, "c")]
    ).poll(3, 0, 1, [(1, "y")], hw=3),
    "duplicate": final(
        base().send(2, 0, "d", None, "info"), [(0, "a"), (1, "b"), (2, "c"), (3, "b")]
    ),
    "lost-write": final(base().send(2, 0, "d", None), [(0, "a"), (1, "b"), (2, "c")]),
    "unseen": base().poll(4, 0, 0, [(0, "a"), (1, "b"), (2, "c")]).send(2, 0, "d", 3),
    "unexpected": final(base(), [(0, "a"), (1, "b"), (2, "c"), (3, "z")]),
    "G1a": final(base().send(2, 0, "d", None, "fail"), [(0, "a"), (1, "b"), (2, "c"), (3, "d")]),
    "poll-skip": final(
        base().assign(5, 0, 0).poll(5, 0, 0, [(0, "a")], hw=3).poll(5, 0, 1, [(2, "c")]),
        [(0, "a"), (1, "b"), (2, "c")],
    ),
    "nonmonotonic-poll": final(
        base()
        .assign(5, 0, 0)
        .poll(5, 0, 0, [(0, "a"), (1, "b")], hw=3)
        .poll(5, 0, 2, [(1, "b"), (2, "c")]),
        [(0, "a"), (1, "b"), (2, "c")],
    ),
    "int-poll-skip": final(
        base().poll(5, 0, 0, [(0, "a"), (2, "c")]), [(0, "a"), (1, "b"), (2, "c")]
    ),
    "int-nonmonotonic-poll": final(
        base().poll(5, 0, 0, [(1, "b"), (0, "a")], hw=3), [(0, "a"), (1, "b"), (2, "c")]
    ),
    "nonmonotonic-send": final(H().send(0, 0, "a", 1).send(0, 0, "b", 0), [(0, "b"), (1, "a")]),
    "realtime-send-inversion": final(
        H().send(0, 0, "a", 1).send(1, 0, "b", 0), [(0, "b"), (1, "a")]
    ),
    "stale-read": final(
        base().poll(5, 0, 1, [(1, "b")], hw=2, node="n3"), [(0, "a"), (1, "b"), (2, "c")]
    ),
    "replica-divergence": final(base(), [(0, "a"), (1, "b"), (2, "c")])
    .replica("n1", 0, 3, "5e1f")
    .replica("n2", 0, 3, "77ab")
    .replica("n3", 0, 3, "5e1f"),
}


def test_every_anomaly_type_has_a_golden_history() -> None:
    assert sorted(GOLDEN) == sorted(ANOMALIES)


@pytest.mark.parametrize("kind", sorted(GOLDEN))
def test_golden_history_is_flagged_with_exactly_its_type(kind: str) -> None:
    verdict = check_log(GOLDEN[kind].ops)
    assert verdict.valid == INVALID
    assert sorted(verdict.anomalies) == [kind], verdict.anomalies


def test_valid_history_with_info_sends_empty_polls_and_seeks_passes() -> None:
    h = H()
    h.send(0, 0, "a", 0).send(1, 0, "b", None, "info").send(2, 0, "c", None, "fail")
    h.invoke_send(3, 0, "d").send(4, 1, "e", 0)  # d never completes: it may land, or not
    h.complete_send(3, 0, "d", 2)
    h.assign(5, 0, 0).poll(5, 0, 0, [(0, "a"), (1, "b")], hw=3).poll(5, 0, 2, [(2, "d")])
    h.poll(5, 0, 3, [], hw=3).poll(5, 0, 3, [], hw=3)  # empty long-polls at the end
    h.assign(5, 0, 1).poll(5, 0, 1, [(1, "b"), (2, "d")])  # a seek back
    h.poll(6, 1, 0, [(0, "e")]).poll(7, 1, 1, [], hw=1)
    final(h, [(0, "a"), (1, "b"), (2, "d")], hw=3)
    h.replica("n1", 0, 3, "5e1f").replica("n2", 0, 3, "5e1f")
    h.replica("n1", 1, 1, "0c2d").replica("n3", 1, 1, "0c2d")
    verdict = check_log(h.ops)
    assert verdict.valid == VALID, verdict.anomalies
    assert verdict.stats["recovered"] == 1


def test_concurrent_sends_may_take_offsets_in_either_order() -> None:
    h = H().invoke_send(0, 0, "a").invoke_send(1, 0, "b")
    h.complete_send(0, 0, "a", 1).complete_send(1, 0, "b", 0)
    assert check_log(final(h, [(0, "b"), (1, "a")]).ops).valid == VALID


def test_a_poll_behind_an_ack_it_did_not_wait_for_is_not_stale() -> None:
    h = base().invoke_send(3, 0, "d")
    h.poll(5, 0, 0, [(0, "a"), (1, "b"), (2, "c")], hw=3)  # began before d's ack
    h.complete_send(3, 0, "d", 3)
    assert check_log(final(h, [(0, "a"), (1, "b"), (2, "c"), (3, "d")]).ops).valid == VALID


# --- mutated real histories -------------------------------------------------------------


@functools.cache
def _real_ops() -> tuple[Op, ...]:
    with gzip.open(REAL_HISTORY, "rt") as src:
        lines = src.read().splitlines()
    return tuple(Op.from_json(json.loads(line)) for line in lines if line)


def real_ops() -> list[Op]:
    return list(_real_ops())


def test_the_recorded_real_history_is_valid_and_has_stakes() -> None:
    ops = real_ops()
    verdict = check_log(ops)
    assert verdict.valid == VALID, verdict.anomalies
    assert verdict.stats["sends_ok"] > 300 and verdict.stats["records_read"] > 1000
    assert any(op.process == "nemesis" for op in ops)


def _final_polls(ops: list[Op]) -> list[int]:
    return [
        i
        for i, op in enumerate(ops)
        if op.f == "final-poll" and op.type == "ok" and len(op.value["records"]) >= 3
    ]


def _mutate(ops: list[Op], how: str, rng: random.Random) -> list[Op]:
    i = rng.choice(_final_polls(ops))
    value = dict(ops[i].value)
    records = [list(r) for r in value["records"]]
    k = rng.randrange(1, len(records) - 1)
    if how == "drop":
        del records[k]
    elif how == "swap":
        records[k][1], records[k + 1][1] = records[k + 1][1], records[k][1]
    else:  # duplicate: the record's value again at the next offset
        records[k + 1][1] = records[k][1]
    value["records"] = records
    mutated = list(ops)
    mutated[i] = Op(
        ops[i].index, ops[i].time, ops[i].process, ops[i].type, ops[i].f, ops[i].node, value
    )
    return mutated


@pytest.mark.parametrize("how", ["drop", "swap", "duplicate"])
@pytest.mark.parametrize("seed", range(3))
def test_a_mutated_real_history_is_flagged(how: str, seed: int) -> None:
    verdict = check_log(_mutate(real_ops(), how, random.Random(seed)))
    assert verdict.valid == INVALID
    expected = {"drop": "int-poll-skip", "swap": "inconsistent-offsets", "duplicate": "duplicate"}
    assert expected[how] in verdict.anomalies, verdict.anomalies


def test_history_files_round_trip(tmp_path: Path) -> None:
    from jepsen.history import write_jsonl

    ops = GOLDEN["stale-read"].ops
    write_jsonl(ops, tmp_path / "h.jsonl")
    assert read_jsonl(tmp_path / "h.jsonl") == ops
    assert len(list(pairs(ops))) == len(ops) // 2


# --- WGL linearizability -----------------------------------------------------------------


def w(key: str, value: int, start: float, end: float, i: int = 0) -> LinOp:
    return LinOp(key, "write", value, None, start, end, i)


def r(key: str, value: int | None, start: float, end: float, i: int = 0) -> LinOp:
    return LinOp(key, "read", None, value, start, end, i)


def test_wgl_accepts_a_linearizable_register_history() -> None:
    ops = [
        w("g/0", 5, 0, 2),
        r("g/0", 5, 1, 3),
        w("g/0", 9, 4, 6),
        r("g/0", 5, 5, 7),
        r("g/0", 9, 8, 9),
    ]
    assert check_linearizable(ops).valid == VALID


def test_wgl_flags_a_read_that_goes_back_after_an_acknowledged_write_per_key() -> None:
    ops = [w("g/0", 5, 0, 1), w("g/0", 9, 2, 3), r("g/0", 5, 4, 5, 7), w("g/1", 1, 0, 1)]
    verdict = check_linearizable(ops)
    assert verdict.valid == INVALID
    assert [a["key"] for a in verdict.anomalies["nonlinearizable"]] == ["'g/0'"]


def test_wgl_info_write_may_take_effect_late_or_never() -> None:
    late = [w("k", 1, 0, 1), w("k", 2, 2, math.inf), r("k", 1, 3, 4), r("k", 2, 5, 6)]
    assert check_linearizable(late).valid == VALID
    never = [w("k", 1, 0, 1), w("k", 2, 2, math.inf), r("k", 1, 3, 4)]
    assert check_linearizable(never).valid == VALID
    back = [w("k", 1, 0, 1), w("k", 2, 2, math.inf), r("k", 2, 3, 4), r("k", 1, 5, 6)]
    assert check_linearizable(back).valid == INVALID


def test_wgl_answers_unknown_when_out_of_time() -> None:
    # Many concurrent writes and reads of one key: a large search space.
    ops = [w("k", i, 0, 100) for i in range(40)] + [r("k", i, 0, 100) for i in range(40)]
    ops.append(r("k", -1, 101, 102))  # impossible: forces the whole search
    assert check_linearizable(ops, timeout_s=0.05).valid == UNKNOWN


# --- total queue -------------------------------------------------------------------------


def test_total_queue_lost_unexpected_duplicated_recovered() -> None:
    h = H().send(0, 0, "a", 0).send(1, 0, "b", None, "info").send(2, 0, "c", 1).send(3, 0, "d", 2)
    h.poll(4, 0, 0, [(0, "a"), (1, "c")], f="group-poll").poll(
        5, 0, 0, [(0, "a"), (3, "b"), (4, "x")], f="group-poll"
    )
    verdict = check_total_queue(h.ops)
    assert sorted(verdict.anomalies) == ["lost", "unexpected"]
    assert verdict.anomalies["lost"] == [{"value": "d"}]
    assert verdict.anomalies["unexpected"] == [{"value": "x"}]
    assert verdict.stats["duplicated"] == 1 and verdict.stats["recovered"] == 1
    ok = H().send(0, 0, "a", 0).poll(4, 0, 0, [(0, "a")], f="group-poll")
    assert check_total_queue(ok.ops).valid == VALID
