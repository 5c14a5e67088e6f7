"""Proves, by a seeded random run against one real `dmq serve --auth on`, that no operation
by a limited principal succeeds that a model of the ACLs refuses, and that what the model
allows is not refused.

The run interleaves, in an order drawn from the seed: the superuser granting and revoking
ACL bindings (literal, prefixed, `*`, deny; on topics, groups, transactional ids, share
groups and the cluster, for alice, bob and User:*), the superuser creating topics, and
alice or bob attempting: produce, /v1 and REST v2 (auto-creating a missing topic), fetch,
offset commit and reset, group description, group join with a topic list and with a
pattern, a REST v2 consumer subscribed by pattern, transactional offset commit naming a
group, producer init with a transactional id, share-group PUT with and without a
dead-letter topic, share-group join, topic create, delete, describe and config alter.
After each attempt:

- safety: an answer 2xx is a violation unless the model allows every resource the
  operation touches; a pattern subscription (v1 join and its fetch, v2 assignments and
  records) must show and serve only topics the model lets the caller describe and read,
  and a group description only topics it lets the caller describe;
- liveness: an operation the model allows, whose resources exist, must not be refused
  (401, 403, or 404 topic_not_found); other failures are counted and shown.

The model is written from Kafka's authorizer, not from dmq's code: a binding applies to
the caller's principal or User:*, a literal name to that name (or every name for `*`), a
prefixed one to every name starting with it; a deny of the operation (or of `all`) wins;
else an allow of the operation or of `all` allows, and for describe an allow of read,
write, delete or alter too; creating a topic needs create on the topic or on the cluster.
dmq's own rules on top (http_api/README.md, "Authentication, ACLs, quotas"): a share
group's PUT needs write, and create if it does not exist yet, on the dead-letter topic the
group will use (the body's, else the one it has, else `<group>.dlq`).

Reproduce a run with DMQ_AUTH_MODEL_SEED and DMQ_AUTH_MODEL_STEPS (the seed is in every
failure message).
"""

from __future__ import annotations

import os
import random
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from tests.http_api.test_http_auth import SU, SUPERUSER, call
from tests_support import BrokerProcess

SEED = int(os.environ.get("DMQ_AUTH_MODEL_SEED", "20261129"))
STEPS = int(os.environ.get("DMQ_AUTH_MODEL_STEPS", "2000"))
BINDINGS_MAX = 32  # past it a grant step revokes instead: the ACL set keeps refusing things
V2 = "application/vnd.kafka.v2+json"
V2_JSON = "application/vnd.kafka.json.v2+json"

USERS = ("alice", "bob")
TOPICS = ("app-a", "app-b", "secret-x", "pub", "sg-1.dlq", "app-dlq")
GROUPS = ("g-1", "g-2", "app-g")
TXNS = ("tx-1", "tx-2", "app-tx")
SHARES = ("sg-1", "sg-2", "app-sg")
PATTERNS = ("app-.*", "secret-.*", ".*", "(app|secret)-.*", "sg-.*|pub")
# The names ACL bindings use: every resource, some prefixes, and the literal "*".
ACL_NAMES = {
    "topic": (*TOPICS, "app-", "secret-", "sg-", "*"),
    "group": (*GROUPS, "g-", "app-", "*"),
    "transactional_id": (*TXNS, "tx-", "app-", "*"),
    "share_group": (*SHARES, "sg-", "app-", "*"),
    "cluster": ("cluster",),
}
# Drawn with these weights: operations need several rights at once, so broad grants
# come often enough for every operation to be let through as well as refused.
OPERATIONS = {"read": 3, "write": 3, "create": 2, "delete": 1, "alter": 1, "describe": 1, "all": 3}
_IMPLY_DESCRIBE = {"read", "write", "delete", "alter"}


@dataclass(frozen=True)
class Binding:
    principal: str
    resource_type: str
    pattern: str
    name: str
    operation: str
    permission: str

    def json(self) -> dict[str, str]:
        return {"principal": self.principal, "resource_type": self.resource_type,
                "pattern": self.pattern, "resource_name": self.name,
                "operation": self.operation, "permission": self.permission}  # fmt: skip

    def matches(self, name: str) -> bool:
        if self.pattern == "prefixed":
            return name.startswith(self.name)
        return self.name in (name, "*")


