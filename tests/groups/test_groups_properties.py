"""Proves the consumer-group state machine (groups/state.py) safe to replicate and correct:

- any sequence of joins (static members among them), leaves, expiries, acknowledgements,
  commits and topic changes keeps every partition held by at most one member of the
  group, and a target that names only members subscribed to the partition's topic;
- once every member has acknowledged the current generation (what heartbeats do), every
  partition of a subscribed topic is assigned, and with identical subscriptions the counts
  differ by at most one (per topic for range, over the whole subscription for the others);
- the sticky assignor moves the fewest partitions any balanced assignment needs (checked
  against a brute force over which members get the larger share);
- an accepted commit always comes from the member holding the partition at a generation no
  older than the handover; replaying the same commands gives equal states and equal JSON;
  the JSON snapshot restores to an equal state; commands survive encode/decode.
"""

from __future__ import annotations

import itertools
import json
from dataclasses import replace

from hypothesis import given, settings
from hypothesis import strategies as st

from groups.assignors import ASSIGNORS, RANGE, STICKY, assign_sticky
from groups.commands import (
    AckGeneration,
    CommitOffsets,
    DeleteGroup,
    ExpireGroups,
    ExpireMembers,
    GroupCommand,
    JoinGroup,
    LeaveGroup,
    ResetOffsets,
    UpdateTopics,
    decode_group_command,
    encode_group_command,
)
from groups.state import (
    GroupsState,
    OffsetsCommitted,
    Rejected,
    apply,
    groups_from_json,
    groups_to_json,
    subscribed_topics,
)

MEMBERS = [f"m{i}" for i in range(6)]
TOPICS = ["t0", "t1", "t2"]

topic_counts = st.fixed_dictionaries({t: st.integers(0, 7) for t in TOPICS})
subscriptions = st.sampled_from([("t0",), ("t0", "t1"), ("t1", "t2"), ("t0", "t1", "t2")])


def commands(uniform: bool) -> st.SearchStrategy[GroupCommand]:
    """Commands on one group "g"; `uniform`: every member subscribes to the same topics."""
    sub = st.just(("t0", "t1")) if uniform else subscriptions
    member = st.sampled_from(MEMBERS)
    return st.one_of(
        st.builds(
            lambda m, s, pat, inst: JoinGroup(
                "g", m, inst, () if pat else s, "t[01]" if pat else "", 10_000, "", 0
            ),
            member,
            sub,
            st.booleans() if uniform else st.just(False),
            st.sampled_from(["", "", "static-a", "static-b"]),  # static members replace
        ),
        st.builds(lambda m: LeaveGroup("g", m, 0), member),
        st.builds(lambda ms: ExpireMembers("g", tuple(ms), 0), st.lists(member, max_size=3)),
        st.builds(lambda m, d: AckGeneration("g", m, -d, 0), member, st.integers(0, 2)),
        st.builds(lambda c: UpdateTopics(tuple(c.items()), 0), topic_counts),
        st.builds(
            lambda m, d, t, p, o: CommitOffsets("g", m, -d, ((t, p, o),), 0),
            member,
            st.integers(0, 2),
            st.sampled_from(TOPICS),
            st.integers(0, 7),
            st.integers(0, 100),
        ),
        st.just(DeleteGroup("g", 0)),  # refused while the group has members
        st.builds(lambda r: ExpireGroups(r, 0), st.integers(0, 3)),
    )


def _fix(state: GroupsState, cmd: GroupCommand, assignor: str, now_ms: int) -> GroupCommand:
    """Negative generations in generated commands mean "current generation minus d"; joins
    take the run's assignor; time moves forward."""
    group = state.groups.get("g")
    gen = group.generation if group else 0
    if isinstance(cmd, AckGeneration | CommitOffsets) and cmd.generation <= 0:
        cmd = replace(cmd, generation=gen + cmd.generation)
    if isinstance(cmd, JoinGroup):
        cmd = replace(cmd, assignor=assignor)
    return replace(cmd, now_ms=now_ms)


def check_invariants(state: GroupsState) -> None:
    for group in state.groups.values():
        holders: dict[tuple[str, int], str] = {}
        for mid, member in group.members.items():
            for h in member.held:
                assert h.tp not in holders, f"{h.tp} held by {holders.get(h.tp)} and {mid}"
                holders[h.tp] = mid
                assert h.since <= group.generation and h.revoked_at <= group.generation
        for tp, mid in group.target.items():
            assert mid in group.members
            assert tp[0] in subscribed_topics(group.members[mid], state.topics)
            assert tp[1] < state.topics[tp[0]]


