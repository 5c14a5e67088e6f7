"""Proves the security domain (dmq/metadata/security.py) as a pure state machine:

- over random sequences of PutUser, DeleteUser, AddAcl, RemoveAcl and SetQuota, a
  rejection leaves the state unchanged, the ACLs stay sorted and distinct, the users are
  exactly what a dict model says, and a snapshot restores to a state that snapshots to the
  same bytes (and to the same `security`);
- `authorize` agrees with a reference model written the plain way: deny wins over any
  allow, a prefixed binding matches every name that starts with it, a literal one its name
  or every name with "*", User:* is every user, `all` is every operation, and an allowed
  read/write/delete/alter implies describe (never a deny of them);
- the catalogue without users, ACLs or quotas writes no `security` key, so every older
  snapshot is written back byte for byte.
"""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from dmq.metadata import security
from dmq.metadata.machine import MetadataMachine, apply, state_from_json, state_to_json
from dmq.metadata.state import AclBinding, Applied, MetadataState, Rejected, SecurityState

USERS = ("alice", "bob", "carol")
NAMES = ("a", "ab", "abc", "b", "*", "cluster")
PRINCIPALS = ("User:alice", "User:bob", "User:*")
TYPES = ("topic", "group", "cluster")

bindings = st.builds(
    AclBinding,
    principal=st.sampled_from(PRINCIPALS),
    resource_type=st.sampled_from(TYPES),
    pattern=st.sampled_from(security.PATTERNS),
    name=st.sampled_from(NAMES),
    operation=st.sampled_from(security.OPERATIONS),
    permission=st.sampled_from(security.PERMISSIONS),
)


def _acl_command(cls: type[Any], b: AclBinding, now_ms: int) -> Any:
    return cls(b.principal, b.resource_type, b.pattern, b.name, b.operation, b.permission, now_ms)


commands = st.one_of(
    st.builds(
        security.PutUser,
        name=st.sampled_from((*USERS, "bad:name", "")),
        salt=st.sampled_from(("00ff", "abcd", "XYZ")),
        key=st.sampled_from(("11" * 32, "22" * 32)),
        n=st.sampled_from((2, 1024, 3, 2**20)),
        r=st.sampled_from((1, 8, 0)),
        p=st.sampled_from((1, 2, 9)),
        now_ms=st.integers(0, 10**6),
    ),
    st.builds(security.DeleteUser, name=st.sampled_from(USERS), now_ms=st.integers(0, 10**6)),
    st.tuples(bindings, st.integers(0, 10**6)).map(lambda t: _acl_command(security.AddAcl, *t)),
    st.tuples(bindings, st.integers(0, 10**6)).map(lambda t: _acl_command(security.RemoveAcl, *t)),
    st.builds(
        security.SetQuota,
        principal=st.sampled_from((*PRINCIPALS, "Group:x")),
        produce_bytes_per_s=st.sampled_from((0, 100, -1)),
        fetch_bytes_per_s=st.sampled_from((0, 5)),
        requests_per_s=st.sampled_from((0, 3)),
        now_ms=st.integers(0, 10**6),
    ),
)


def _snapshot_bytes(state: MetadataState) -> bytes:
    machine = MetadataMachine()
    machine.state = state
    return machine.snapshot()


@settings(max_examples=150)
@given(st.lists(commands, max_size=30))
def test_random_commands_keep_the_invariants_and_restore_to_the_same_bytes(
    cmds: list[Any],
) -> None:
    state = MetadataState()
    users: dict[str, str] = {}  # the model: name -> key
    for cmd in cmds:
        before = state
        state, result = apply(state, cmd)
        if isinstance(result, Rejected):
            assert state is before
            continue
        assert isinstance(result, Applied)
        if isinstance(cmd, security.PutUser):
            users[cmd.name] = cmd.key
        elif isinstance(cmd, security.DeleteUser):
            del users[cmd.name]
        acls = state.security.acls
        assert list(acls) == sorted(set(acls))
    assert {n: u.key for n, u in state.security.users.items()} == users
    assert all(security.binding_problem(b) is None for b in state.security.acls)
    snapshot = _snapshot_bytes(state)
    restored = MetadataMachine()
    restored.restore(snapshot)
    assert restored.state.security == state.security
    assert restored.snapshot() == snapshot
    # Observers get it too: the catalogue JSON carries it, and reads back the same.
    assert state_from_json(json.loads(json.dumps(state_to_json(state)))).security == (
        state.security
    )