@dataclass
class Model:
    """What the cluster should hold, and what it should let each user do (module docstring)."""

    acls: set[Binding] = field(default_factory=set)
    topics: set[str] = field(default_factory=set)
    dead_letter_topics: dict[str, str] = field(default_factory=dict)  # share group -> its own

    def allows(self, user: str, resource_type: str, name: str, operation: str) -> bool:
        mine = [
            b for b in self.acls
            if b.principal in (f"User:{user}", "User:*") and b.resource_type == resource_type
            and b.matches(name)
        ]  # fmt: skip
        if any(b.permission == "deny" and b.operation in (operation, "all") for b in mine):
            return False
        granting = {operation, "all"} | (_IMPLY_DESCRIBE if operation == "describe" else set())
        return any(b.permission == "allow" and b.operation in granting for b in mine)

    def may_create_topic(self, user: str, topic: str) -> bool:
        return self.allows(user, "topic", topic, "create") or self.allows(
            user, "cluster", "cluster", "create"
        )

    def readable(self, user: str, topic: str) -> bool:
        return self.allows(user, "topic", topic, "describe") and self.allows(
            user, "topic", topic, "read"
        )

    def dead_letter_topic(self, group: str, body: dict[str, Any]) -> str:
        given = body.get("dead_letter_topic")
        return given or self.dead_letter_topics.get(group) or f"{group}.dlq"


@dataclass
class Attempt:
    """One operation by a user: what the model says and what the broker answered."""

    what: str
    allowed: bool  # every right it needs, per the model
    possible: bool  # and the resources it needs exist: it should succeed
    status: int
    doc: Any
    leaks: list[str] = field(default_factory=list)  # topics shown that the model hides

    @property
    def succeeded(self) -> bool:
        return 200 <= self.status < 300

    @property
    def refused(self) -> bool:
        code = self.doc.get("error", {}).get("code") if isinstance(self.doc, dict) else None
        return self.status in (401, 403) or code == "topic_not_found"


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    data_dir: Path = tmp_path_factory.mktemp("auth-model") / "data"
    b = BrokerProcess(
        data_dir, extra_args=["--auth", "on"], env={"DMQ_SUPERUSER_TOKEN": SUPERUSER}
    ).start()
    try:
        for user in USERS:
            body = {"name": user, "password": f"{user}-password-1"}
            assert call(b, "POST", "/v1/auth/users", body, SU)[0] == 201
        yield b
    finally:
        b.stop()


def _auth(user: str) -> str:
    return f"Bearer {user}:{user}-password-1"