def settle(state: GroupsState) -> GroupsState:
    """Every member acknowledges the current generation until nothing changes."""
    for _ in range(10):
        before = state
        group = state.groups.get("g")
        for mid in sorted(group.members) if group else []:
            state, _ = apply(state, AckGeneration("g", mid, state.groups["g"].generation, 0))
            check_invariants(state)
        if state == before:
            return state
    raise AssertionError("acknowledgements did not settle the group")


def check_settled(state: GroupsState, uniform: bool) -> None:
    group = state.groups.get("g")
    if group is None or not group.members:
        return
    wanted = {
        (t, p)
        for m in group.members.values()
        for t, n in subscribed_topics(m, state.topics).items()
        for p in range(n)
    }
    assigned = {tp for m in group.members.values() for tp in m.assigned}
    assert assigned == wanted
    assert all(not m.revoking for m in group.members.values())
    if not uniform:
        return
    # range balances each topic on its own (as Kafka's); the others the whole subscription.
    scopes = [[t] for t in TOPICS] if group.assignor == RANGE else [TOPICS]
    for scope in scopes:
        counts = [sum(1 for t, _ in m.assigned if t in scope) for m in group.members.values()]
        assert max(counts) - min(counts) <= 1, (scope, counts)


def run(cmds: list[GroupCommand], assignor: str) -> tuple[GroupsState, list[object]]:
    state = GroupsState()
    events: list[object] = []
    for i, raw in enumerate(cmds):
        cmd = _fix(state, raw, assignor, now_ms=i)
        new_state, evs = apply(state, cmd)
        events.extend(evs)
        if any(isinstance(e, Rejected) for e in evs):
            assert new_state is state  # a refusal changes nothing
        if isinstance(cmd, CommitOffsets) and any(isinstance(e, OffsetsCommitted) for e in evs):
            held = {h.tp: h for h in state.groups["g"].members[cmd.member_id].held}
            for t, p, _ in cmd.offsets:
                assert held[(t, p)].since <= cmd.generation
        state = new_state
        check_invariants(state)
    return state, events


@settings(max_examples=300, deadline=None)
@given(
    st.sampled_from(ASSIGNORS),
    st.booleans().flatmap(lambda u: st.tuples(st.just(u), st.lists(commands(u), max_size=40))),
)
def test_any_sequence_keeps_one_member_per_partition_and_settles_balanced(
    assignor: str, case: tuple[bool, list[GroupCommand]]
) -> None:
    uniform, cmds = case
    cmds = [UpdateTopics((("t0", 3), ("t1", 4), ("t2", 2)), 0), *cmds]
    state, events = run(cmds, assignor)
    check_settled(settle(state), uniform)
    # Replay: the same commands give the same state and the same snapshot.
    again, events_again = run(cmds, assignor)
    assert again == state and events_again == events
    assert json.dumps(groups_to_json(again)) == json.dumps(groups_to_json(state))
    assert groups_from_json(json.loads(json.dumps(groups_to_json(state)))) == state


def _best_kept(previous: dict[tuple[str, int], str], members: list[str], n: int) -> int:
    """Brute force: the most partitions a balanced assignment can leave where they are."""
    counts = [sum(1 for o in previous.values() if o == m) for m in members]
    base, extra = divmod(n, len(members))
    best = 0
    for bigger in itertools.combinations(range(len(members)), extra):
        quota = [base + (1 if i in bigger else 0) for i in range(len(members))]
        best = max(best, sum(min(c, q) for c, q in zip(counts, quota, strict=True)))
    return best


@settings(max_examples=300, deadline=None)
@given(
    st.integers(1, 12),
    st.lists(st.sampled_from(MEMBERS), min_size=1, max_size=6, unique=True),
    st.data(),
)
def test_sticky_moves_no_more_than_needed(n: int, members: list[str], data: st.DataObject) -> None:
    tps = [("t", p) for p in range(n)]
    # A previous owner per partition, possibly a member that is gone, possibly none.
    owners = st.one_of(st.none(), st.sampled_from(MEMBERS))
    previous = {tp: o for tp in tps if (o := data.draw(owners)) is not None}
    subs = {m: {"t": n} for m in members}
    out = assign_sticky(subs, previous)
    assert set(out) == set(tps)
    counts = [sum(1 for o in out.values() if o == m) for m in members]
    assert max(counts) - min(counts) <= 1
    live_previous = {tp: o for tp, o in previous.items() if o in members}
    kept = sum(1 for tp, o in live_previous.items() if out[tp] == o)
    assert kept == _best_kept(live_previous, members, n)