def _reference(acls: tuple[AclBinding, ...], user: str, rtype: str, name: str, op: str) -> bool:
    def matches(b: AclBinding) -> bool:
        if b.principal not in (f"User:{user}", "User:*") or b.resource_type != rtype:
            return False
        if b.pattern == "prefixed":
            return name[: len(b.name)] == b.name
        return b.name == "*" or b.name == name

    matching = [b for b in acls if matches(b)]
    if any(b.permission == "deny" and b.operation in (op, "all") for b in matching):
        return False
    implied = ("read", "write", "delete", "alter") if op == "describe" else ()
    return any(
        b.permission == "allow" and (b.operation in (op, "all") or b.operation in implied)
        for b in matching
    )


@settings(max_examples=400)
@given(
    st.lists(bindings, max_size=12, unique=True),
    st.sampled_from(USERS),
    st.sampled_from(TYPES),
    st.sampled_from(("a", "ab", "abc", "b", "zz", "cluster")),
    st.sampled_from(security.OPERATIONS[:-1]),
)
def test_authorize_agrees_with_the_reference_and_deny_wins(
    acls: list[AclBinding], user: str, rtype: str, name: str, op: str
) -> None:
    sec = SecurityState(acls=tuple(sorted(acls)))
    verdict = security.authorize(sec, user, rtype, name, op)
    assert verdict == _reference(sec.acls, user, rtype, name, op)
    # Deny wins: adding a matching deny for this exact operation always refuses.
    deny = AclBinding(f"User:{user}", rtype, "literal", name, op, "deny")
    denied = replace(sec, acls=tuple(sorted({*sec.acls, deny})))
    assert not security.authorize(denied, user, rtype, name, op)
    # An allow of everything to everyone does not override a deny either.
    everything = AclBinding("User:*", rtype, "prefixed", name[:1] or "a", "all", "allow")
    assert not security.authorize(
        replace(denied, acls=tuple(sorted({*denied.acls, everything}))), user, rtype, name, op
    )


def test_prefix_and_literal_matching_by_example() -> None:
    sec = SecurityState(
        acls=(
            AclBinding("User:alice", "topic", "prefixed", "orders-", "read", "allow"),
            AclBinding("User:alice", "topic", "literal", "audit", "write", "allow"),
            AclBinding("User:alice", "topic", "literal", "orders-secret", "all", "deny"),
        )
    )
    assert security.authorize(sec, "alice", "topic", "orders-eu", "read")
    assert security.authorize(sec, "alice", "topic", "orders-eu", "describe")  # implied
    assert not security.authorize(sec, "alice", "topic", "orders", "read")  # not the prefix
    assert not security.authorize(sec, "alice", "topic", "orders-secret", "read")  # deny wins
    assert not security.authorize(sec, "alice", "topic", "orders-eu", "write")
    assert security.authorize(sec, "alice", "topic", "audit", "write")
    assert not security.authorize(sec, "alice", "topic", "audit-2", "write")  # literal
    assert not security.authorize(sec, "bob", "topic", "orders-eu", "read")  # another user
    assert not security.authorize(sec, "alice", "group", "orders-eu", "read")  # another type


def test_a_catalogue_without_security_writes_no_key() -> None:
    assert "security" not in state_to_json(MetadataState())
    assert b"security" not in _snapshot_bytes(MetadataState())


def test_put_user_refuses_bad_parameters_and_names() -> None:
    good = security.PutUser("alice", "00ff", "aa" * 32, 2**14, 8, 1, 1)
    assert isinstance(apply(MetadataState(), good)[1], Applied)
    for bad, field in (
        (replace(good, name="a:b"), "name"),
        (replace(good, salt="XY"), "salt"),
        (replace(good, n=2**14 + 1), "n"),
        (replace(good, n=2**18), "n"),
        (replace(good, p=0), "p"),
    ):
        state, result = apply(MetadataState(), bad)
        assert isinstance(result, Rejected) and result.field == field, (bad, result)
        assert state == MetadataState()