class Run:
    """The driver: one seeded sequence of steps against the broker and the model."""

    def __init__(self, broker: BrokerProcess, seed: int) -> None:
        self.b = broker
        self.rng = random.Random(seed)
        self.seed = seed
        self.model = Model()
        self.history: list[str] = []
        self.counts: Counter[tuple[str, str]] = Counter()
        self.mismatches: list[str] = []
        self.others: list[str] = []
        self.step_no = 0

    # --- the superuser's steps --------------------------------------------------------------

    def su_create_topic(self, topic: str) -> None:
        status, _, doc = call(self.b, "POST", "/v1/topics", {"name": topic, "partitions": 1}, SU)
        assert status in (201, 409), (status, doc)
        self.model.topics.add(topic)
        records = {"records": [{"value": f"{topic}-0"}]}
        assert call(self.b, "POST", f"/v1/topics/{topic}/records", records, SU)[0] == 200
        self.history.append(f"superuser creates {topic}")

    def su_churn_topic(self) -> None:
        """Create a missing topic, or delete one: both states of every topic come up."""
        topic = self.rng.choice(TOPICS)
        if topic not in self.model.topics:
            self.su_create_topic(topic)
            return
        status, _, doc = call(self.b, "DELETE", f"/v1/topics/{topic}", auth=SU)
        assert 200 <= status < 300, (status, doc)
        self.model.topics.discard(topic)
        self.history.append(f"superuser deletes {topic}")

    def grant(self) -> None:
        if len(self.model.acls) >= BINDINGS_MAX:
            self.revoke()
            return
        r = self.rng
        rtype = r.choice(tuple(ACL_NAMES))
        name = r.choice(ACL_NAMES[rtype])
        pattern = "literal" if name in ("*", "cluster") else r.choice(("literal", "prefixed"))
        ops = ("create", "describe", "alter", "all") if rtype == "cluster" else tuple(OPERATIONS)
        weights = [OPERATIONS[op] for op in ops]
        b = Binding(
            r.choice(("User:alice", "User:bob", "User:*")),
            rtype,
            pattern,
            name,
            r.choices(ops, weights)[0],
            "deny" if r.random() < 0.15 else "allow",
        )
        status, _, doc = call(self.b, "POST", "/v1/acls", b.json(), SU)
        assert status == 201, (status, doc)
        self.model.acls.add(b)
        self.history.append(f"grant {b}")

    def revoke(self) -> None:
        if not self.model.acls:
            return
        b = self.rng.choice(sorted(self.model.acls, key=str))
        status, _, doc = call(self.b, "DELETE", "/v1/acls", b.json(), SU)
        assert status == 200, (status, doc)
        self.model.acls.discard(b)
        self.history.append(f"revoke {b}")

    # --- checking an attempt ----------------------------------------------------------------

    def judge(self, a: Attempt) -> None:
        self.history.append(f"{a.what}: allowed={a.allowed} possible={a.possible} -> {a.status}")
        where = f"seed {self.seed}, step {self.step_no}: {a.what}"
        assert not (a.succeeded and not a.allowed), self._explain(
            f"SAFETY: {where} succeeded ({a.status} {a.doc}) but the model refuses it"
        )
        assert not a.leaks, self._explain(f"SAFETY: {where} showed hidden topics {a.leaks}")
        kind = a.what.split()[1]
        outcome = "ok" if a.succeeded else "refused" if a.refused else "other"
        self.counts[(kind, outcome)] += 1
        if a.allowed and a.possible and not a.succeeded:
            line = f"{where} -> {a.status} {a.doc}"
            (self.mismatches if a.refused else self.others).append(line)

    def _explain(self, message: str) -> str:
        acls = "\n  ".join(sorted(map(str, self.model.acls)))
        recent = "\n  ".join(self.history[-15:])
        return f"{message}\nACLs:\n  {acls}\ntopics: {sorted(self.model.topics)}\n" \
               f"last steps:\n  {recent}"  # fmt: skip

    def hidden(self, user: str, topics: Any) -> list[str]:
        return sorted({t for t in topics if not self.model.readable(user, t)})


# --- the users' operations: each one call (and the superuser's setup and cleanup) ----------


def op_produce(run: Run, user: str) -> Attempt:
    m, t = run.model, run.rng.choice(TOPICS)
    exists = t in m.topics
    allowed = m.allows(user, "topic", t, "write") and (exists or m.may_create_topic(user, t))
    body = {"records": [{"value": "v"}]}
    status, _, doc = call(run.b, "POST", f"/v1/topics/{t}/records", body, _auth(user))
    if 200 <= status < 300:
        m.topics.add(t)  # auto-created
    return Attempt(f"{user} produce {t}", allowed, True, status, doc)


def op_fetch(run: Run, user: str) -> Attempt:
    m, t = run.model, run.rng.choice(TOPICS)
    path = f"/v1/topics/{t}/partitions/0/records?offset=0&wait_ms=0"
    status, _, doc = call(run.b, "GET", path, auth=_auth(user))
    return Attempt(f"{user} fetch {t}", m.allows(user, "topic", t, "read"), t in m.topics,
                   status, doc)  # fmt: skip


def op_describe(run: Run, user: str) -> Attempt:
    m, t = run.model, run.rng.choice(TOPICS)
    status, _, doc = call(run.b, "GET", f"/v1/topics/{t}", auth=_auth(user))
    return Attempt(f"{user} describe {t}", m.allows(user, "topic", t, "describe"),
                   t in m.topics, status, doc)  # fmt: skip