@given(commands(False))
def test_commands_round_trip_through_their_encoding(cmd: GroupCommand) -> None:
    doc = json.loads(encode_group_command(cmd))
    assert decode_group_command(doc) == cmd


def test_cooperative_rebalance_keeps_unmoved_partitions_and_fences_stale_commits() -> None:
    state, _ = apply(GroupsState(), UpdateTopics((("t", 6),), 0))
    state, _ = apply(state, JoinGroup("g", "a", "", ("t",), "", 10_000, STICKY, 1))
    g = state.groups["g"]
    assert g.members["a"].assigned == tuple(("t", p) for p in range(6)) and g.generation == 1
    state, _ = apply(state, JoinGroup("g", "b", "", ("t",), "", 10_000, STICKY, 2))
    g = state.groups["g"]
    # a keeps three, gives up three (still held until it acknowledges); b waits for them.
    assert len(g.members["a"].assigned) == 3 and len(g.members["a"].revoking) == 3
    assert g.members["b"].held == () and g.generation == 2
    moving = g.members["a"].revoking[0]
    # a may still commit what it is giving up (its in-flight work) at its old generation.
    state, evs = apply(state, CommitOffsets("g", "a", 1, ((*moving, 5),), 3))
    assert evs == (OffsetsCommitted("g", 1),)
    state, _ = apply(state, AckGeneration("g", "a", 2, 4))
    g = state.groups["g"]
    assert g.generation == 3 and len(g.members["b"].assigned) == 3
    assert moving in g.members["b"].assigned
    # Now a's old generation cannot commit the partition that moved, but can commit its own.
    _, evs = apply(state, CommitOffsets("g", "a", 1, ((*moving, 9),), 5))
    assert isinstance(evs[0], Rejected) and evs[0].code == "stale_generation"
    kept = g.members["a"].assigned[0]
    _, evs = apply(state, CommitOffsets("g", "a", 1, ((*kept, 9),), 5))
    assert evs == (OffsetsCommitted("g", 1),)
    # b cannot commit with the generation before its handover, nor can a stranger.
    _, evs = apply(state, CommitOffsets("g", "b", 2, ((*moving, 9),), 5))
    assert isinstance(evs[0], Rejected) and evs[0].code == "stale_generation"
    _, evs = apply(state, CommitOffsets("g", "x", 3, ((*moving, 9),), 5))
    assert isinstance(evs[0], Rejected) and evs[0].code == "unknown_member"
    # Reset only when empty; partitions added to the topic are assigned at once.
    _, evs = apply(state, ResetOffsets("g", (("t", 0, 0),), 6))
    assert isinstance(evs[0], Rejected) and evs[0].code == "group_not_empty"
    state, _ = apply(state, UpdateTopics((("t", 8),), 7))
    g = state.groups["g"]
    assert {tp for m in g.members.values() for tp in m.assigned} == {("t", p) for p in range(8)}


def test_static_member_takes_over_without_a_rebalance() -> None:
    state, _ = apply(GroupsState(), UpdateTopics((("t", 4),), 0))
    state, _ = apply(state, JoinGroup("g", "a1", "pod-a", ("t",), "", 10_000, STICKY, 1))
    state, _ = apply(state, JoinGroup("g", "b", "", ("t",), "", 10_000, STICKY, 2))
    state = settle(state)
    before = state.groups["g"]
    state, _ = apply(state, JoinGroup("g", "a2", "pod-a", ("t",), "", 10_000, STICKY, 3))
    after = state.groups["g"]
    assert after.generation == before.generation + 1  # a membership change, no partition moved
    assert after.members["a2"].held == before.members["a1"].held and "a1" not in after.members
    assert after.members["b"] == before.members["b"]
    b_tp = before.members["b"].assigned[0]
    state, events = apply(state, CommitOffsets("g", "b", before.generation, ((*b_tp, 5),), 4))
    assert not any(isinstance(e, Rejected) for e in events)  # b's older generation still commits
