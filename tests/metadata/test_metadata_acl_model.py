"""Proves, by hypothesis over random ACL sets (literal, prefixed and "*" names, allow and
deny, User:alice and User:*), that dmq/metadata/security.py's `authorize` allows nothing a
simple model of the rules refuses, and refuses nothing it allows; and that a topic pattern
resolved for a principal (http_api/auth.py `readable`: describe and read) keeps only the
topics the model lets it describe and read.

The model, written from Kafka's rules and not from the code: a binding applies to the
principal or User:*; a literal name is the name or "*", a prefixed one a prefix; any
matching deny of the operation (or of all) refuses; else a matching allow of the
operation, of all, or, for describe, of read/write/delete/alter allows; else refused.
"""

from __future__ import annotations

import re

from hypothesis import given, settings
from hypothesis import strategies as st

from dmq.metadata.security import authorize
from dmq.metadata.state import AclBinding, SecurityState

NAMES = ("a", "ab", "abc", "b", "secret-x", "secret-y")
OPS = ("read", "write", "create", "delete", "alter", "describe", "all")
TOPIC_OPS = OPS[:-1]

bindings = st.builds(
    AclBinding,
    st.sampled_from(("User:alice", "User:*", "User:bob")),
    st.sampled_from(("topic", "group")),
    st.sampled_from(("literal", "prefixed")),
    st.sampled_from((*NAMES, "*", "a", "secret-")),
    st.sampled_from(OPS),
    st.sampled_from(("allow", "allow", "deny")),
)


def model(acls: list[AclBinding], rtype: str, name: str, op: str) -> bool:
    def applies(b: AclBinding) -> bool:
        if b.principal not in ("User:alice", "User:*") or b.resource_type != rtype:
            return False
        return name.startswith(b.name) if b.pattern == "prefixed" else b.name in (name, "*")

    mine = [b for b in acls if applies(b)]
    if any(b.permission == "deny" and b.operation in (op, "all") for b in mine):
        return False
    implied = {"read", "write", "delete", "alter"} if op == "describe" else set()
    return any(
        b.permission == "allow" and (b.operation in (op, "all") or b.operation in implied)
        for b in mine
    )


@settings(max_examples=400, deadline=None)
@given(st.lists(bindings, max_size=8), st.sampled_from(NAMES), st.sampled_from(TOPIC_OPS),
       st.sampled_from(("topic", "group")))  # fmt: skip
def test_authorize_agrees_with_the_model(
    acls: list[AclBinding], name: str, op: str, rtype: str
) -> None:
    sec = SecurityState(acls=tuple(sorted(set(acls))))
    assert authorize(sec, "alice", rtype, name, op) == model(acls, rtype, name, op)


@settings(max_examples=300, deadline=None)
@given(st.lists(bindings, max_size=8), st.sampled_from(("secret-.*", ".*", "a.*", "b|abc")))
def test_a_pattern_keeps_only_topics_the_model_lets_it_describe_and_read(
    acls: list[AclBinding], pattern: str
) -> None:
    sec = SecurityState(acls=tuple(sorted(set(acls))))
    # http_api/auth.py readable: describe and read, each through authorize.
    kept = {
        t
        for t in NAMES
        if re.fullmatch(pattern, t)
        and authorize(sec, "alice", "topic", t, "describe")
        and authorize(sec, "alice", "topic", t, "read")
    }
    for t in kept:
        assert model(acls, "topic", t, "read") and model(acls, "topic", t, "describe"), t