def op_create(run: Run, user: str) -> Attempt:
    m, t = run.model, run.rng.choice(TOPICS)
    body = {"name": t, "partitions": 1}
    status, _, doc = call(run.b, "POST", "/v1/topics", body, _auth(user))
    if status == 201:
        m.topics.add(t)
    return Attempt(f"{user} create {t}", m.may_create_topic(user, t), t not in m.topics
                   or status == 201, status, doc)  # fmt: skip


def op_delete(run: Run, user: str) -> Attempt:
    m, t = run.model, run.rng.choice(TOPICS)
    existed = t in m.topics
    status, _, doc = call(run.b, "DELETE", f"/v1/topics/{t}", auth=_auth(user))
    if 200 <= status < 300:
        m.topics.discard(t)
    return Attempt(f"{user} delete {t}", m.allows(user, "topic", t, "delete"), existed,
                   status, doc)  # fmt: skip


def op_alter(run: Run, user: str) -> Attempt:
    m, t = run.model, run.rng.choice(TOPICS)
    body = {"config": {"retention_ms": 3_600_000 + run.step_no}}
    status, _, doc = call(run.b, "PATCH", f"/v1/topics/{t}/config", body, _auth(user))
    return Attempt(f"{user} alter {t}", m.allows(user, "topic", t, "alter"), t in m.topics,
                   status, doc)  # fmt: skip


def op_commit(run: Run, user: str) -> Attempt:
    m, g, t = run.model, run.rng.choice(GROUPS), run.rng.choice(TOPICS)
    body = {"offsets": [{"topic": t, "partition": 0, "offset": 1}]}
    status, _, doc = call(run.b, "POST", f"/v1/groups/{g}/offsets", body, _auth(user))
    allowed = m.allows(user, "group", g, "read") and m.allows(user, "topic", t, "read")
    return Attempt(f"{user} commit {g} {t}", allowed, t in m.topics, status, doc)


def _leave(run: Run, group: str, doc: Any) -> None:
    member = doc.get("member_id") if isinstance(doc, dict) else None
    if member:
        status, _, left = call(run.b, "DELETE", f"/v1/groups/{group}/members/{member}", auth=SU)
        assert status == 204, (status, left)


def op_join(run: Run, user: str) -> Attempt:
    m, g, t = run.model, run.rng.choice(GROUPS), run.rng.choice(TOPICS)
    status, _, doc = call(run.b, "POST", f"/v1/groups/{g}/members", {"topics": [t]}, _auth(user))
    _leave(run, g, doc)
    allowed = m.allows(user, "group", g, "read") and m.allows(user, "topic", t, "read")
    return Attempt(f"{user} join {g} [{t}]", allowed, t in m.topics, status, doc)


def op_join_pattern(run: Run, user: str) -> Attempt:
    m, g, pattern = run.model, run.rng.choice(GROUPS), run.rng.choice(PATTERNS)
    status, _, doc = call(run.b, "POST", f"/v1/groups/{g}/members", {"topic_pattern": pattern},
                          _auth(user))  # fmt: skip
    a = Attempt(f"{user} join-pattern {g} {pattern!r}", m.allows(user, "group", g, "read"), True,
                status, doc)  # fmt: skip
    if a.succeeded:
        shown = [p["topic"] for p in doc["assignment"] + doc["revoking"]]
        path = f"/v1/groups/{g}/members/{doc['member_id']}/records?wait_ms=0"
        got, _, fetched = call(run.b, "GET", path, auth=_auth(user))
        assert got == 200, (got, fetched)
        shown += [p["topic"] for p in fetched["partitions"]]
        a.leaks = run.hidden(user, shown)
    _leave(run, g, doc)
    return a


