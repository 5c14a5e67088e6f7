"""Proves the share-group machine's invariants (groups/share.py) over random command
sequences, with hypothesis: members poll, acknowledge (accept, release with a delay,
reject, and acks of records they do not hold), leave, locks run out as time passes,
retention moves the log start, dead letters are marked written. After every step:

- a record is acquired by at most one member at a time: an acquisition never takes a
  record whose lock, held by anyone, has not run out or been given back;
- an accepted record is never acquired again;
- delivery counts never go down, and a record is never delivered more than
  max_delivery_attempts times (the limit at that delivery: the operator may lower it);
- every record below the start offset is accepted or archived;
- the window holds at most max_in_flight_records records;
- a refused command returns the very state it was given; a dead letter is marked once;
- the snapshot JSON restores to an equal state.
"""

from __future__ import annotations

import json

from hypothesis import given, settings
from hypothesis import strategies as st

from groups import share
from groups.share_commands import (
    AckRecords,
    AcquireRecords,
    ExpireShareLocks,
    JoinShareGroup,
    LeaveShareGroup,
    MarkDeadLettered,
    PutShareGroup,
)

T = "t"
G = "g"
MEMBERS = ("m0", "m1", "m2", "m3")
ATTEMPTS = 3
WINDOW = 6
LOCK_MS = 1_000


def _start() -> share.ShareGroupsState:
    state = share.ShareGroupsState()
    state, r = share.apply(state, PutShareGroup(G, LOCK_MS, ATTEMPTS, "", WINDOW, 45_000, 0))
    assert r == ()
    for m in MEMBERS:
        state, r = share.apply(state, JoinShareGroup(G, m, (T,), 0))
        assert r == ()
    return state


class Model:
    """What the commands said, kept apart from the machine's state."""

    def __init__(self) -> None:
        self.holder: dict[tuple[int, int], tuple[str, int]] = {}  # (p, offset) -> (member, until)
        self.accepted: set[tuple[int, int]] = set()
        self.archived: set[tuple[int, int]] = set()
        self.acquired_ever: set[tuple[int, int]] = set()
        self.counts: dict[tuple[int, int], int] = {}
        self.marked: list[tuple[int, int]] = []


def _check(state: share.ShareGroupsState, model: Model) -> None:
    group = state.groups[G]
    dead = 0
    for (_, p), sp in group.partitions.items():
        assert len(sp.records) <= WINDOW
        assert list(sp.records) == sorted(sp.records)
        assert all(sp.start_offset <= o < sp.end_offset for o in sp.records)
        for o, r in sp.records.items():
            assert r.delivery_count >= model.counts.get((p, o), 0)
            assert r.delivery_count <= ATTEMPTS
            model.counts[(p, o)] = r.delivery_count
            if r.state == share.ACQUIRED:
                assert r.member_id in group.members
        for key in model.acquired_ever:
            if key[0] == p and key[1] < sp.start_offset:
                assert key in model.accepted | model.archived, key
        dead += sp.dead_lettered
    assert dead == len(model.marked) == len(set(model.marked))
    doc = json.loads(json.dumps(share.share_groups_to_json(state)))
    assert share.share_groups_from_json(doc, state.limits) == state


@settings(max_examples=100, deadline=None)
@given(data=st.data())
def test_share_group_invariants_hold_over_any_command_sequence(data: st.DataObject) -> None:
    state, model, now = _start(), Model(), 0
    log_end = {0: 0, 1: 0}  # records produced so far per partition (dense offsets, from 0)
    log_start = {0: 0, 1: 0}
    for _ in range(data.draw(st.integers(5, 60))):
        now += data.draw(st.sampled_from([0, 1, 200, 700, 1_500]))
        op = data.draw(st.sampled_from(["produce", "poll", "poll", "ack", "ack", "bad_ack",
                                        "leave", "expire", "mark", "retention",
                                        "attempts"]))  # fmt: skip
        before = state
        if op == "produce":
            p = data.draw(st.sampled_from([0, 1]))
            log_end[p] += data.draw(st.integers(1, 5))
            continue
        if op == "retention":
            p = data.draw(st.sampled_from([0, 1]))
            log_start[p] = data.draw(st.integers(log_start[p], log_end[p]))
            continue
        if op == "attempts":  # the operator lowers or raises max_delivery_attempts
            attempts = data.draw(st.integers(1, ATTEMPTS))
            state, r = share.apply(
                state, PutShareGroup(G, LOCK_MS, attempts, "", WINDOW, 45_000, now)
            )
            assert r == ()
        elif op == "poll":
            state = _poll(data, state, model, now, log_start, log_end)
        elif op in ("ack", "bad_ack"):
            state = _ack(data, state, model, now, good=op == "ack")
        elif op == "leave":
            m = data.draw(st.sampled_from(MEMBERS))
            state, r = share.apply(state, LeaveShareGroup(G, (m,), now))
            assert r == ()
            for key, (holder, _) in list(model.holder.items()):
                if holder == m:
                    del model.holder[key]
            state, _ = share.apply(state, JoinShareGroup(G, m, (T,), now))
        elif op == "expire":
            state, r = share.apply(state, ExpireShareLocks(now))
            assert r == ()
        else:
            state = _mark(state, model, now)
        assert set(state.groups[G].members) == set(MEMBERS), before  # leave, then join
        _check(state, model)


