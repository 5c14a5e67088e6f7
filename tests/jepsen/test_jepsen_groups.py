"""Proves the group checkers (jepsen/checker/groups.py) on golden histories of the group
workload: a valid history with a rebalance (a fenced 409 commit, a rejoin), an unknown
commit, re-delivered records and an empty poll passes; each group anomaly is flagged with
exactly its type: a committed offset going back after an acknowledged commit, an
acknowledged commit not visible, a failed (fenced) commit that took effect, and the
total-queue anomalies (lost, unexpected; duplicated and recovered counted, valid)."""

from __future__ import annotations

from typing import Any

from jepsen.checker import INVALID, VALID, merge
from jepsen.checker.groups import check_groups
from jepsen.history import Op


class G:
    """A group-history builder: each call appends an invoke and its completion."""

    def __init__(self) -> None:
        self.ops: list[Op] = []
        self.t = 0.0

    def op(self, proc: int, f: str, value: Any, type_: str = "ok", done: Any = None) -> G:
        for kind, v in (("invoke", value), (type_, value if done is None else done)):
            self.t += 1.0
            self.ops.append(Op(len(self.ops), self.t, proc, kind, f, "n1", v))
        return self

    def send(self, proc: int, value: str, offset: int | None, type_: str = "ok") -> G:
        done = {"partition": 0, "value": value, **({"offset": offset} if type_ == "ok" else {})}
        return self.op(proc, "send", {"partition": 0, "value": value}, type_, done)

    def join(self, proc: int, member: str) -> G:
        return self.op(proc, "subscribe", {"group": "g"}, done={"member_id": member})

    def gpoll(self, proc: int, records: list[tuple[int, str]]) -> G:
        done = {"records": [list(r) for r in records], "positions": []}
        return self.op(proc, "group-poll", {"member_id": "m"}, done=done)

    def commit(self, proc: int, offsets: dict[int, int], type_: str = "ok") -> G:
        value = {"member_id": "m", "generation": 1, "offsets": [list(i) for i in offsets.items()]}
        return self.op(
            proc, "commit", value, type_, {**value, "status": 409} if type_ == "fail" else None
        )

    def read(self, proc: int, offsets: dict[int, int]) -> G:
        return self.op(proc, "read-committed", {}, done={"offsets": sorted(offsets.items())})


def valid_base() -> G:
    g = G().send(0, "a", 0).send(0, "b", 1).send(0, "c", 2, "info")
    g.join(1, "m1").gpoll(1, [(0, "a"), (1, "b")]).commit(1, {0: 2}).read(1, {0: 2})
    # A rebalance: the old member's late commit is fenced (409) and it joins again.
    g.join(2, "m2").commit(1, {0: 1}, "fail").join(1, "m3")
    g.gpoll(2, [(1, "b"), (2, "c")]).commit(2, {0: 3}, "info").gpoll(2, [])
    return g


def anomalies(g: G) -> tuple[str, set[str]]:
    verdicts = check_groups(g.ops, timeout_s=5.0)
    return merge(verdicts), {f"{n}:{k}" for n, v in verdicts.items() for k in v.anomalies}


def test_valid_group_history_with_rebalance_unknown_commit_and_redelivery_passes() -> None:
    g = valid_base().read(2, {0: 3}).read(1, {0: 3})
    verdicts = check_groups(g.ops)
    assert merge(verdicts) == VALID, {n: v.anomalies for n, v in verdicts.items()}
    queue = verdicts["group-queue"].stats
    assert queue["duplicated"] == 1 and queue["recovered"] == 1  # "b" twice; "c" was info
    assert verdicts["group-offsets"].stats["commits_ok"] == 1


def test_the_unknown_commit_may_also_never_take_effect() -> None:
    assert anomalies(valid_base().read(2, {0: 2}))[0] == VALID


def test_committed_offset_going_back_after_an_acknowledged_commit_is_flagged() -> None:
    g = valid_base().read(2, {0: 3}).read(1, {0: 2})  # 3 was seen, then 2 again
    assert anomalies(g) == (INVALID, {"group-offsets:nonlinearizable"})
    g = G().send(0, "a", 0).join(1, "m").commit(1, {0: 1}).commit(1, {0: 5}).read(2, {0: 1})
    [found] = check_groups(g.ops)["group-offsets"].anomalies["nonlinearizable"]
    assert found["partition"] == 0
    assert found["witness"] == {"read": 9, "returned": 1, "commit": 7, "committed": 5}


def test_an_acknowledged_commit_missing_from_a_later_read_is_flagged() -> None:
    g = G().send(0, "a", 0).join(1, "m").gpoll(1, [(0, "a")]).commit(1, {0: 1}).read(1, {})
    assert anomalies(g) == (INVALID, {"group-offsets:nonlinearizable"})


def test_a_fenced_commit_that_took_effect_is_flagged() -> None:
    g = G().send(0, "a", 0).join(1, "m").gpoll(1, [(0, "a")]).commit(1, {0: 1})
    g.commit(2, {0: 0}, "fail").read(1, {0: 0})
    assert anomalies(g) == (INVALID, {"group-offsets:nonlinearizable"})


def test_acknowledged_send_never_consumed_by_the_group_is_lost() -> None:
    g = G().send(0, "a", 0).send(0, "b", 1).join(1, "m").gpoll(1, [(0, "a")])
    assert anomalies(g) == (INVALID, {"group-queue:lost"})


def test_a_group_poll_of_a_value_nobody_sent_is_unexpected() -> None:
    g = G().send(0, "a", 0).join(1, "m").gpoll(1, [(0, "a"), (1, "zz")])
    assert anomalies(g) == (INVALID, {"group-queue:unexpected"})