def op_v2_pattern(run: Run, user: str) -> Attempt:
    m, g, pattern = run.model, run.rng.choice(GROUPS), run.rng.choice(PATTERNS)
    name = f"c{run.step_no}"
    consumer = {"name": name, "format": "binary", "auto.offset.reset": "earliest"}
    status, _, doc = call(run.b, "POST", f"/consumers/{g}", consumer, _auth(user), V2)
    a = Attempt(f"{user} v2-pattern {g} {pattern!r}", m.allows(user, "group", g, "read"), True,
                status, doc)  # fmt: skip
    if not a.succeeded:
        return a
    base = f"/consumers/{g}/instances/{name}"
    sub = call(run.b, "POST", base + "/subscription", {"topic_pattern": pattern}, _auth(user), V2)
    a.status, a.doc = sub[0], sub[2]
    if a.succeeded:
        shown = []
        for path in ("/assignments", "/records?timeout=0"):
            got, _, answer = call(run.b, "GET", base + path, auth=_auth(user))
            assert got == 200, (path, got, answer)
            rows = answer["partitions"] if path == "/assignments" else answer
            shown += [row["topic"] for row in rows]
        a.leaks = run.hidden(user, shown)
    status, _, left = call(run.b, "DELETE", base, auth=SU)
    assert status == 204, (status, left)
    return a


def op_init_producer(run: Run, user: str) -> Attempt:
    tx = run.rng.choice(TXNS)
    status, _, doc = call(run.b, "POST", "/v1/producers", {"transactional_id": tx}, _auth(user))
    return Attempt(f"{user} init-producer {tx}", run.model.allows(user, "transactional_id", tx,
                   "write"), True, status, doc)  # fmt: skip


def op_txn_offsets(run: Run, user: str) -> Attempt:
    """The superuser starts the producer (not the right under test), the user adds a
    group's offsets to its transaction, the superuser aborts it."""
    m, r = run.model, run.rng
    tx, g, t = r.choice(TXNS), r.choice(GROUPS), r.choice(TOPICS)
    status, _, producer = call(run.b, "POST", "/v1/producers", {"transactional_id": tx}, SU)
    assert status == 201, (status, producer)
    ident = {"producer_id": producer["producer_id"], "producer_epoch": producer["producer_epoch"]}
    body = {**ident, "group": g, "offsets": [{"topic": t, "partition": 0, "offset": 1}]}
    status, _, doc = call(run.b, "POST", f"/v1/transactions/{tx}/offsets", body, _auth(user))
    if 200 <= status < 300:
        ended, _, answer = call(run.b, "POST", f"/v1/transactions/{tx}/abort", ident, SU)
        assert ended == 200, (ended, answer)
    allowed = (m.allows(user, "transactional_id", tx, "write") and m.allows(user, "group", g,
               "read") and m.allows(user, "topic", t, "read"))  # fmt: skip
    return Attempt(f"{user} txn-offsets {tx} {g} {t}", allowed, t in m.topics, status, doc)


def op_share_put(run: Run, user: str) -> Attempt:
    m, r = run.model, run.rng
    group = r.choice(SHARES)
    body: dict[str, Any] = r.choice(
        ({"max_delivery_attempts": 3}, {"dead_letter_topic": r.choice(TOPICS)})
    )
    dlq = m.dead_letter_topic(group, body)
    allowed = (
        m.allows(user, "share_group", group, "alter")
        and m.allows(user, "topic", dlq, "write")
        and (dlq in m.topics or m.may_create_topic(user, dlq))
    )
    status, _, doc = call(run.b, "PUT", f"/v1/share-groups/{group}", body, _auth(user))
    if 200 <= status < 300 and "dead_letter_topic" in body:
        m.dead_letter_topics[group] = body["dead_letter_topic"]
    return Attempt(f"{user} share-put {group} {body} (dead letters to {dlq})", allowed, True,
                   status, doc)  # fmt: skip


def op_v2_produce(run: Run, user: str) -> Attempt:
    m, t = run.model, run.rng.choice(TOPICS)
    allowed = m.allows(user, "topic", t, "write") and (t in m.topics or m.may_create_topic(user, t))
    body = {"records": [{"value": {"n": run.step_no}}]}
    status, _, doc = call(run.b, "POST", f"/topics/{t}", body, _auth(user), V2_JSON)
    if 200 <= status < 300:
        m.topics.add(t)  # auto-created
    return Attempt(f"{user} v2-produce {t}", allowed, True, status, doc)


