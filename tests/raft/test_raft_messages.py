"""Proves that raft/messages.py's rewriting of append_entries is safe and removes the
truncations it exists to remove, against a model of pysyncobj 0.3.17's follower:

- the model follower rejects an append_entries whose prevLogIdx/prevLogTerm it does not hold,
  and otherwise keeps its log up to prevLogIdx, appends the entries, drops the rest, and
  acknowledges prevLogIdx + len(entries);
- for any leader log, any follower log (a prefix of the leader's, possibly followed by
  entries of older terms that conflict) and any append_entries the leader could send, the
  trimmed message is accepted iff the original is; the follower's log is then a prefix of
  the leader's (pysyncobj commits up to its last index, so nothing else may remain), the
  reply acknowledges all of it, and it is at least as long as the original would leave it;
- a pipelined follower (its log is the leader's, further than the message's end) keeps its
  whole log instead of being cut back (the case that lost acknowledged entries);
- the leader-side trim turns a rewound append_entries into one starting where the last one
  sent ended, which the follower accepts with the same resulting log, and passes snapshots,
  chunked transfers and messages of another term unchanged.
"""

from __future__ import annotations

from typing import Any

from hypothesis import assume, given
from hypothesis import strategies as st

from raft.messages import trim_append_entries, trim_outgoing_append_entries

Log = list[tuple[bytes, int, int]]  # (command, idx, term), indexes from 1


def make_log(terms: list[int], tag: bytes) -> Log:
    return [(tag + b"%d" % idx, idx, term) for idx, term in enumerate(terms, start=1)]


def term_at(log: Log) -> Any:
    def lookup(idx: int) -> int | None:
        return log[idx - 1][2] if 1 <= idx <= len(log) else None

    return lookup


def follower_apply(log: Log, message: dict[str, Any]) -> tuple[Log, int | None]:
    """pysyncobj's follower: (new log, acknowledged index) or (log, None) if rejected."""
    prev = message["prevLogIdx"]
    if term_at(log)(prev) != message["prevLogTerm"]:
        return log, None
    entries = list(message["entries"])
    return log[:prev] + entries, prev + len(entries)


def append_entries(leader: Log, prev: int, count: int, term: int) -> dict[str, Any]:
    return {
        "type": "append_entries",
        "term": term,
        "commit_index": 0,
        "prevLogIdx": prev,
        "prevLogTerm": term_at(leader)(prev),
        "entries": leader[prev : prev + count],
    }


@st.composite
def scenarios(draw: st.DrawFn) -> tuple[Log, Log, dict[str, Any]]:
    increments = draw(st.lists(st.integers(0, 1), min_size=1, max_size=30))
    terms = [1 + sum(increments[: k + 1]) for k in range(len(increments))]
    leader = make_log(terms, b"L")
    current_term = terms[-1] + draw(st.integers(0, 1))
    shared = draw(st.integers(1, len(leader)))
    follower = leader[:shared]
    # A divergent tail from an older term, which the leader never had.
    stale = draw(st.integers(0, 5))
    if stale and shared < len(leader):
        old_term = follower[-1][2]
        follower = follower + [
            (b"F%d" % idx, idx, old_term) for idx in range(shared + 1, shared + 1 + stale)
        ]
        assume(follower[shared][2] != leader[shared][2])
    prev = draw(st.integers(1, len(leader)))
    count = draw(st.integers(0, len(leader) - prev))
    return leader, follower, append_entries(leader, prev, count, current_term)


@given(scenarios())
def test_trimmed_append_entries_is_safe_and_loses_nothing(
    scenario: tuple[Log, Log, dict[str, Any]],
) -> None:
    leader, follower, message = scenario
    trimmed = trim_append_entries(message, term_at(follower), len(follower))
    log_orig, ack_orig = follower_apply(follower, message)
    log_trim, ack_trim = follower_apply(follower, trimmed)
    assert (ack_orig is None) == (ack_trim is None)
    if ack_orig is None or ack_trim is None:
        return
    assert ack_trim >= ack_orig
    # Only the leader's entries remain (pysyncobj commits up to the follower's last index),
    # the reply acknowledges all of them, and nothing the original would keep is lost.
    assert log_trim == leader[: len(log_trim)]
    assert ack_trim == len(log_trim)
    assert len(log_trim) >= len(log_orig)


def test_pipelined_follower_keeps_entries_beyond_a_rewound_message() -> None:
    leader = make_log([1, 2, 2, 2, 2, 2, 2], b"L")
    follower = list(leader)  # it already received everything
    rewound = append_entries(leader, 3, 2, term=2)  # prev=3, entries 4-5
    log_orig, _ = follower_apply(follower, rewound)
    assert len(log_orig) == 5  # pysyncobj alone would drop the acknowledged 6 and 7
    trimmed = trim_append_entries(rewound, term_at(follower), len(follower))
    log_trim, ack = follower_apply(follower, trimmed)
    assert log_trim == leader and ack == 7


def test_conflicting_suffix_is_still_truncated() -> None:
    leader = make_log([1, 1, 3, 3], b"L")
    follower = leader[:2] + make_log([1, 1, 2, 2, 2], b"F")[2:]
    message = append_entries(leader, 2, 2, term=3)
    trimmed = trim_append_entries(message, term_at(follower), len(follower))
    log, ack = follower_apply(follower, trimmed)
    assert log == leader and ack == 4


@given(
    st.lists(st.integers(0, 1), min_size=2, max_size=30),
    st.data(),
)
def test_leader_trim_starts_after_what_was_sent(increments: list[int], data: st.DataObject) -> None:
    terms = [1 + sum(increments[: k + 1]) for k in range(len(increments))]
    leader = make_log(terms, b"L")
    term = terms[-1]
    sent = data.draw(st.integers(1, len(leader)))
    follower = leader[:sent]  # in-order delivery of everything sent so far
    prev = data.draw(st.integers(1, sent))
    count = data.draw(st.integers(0, len(leader) - prev))
    message = append_entries(leader, prev, count, term)
    trimmed, mark = trim_outgoing_append_entries(message, (term, sent), term_at(leader))
    end = prev + count
    assert mark == (term, max(sent, end))
    log, ack = follower_apply(follower, trimmed)
    assert ack == max(sent, end)
    assert log == leader[: max(sent, end)]


def test_leader_trim_leaves_other_messages_alone() -> None:
    leader = make_log([1, 1, 1], b"L")
    snapshot = {"type": "append_entries", "term": 1, "commit_index": 1, "serialized": b"x"}
    assert trim_outgoing_append_entries(snapshot, (1, 2), term_at(leader)) == (snapshot, None)
    chunk = {**append_entries(leader, 1, 0, 1), "transmission": "start", "data": b""}
    assert trim_outgoing_append_entries(chunk, (1, 2), term_at(leader)) == (chunk, None)
    message = append_entries(leader, 1, 2, 2)
    assert trim_outgoing_append_entries(message, (1, 3), term_at(leader)) == (message, (2, 3))
    assert trim_outgoing_append_entries(message, None, term_at(leader)) == (message, (2, 3))