def _poll(data, state, model, now, log_start, log_end):  # type: ignore[no-untyped-def]
    member = data.draw(st.sampled_from(MEMBERS))
    items = []
    for p in data.draw(st.lists(st.sampled_from([0, 1]), min_size=1, max_size=2, unique=True)):
        sp = state.groups[G].partitions.get((T, p))
        # A broker may read from a stale end (another poll acquired meanwhile).
        end = log_start[p] if sp is None else sp.end_offset - data.draw(st.integers(0, 2))
        begin = max(end, log_start[p])
        fresh = tuple(range(begin, log_end[p]))[: data.draw(st.integers(0, 8))]
        read_end = fresh[-1] + 1 if fresh else max(begin, 0)
        items.append((T, p, log_start[p], fresh, read_end))
    max_records = data.draw(st.integers(1, 10))
    new, got = share.apply(state, AcquireRecords(G, member, tuple(items), max_records, now))
    assert isinstance(got, tuple)
    assert len(got) <= max_records
    limit = state.groups[G].config.max_delivery_attempts  # as it is now, lowered or not
    assert all(a.delivery_count <= limit for a in got), (got, limit)
    for p_item in items:  # retention: everything unfinished below the log start is archived
        for key in model.acquired_ever:
            if key[0] == p_item[1] and key[1] < p_item[2] and key not in model.accepted:
                model.archived.add(key)
                model.holder.pop(key, None)  # its lock goes with it: an ack gets 409
    for a in got:
        key = (a.partition, a.offset)
        assert key not in model.accepted, f"accepted record {key} offered again"
        held = model.holder.get(key)
        assert held is None or held[1] <= now, f"{key} locked to {held} at {now}"
        assert a.locked_until_ms == now + LOCK_MS
        model.holder[key] = (member, a.locked_until_ms)
        model.acquired_ever.add(key)
    return new


def _ack(data, state, model, now, good):  # type: ignore[no-untyped-def]
    member = data.draw(st.sampled_from(MEMBERS))
    if good:
        mine = sorted(k for k, (m, until) in model.holder.items() if m == member and until > now)
        keys = data.draw(st.lists(st.sampled_from(mine), unique=True)) if mine else []
    else:
        keys = data.draw(
            st.lists(st.tuples(st.sampled_from([0, 1]), st.integers(0, 30)), min_size=1,
                     max_size=3, unique=True)
        )  # fmt: skip
    if not keys:
        return state
    kinds = [data.draw(st.sampled_from(["accept", "release", "reject"])) for _ in keys]
    delays = [data.draw(st.sampled_from([0, 0, 500])) for _ in keys]
    acks = tuple((T, p, o, k, d) for (p, o), k, d in zip(keys, kinds, delays, strict=True))
    new, r = share.apply(state, AckRecords(G, member, acks, now))
    held = all(model.holder.get(k, ("", 0))[0] == member and model.holder[k][1] > now for k in keys)
    if isinstance(r, share.Rejected):
        assert not held or not good
        assert new is state
        return new
    assert held, "an ack of a record not held was applied"
    for key, kind in zip(keys, kinds, strict=True):
        del model.holder[key]
        if kind == "accept":
            model.accepted.add(key)
    return new


def _mark(state, model, now):  # type: ignore[no-untyped-def]
    pending = share.dead_letters(state.groups[G])
    if not pending:
        return state
    records = tuple((t, p, o) for _, t, p, o, _ in pending[:3])
    seqs = [s for s, *_ in pending]
    assert seqs == sorted(set(seqs))  # each dead letter has its own sequence
    new, r = share.apply(state, MarkDeadLettered(G, records, now))
    assert r == ()
    for _, p, o in records:
        model.marked.append((p, o))
        model.archived.add((p, o))
    # Marking again does nothing.
    again, r = share.apply(new, MarkDeadLettered(G, records, now))
    assert again.groups[G].partitions == new.groups[G].partitions
    return again


def test_a_share_group_is_deleted_only_without_members_or_dead_letters_to_write() -> None:
    from groups.share_commands import DeleteShareGroup

    state = _start()
    state, got = share.apply(state, AcquireRecords(G, "m0", ((T, 0, 0, (0,), 1),), 1, 1))
    assert [a.offset for a in got] == [0]  # type: ignore[union-attr]
    state, r = share.apply(state, AckRecords(G, "m0", ((T, 0, 0, "reject", 0),), 2))
    assert r == ()
    state, r = share.apply(state, LeaveShareGroup(G, MEMBERS, 3))
    assert r == ()
    same, r = share.apply(state, DeleteShareGroup(G, 4))
    assert isinstance(r, share.Rejected) and same is state  # the dead letter is not written
    state, r = share.apply(state, MarkDeadLettered(G, ((T, 0, 0),), 5))
    assert state.groups[G].partitions[(T, 0)].dead_lettered == 1
    state, r = share.apply(state, DeleteShareGroup(G, 6))
    assert r == () and G not in state.groups