def op_reset(run: Run, user: str) -> Attempt:
    m, g, t = run.model, run.rng.choice(GROUPS), run.rng.choice(TOPICS)
    body = {"to": "earliest", "topics": [t]}
    status, _, doc = call(run.b, "POST", f"/v1/groups/{g}/offsets/reset", body, _auth(user))
    allowed = m.allows(user, "group", g, "delete") and m.allows(user, "topic", t, "read")
    return Attempt(f"{user} reset {g} {t}", allowed, t in m.topics, status, doc)


def _topics_in(doc: Any) -> list[str]:
    """Every value of a "topic" key anywhere in a JSON document."""
    if isinstance(doc, dict):
        own = [doc["topic"]] if isinstance(doc.get("topic"), str) else []
        return own + [t for v in doc.values() for t in _topics_in(v)]
    if isinstance(doc, list):
        return [t for v in doc for t in _topics_in(v)]
    return []


def op_describe_group(run: Run, user: str) -> Attempt:
    """The superuser commits an offset of some topic into the group first: the user must
    not see it unless it may describe that topic."""
    m, r = run.model, run.rng
    g, t = r.choice(GROUPS), r.choice(sorted(m.topics) or TOPICS)
    if t in m.topics:
        commit = {"offsets": [{"topic": t, "partition": 0, "offset": 1}]}
        call(run.b, "POST", f"/v1/groups/{g}/offsets", commit, SU)
    path = r.choice((f"/v1/groups/{g}", f"/v1/groups/{g}/offsets"))
    status, _, doc = call(run.b, "GET", path, auth=_auth(user))
    a = Attempt(f"{user} describe-group {path}", m.allows(user, "group", g, "describe"), False,
                status, doc)  # fmt: skip
    if a.succeeded:
        a.leaks = sorted({x for x in _topics_in(doc) if not m.allows(user, "topic", x, "describe")})
    return a


def op_share_join(run: Run, user: str) -> Attempt:
    m, group, t = run.model, run.rng.choice(SHARES), run.rng.choice(TOPICS)
    path = f"/v1/share-groups/{group}/members"
    status, _, doc = call(run.b, "POST", path, {"topics": [t]}, _auth(user))
    if 200 <= status < 300:
        left, _, answer = call(run.b, "DELETE", f"{path}/{doc['member_id']}", auth=SU)
        assert left == 204, (left, answer)
    allowed = m.allows(user, "share_group", group, "read") and m.allows(user, "topic", t, "read")
    return Attempt(f"{user} share-join {group} [{t}]", allowed, t in m.topics, status, doc)


OPS: tuple[tuple[Callable[[Run, str], Attempt], int], ...] = (
    (op_produce, 3), (op_fetch, 2), (op_describe, 2), (op_create, 2), (op_delete, 1),
    (op_alter, 1), (op_commit, 2), (op_join, 2), (op_join_pattern, 2), (op_v2_pattern, 2),
    (op_init_producer, 1), (op_txn_offsets, 3), (op_share_put, 3), (op_v2_produce, 1),
    (op_reset, 1), (op_describe_group, 2), (op_share_join, 1),
)  # fmt: skip


def test_no_operation_succeeds_that_the_model_refuses(broker: BrokerProcess) -> None:
    run = Run(broker, SEED)
    for topic in ("app-a", "secret-x", "pub"):
        run.su_create_topic(topic)
    ops, weights = zip(*OPS, strict=True)
    for step in range(STEPS):
        run.step_no = step
        roll = run.rng.random()
        if roll < 0.22:
            run.grant()
        elif roll < 0.30:
            run.revoke()
        elif roll < 0.33:
            run.su_churn_topic()
        else:
            op = run.rng.choices(ops, weights)[0]
            run.judge(op(run, run.rng.choice(USERS)))
    summary = ", ".join(f"{k[0]} {k[1]} {n}" for k, n in sorted(run.counts.items()))
    print(f"seed {SEED}, {STEPS} steps: {summary}; others: {run.others}")
    assert not run.mismatches, "allowed by the model but refused:\n" + "\n".join(run.mismatches)
    # Not vacuous: every operation was both let through and refused in this run.
    for op in ops:
        kind = op.__name__.removeprefix("op_").replace("_", "-")
        assert run.counts[(kind, "ok")] and run.counts[(kind, "refused")], (kind, summary)