def test_lowering_max_delivery_attempts_dead_letters_what_is_over_it() -> None:
    state = _start()
    for now in (1, 2):  # offset 0 delivered twice (released once)
        state, got = share.apply(state, AcquireRecords(G, "m0", ((T, 0, 0, (0,), 1),), 1, now))
        assert [(a.offset, a.delivery_count) for a in got] == [(0, now)]  # type: ignore[union-attr]
        state, r = share.apply(state, AckRecords(G, "m0", ((T, 0, 0, "release", 0),), now))
        assert r == () or now == 2
    state, r = share.apply(state, PutShareGroup(G, LOCK_MS, 2, "", WINDOW, 45_000, 3))
    assert r == ()
    r0 = state.groups[G].partitions[(T, 0)].records[0]
    assert (r0.state, r0.delivery_count) == (share.AVAILABLE, 2)
    state, got = share.apply(state, AcquireRecords(G, "m1", ((T, 0, 0, (), 1),), 5, 4))
    assert got == ()  # not a third delivery: at the new limit it goes to the dead letters
    r0 = state.groups[G].partitions[(T, 0)].records[0]
    assert (r0.state, r0.reason) == (share.DEAD_LETTERING, share.REASON_MAX_DELIVERY)
    assert [o for _, _, _, o, _ in share.dead_letters(state.groups[G])] == [0]


def test_config_that_would_break_locks_or_dead_letters_is_refused() -> None:
    state = share.ShareGroupsState()

    def refused(cmd: object) -> str | None:
        same, r = share.apply(state, cmd)  # type: ignore[arg-type]
        assert isinstance(r, share.Rejected) and same is state, r
        return r.field

    # A session shorter than the lock: an expiry would end locks before locked_until.
    assert refused(PutShareGroup(G, 30_000, 3, "", 10, 20_000, 0)) == "session_timeout_ms"
    for topic in (".", ".."):  # names no topic may have
        assert refused(PutShareGroup(G, 1_000, 3, topic, 10, 45_000, 0)) == "dead_letter_topic"
    long = "g" * 246  # "<group>.dlq" would be 250 characters
    assert refused(PutShareGroup(long, 1_000, 3, "", 10, 45_000, 0)) == "group"
    assert refused(JoinShareGroup(long, "m", (T,), 0)) == "group"
    ok, r = share.apply(state, PutShareGroup(long, 1_000, 3, "dead", 10, 45_000, 0))
    assert r == () and ok.groups[long].dead_letter_topic == "dead"
    ok, r = share.apply(state, PutShareGroup("g" * 245, 30_000, 3, "", 10, 30_000, 0))
    assert r == () and len(ok.groups["g" * 245].dead_letter_topic) == 249


def test_an_acquire_carries_at_most_records_per_command_max_fresh_offsets() -> None:
    state = _start()
    n = state.limits.records_per_command_max
    items = ((T, 0, 0, tuple(range(n)), n), (T, 1, 0, (0,), 1))
    same, r = share.apply(state, AcquireRecords(G, "m0", items, 1, 1))
    assert isinstance(r, share.Rejected) and r.field == "partitions" and same is state
    _, got = share.apply(state, AcquireRecords(G, "m0", items[:1], 1, 1))
    assert [a.offset for a in got] == [0]  # type: ignore[union-attr]


def test_the_dead_letter_producer_is_set_by_compare_and_set() -> None:
    from groups.share_commands import (
        SetDeadLetterProducer,
        decode_share_command,
        encode_share_command,
    )

    state = _start()
    state, r = share.apply(state, SetDeadLetterProducer(G, 7, 0, 1))
    assert r == () and state.groups[G].dlq_producer == (7, 0)
    # A second would-be leader that read no producer: refused, the first one stays.
    same, r = share.apply(state, SetDeadLetterProducer(G, 8, 0, 2))
    assert isinstance(r, share.Rejected) and same is state
    same, r = share.apply(state, SetDeadLetterProducer(G, 8, 0, 2, replaces_producer_id=5))
    assert isinstance(r, share.Rejected) and same is state
    state, r = share.apply(state, SetDeadLetterProducer(G, 9, 0, 3, replaces_producer_id=7))
    assert r == () and state.groups[G].dlq_producer == (9, 0)
    # The first producer's command encodes as before the field existed, and decodes back.
    first = SetDeadLetterProducer(G, 7, 0, 1)
    data = encode_share_command(first)
    assert data == (
        b'{"fields":{"group":"g","now_ms":1,"producer_epoch":0,"producer_id":7},'
        b'"type":"SetDeadLetterProducer","version":1}'
    )
    assert decode_share_command(json.loads(data)) == first
    switch = SetDeadLetterProducer(G, 9, 0, 3, replaces_producer_id=7)
    assert decode_share_command(json.loads(encode_share_command(switch))) == switch
