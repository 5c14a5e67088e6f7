"""Proves authentication, ACLs and quotas on a real `dmq serve --auth on` (http_api/auth.py,
dmq/broker/security.py), over real HTTP:

- every route of the router has exactly one entry in ROUTE_NEEDS (a new route without
  one fails here), and every route of the OpenAPI document refuses an anonymous caller
  with 401 (WWW-Authenticate on the public port's routes), except the public ones;
- a user with read on topic `a` gets 403 producing to `a` (naming the operation and the
  resource), 404 describing `b`, sees only `a` in the topic list, and reads `a`; Basic
  and Bearer carry the same credential; a wrong password is 401; a deleted user is 401
  at once (the credential cache follows the catalogue);
- a principal over its requests/s quota gets 429 with Retry-After, and its next request
  after the wait passes; the quota and what is left show in GET /v1/quotas;
- a produce over the principal's bytes/s is 429 and writes nothing (the log holds only
  the request before it);
- a forged broker signature (X-Dmq-Signature) on a public route is 401;
- read on a group is not read on its topics (at the join; a pattern matches only the
  topics it may describe and read); a transactional id and an auto-created topic need
  their own permissions.
"""

from __future__ import annotations

import base64
import json
import re
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from dmq.config import BrokerConfig
from http_api.access import PUBLIC, ROUTE_NEEDS
from http_api.app import ROUTES
from http_api.openapi import openapi_document
from tests_support import BrokerProcess

SUPERUSER = "superuser-token-for-tests-0123"


def call(
    broker: BrokerProcess,
    method: str,
    path: str,
    body: dict[str, Any] | bytes | None = None,
    auth: str | None = None,
    content_type: str = "application/json",
) -> tuple[int, dict[str, str], Any]:
    data = json.dumps(body).encode() if isinstance(body, dict) else body
    req = urllib.request.Request(broker.url + path, data=data, method=method)
    if data is not None:
        req.add_header("Content-Type", content_type)
    if auth is not None:
        req.add_header("Authorization", auth)
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:
            status, headers, raw = resp.status, dict(resp.headers), resp.read()
    except urllib.error.HTTPError as err:
        status, headers, raw = err.code, dict(err.headers), err.read()
    try:
        return status, headers, json.loads(raw) if raw else None
    except ValueError:
        return status, headers, raw


def basic(name: str, password: str) -> str:
    return "Basic " + base64.b64encode(f"{name}:{password}".encode()).decode()


SU = f"Bearer {SUPERUSER}"


@pytest.fixture(scope="module")
def auth_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    data_dir: Path = tmp_path_factory.mktemp("auth") / "data"
    broker = BrokerProcess(
        data_dir, extra_args=["--auth", "on"], env={"DMQ_SUPERUSER_TOKEN": SUPERUSER}
    ).start()
    try:
        yield broker
    finally:
        broker.stop()


def test_every_route_has_one_entry_in_the_table() -> None:
    routes = {(method, path) for method, path, _ in ROUTES}
    assert routes == set(ROUTE_NEEDS), (
        f"missing: {sorted(routes - set(ROUTE_NEEDS))}; stale: {sorted(set(ROUTE_NEEDS) - routes)}"
    )


def test_every_documented_route_refuses_an_anonymous_caller(auth_broker: BrokerProcess) -> None:
    doc = openapi_document(BrokerConfig())
    checked = 0
    for template, item in doc["paths"].items():
        for method in item:
            if method not in ("get", "post", "put", "patch", "delete"):
                continue
            if ROUTE_NEEDS[(method.upper(), template)] == (PUBLIC,):
                continue
            path = re.sub(r"\{(partition|p)\}", "0", template)
            path = re.sub(r"\{[a-z_]+\}", "x", path)
            status, headers, body = call(auth_broker, method.upper(), path, body=b"{}")
            assert status == 401, (method, template, status, body)
            assert body["error"]["code"] == "unauthenticated"
            if not template.startswith("/v1/internal/"):  # those want the cluster secret
                assert headers.get("WWW-Authenticate", "").startswith("Bearer"), template
            checked += 1
    assert checked > 60


def test_read_on_a_gives_403_producing_404_describing_b(auth_broker: BrokerProcess) -> None:
    b = auth_broker
    for topic in ("a", "b"):
        assert call(b, "POST", "/v1/topics", {"name": topic}, SU)[0] in (201, 409)
    assert call(b, "POST", "/v1/topics/a/records", {"records": [{"value": "v"}]}, SU)[0] == 200
    status, _, user = call(b, "POST", "/v1/auth/users", {"name": "reader"}, SU)
    assert status == 201 and user["token"].startswith("reader:")
    token = user["token"]
    acl = {"principal": "User:reader", "resource_type": "topic", "resource_name": "a",
           "operation": "read"}  # fmt: skip
    assert call(b, "POST", "/v1/acls", acl, SU)[0] == 201

    status, _, body = call(b, "POST", "/v1/topics/a/records", {"records": [{"value": "x"}]},
                           f"Bearer {token}")  # fmt: skip
    assert status == 403, body
    assert body["error"]["code"] == "forbidden"
    assert body["error"]["details"]["operation"] == "write"
    assert body["error"]["details"]["resource_name"] == "a"
    status, _, body = call(b, "GET", "/v1/topics/b", auth=f"Bearer {token}")
    assert status == 404 and body["error"]["code"] == "topic_not_found"
    status, _, body = call(b, "GET", "/v1/topics", auth=f"Bearer {token}")
    assert status == 200 and [t["name"] for t in body["topics"]] == ["a"]
    status, _, body = call(b, "GET", "/topics", auth=f"Bearer {token}")  # REST v2
    assert status == 200 and body == ["a"], body
    name, password = token.split(":", 1)
    status, _, body = call(
        b, "GET", "/v1/topics/a/partitions/0/records", auth=basic(name, password)
    )
    assert status == 200 and [r["value"] for r in body["records"]] == ["v"]
    status, _, body = call(b, "GET", "/v1/topics/a", auth=basic(name, password + "x"))
    assert status == 401 and body["error"]["details"]["reason"] == "credentials"
    # No hash or salt is ever answered.
    _, _, users = call(b, "GET", "/v1/auth/users", auth=SU)
    assert [u["name"] for u in users["users"]] == ["reader"]
    assert "key" not in json.dumps(users) and "salt" not in json.dumps(users)
    assert call(b, "GET", "/v1/auth/users", auth=f"Bearer {token}")[0] == 403

    assert call(b, "DELETE", "/v1/auth/users/reader", auth=SU)[0] == 200
    assert call(b, "GET", "/v1/topics/a", auth=f"Bearer {token}")[0] == 401  # cache follows
    assert call(b, "DELETE", "/v1/auth/users/reader", auth=SU)[0] == 404


def test_over_quota_is_429_with_retry_after_then_passes(auth_broker: BrokerProcess) -> None:
    b = auth_broker
    assert (
        call(b, "POST", "/v1/auth/users", {"name": "busy", "password": "busy-pass-1"}, SU)[0] == 201
    )
    quota = {"principal": "User:busy", "requests_per_s": 3}
    assert call(b, "POST", "/v1/quotas", quota, SU)[0] == 200
    auth = "Bearer busy:busy-pass-1"
    statuses = []
    for _ in range(8):
        status, headers, body = call(b, "GET", "/v1/auth/whoami", auth=auth)
        statuses.append(status)
        if status == 429:
            assert body["error"]["code"] == "quota_exceeded"
            assert int(headers["Retry-After"]) >= 1
            wait_ms = body["error"]["details"]["retry_after_ms"]
            break
    assert statuses[:3] == [200, 200, 200] and statuses[-1] == 429, statuses
    time.sleep(wait_ms / 1000 + 0.05)
    assert call(b, "GET", "/v1/auth/whoami", auth=auth)[0] == 200
    _, _, quotas = call(b, "GET", "/v1/quotas", auth=SU)
    (busy,) = [q for q in quotas["quotas"] if q["principal"] == "User:busy"]
    assert busy["requests_per_s"] == 3 and "requests_per_s" in busy["available_on_this_broker"]


def test_a_forged_broker_signature_is_refused(auth_broker: BrokerProcess) -> None:
    # A single node with --auth on and no secret file makes up a secret no one else has:
    # no caller can pass as a broker (http_api/auth.py, dmq/internal_auth.py).
    req = urllib.request.Request(auth_broker.url + "/v1/topics")
    req.add_header("X-Dmq-Signature", f"v1:{int(time.time() * 1000)}:{'0' * 64}")
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(req, timeout=10)
    assert refused.value.code == 401
    assert json.loads(refused.value.read())["error"]["details"]["reason"] == "signature"


def test_produce_bytes_quota_refuses_before_writing(auth_broker: BrokerProcess) -> None:
    b = auth_broker
    body = {"name": "writer", "password": "writer-pass-1"}
    assert call(b, "POST", "/v1/auth/users", body, SU)[0] == 201
    acl = {"principal": "User:writer", "resource_type": "topic", "resource_name": "w",
           "operation": "all"}  # fmt: skip
    assert call(b, "POST", "/v1/acls", acl, SU)[0] == 201
    quota = {"principal": "User:writer", "produce_bytes_per_s": 1000}
    assert call(b, "POST", "/v1/quotas", quota, SU)[0] == 200
    auth = "Bearer writer:writer-pass-1"
    assert call(b, "POST", "/v1/topics", {"name": "w"}, auth)[0] == 201
    record = {"records": [{"value": "x" * 1200}]}  # one body above the rate still passes
    status, _, first = call(b, "POST", "/v1/topics/w/records", record, auth)
    assert status == 200, first
    status, headers, refused = call(b, "POST", "/v1/topics/w/records", record, auth)
    assert status == 429 and refused["error"]["details"]["quota"] == "produce_bytes_per_s"
    assert int(headers["Retry-After"]) >= 1
    # Nothing of the refused request was written: one record in the log.
    _, _, log = call(b, "GET", "/v1/topics/w/partitions/0/offsets", auth=auth)
    assert log["high_watermark"] == 1


def test_checks_beyond_the_route_table(auth_broker: BrokerProcess) -> None:
    """Read on a group is not read on its topics; a transactional id and an auto-created
    topic need their own permissions (dmq/README.md, "Checks beyond the route table")."""
    b = auth_broker
    for topic in ("c", "d"):
        assert call(b, "POST", "/v1/topics", {"name": topic}, SU)[0] in (201, 409)
        records = {"records": [{"value": f"in-{topic}"}]}
        assert call(b, "POST", f"/v1/topics/{topic}/records", records, SU)[0] == 200
    status, _, user = call(b, "POST", "/v1/auth/users", {"name": "member"}, SU)
    assert status == 201
    me = f"Bearer {user['token']}"
    for resource_type, name, operation, pattern in (
        ("group", "g", "read", "literal"),
        ("topic", "c", "read", "literal"),
        ("topic", "d", "describe", "literal"),
        ("topic", "new", "write", "prefixed"),
    ):
        acl = {"principal": "User:member", "resource_type": resource_type, "pattern": pattern,
               "resource_name": name, "operation": operation}  # fmt: skip
        assert call(b, "POST", "/v1/acls", acl, SU)[0] == 201

    # A join naming a topic it may not read: 403 naming it, no member.
    status, _, body = call(b, "POST", "/v1/groups/g/members", {"topics": ["c", "d"]}, me)
    assert status == 403 and body["error"]["details"]["resource_name"] == "d", body
    status, _, member = call(b, "POST", "/v1/groups/g/members", {"topics": ["c"]}, me)
    assert status == 201, member
    path = f"/v1/groups/g/members/{member['member_id']}/records?wait_ms=200"
    status, _, body = call(b, "GET", path, auth=me)
    assert status == 200, body
    assert [r["value"] for p in body["partitions"] for r in p["records"]] == ["in-c"]
    assert call(b, "DELETE", f"/v1/groups/g/members/{member['member_id']}", auth=me)[0] == 204
    # A pattern matches only the topics it may describe and read: c, not d.
    status, _, member = call(b, "POST", "/v1/groups/g/members", {"topic_pattern": "^[cd]$"}, me)
    assert status == 201, member
    assert {a["topic"] for a in member["assignment"]} <= {"c"}, member
    path = f"/v1/groups/g/members/{member['member_id']}/records?wait_ms=200"
    status, _, body = call(b, "GET", path, auth=me)
    assert status == 200, body
    assert [r["value"] for p in body["partitions"] for r in p["records"]] == ["in-c"], body

    # A transactional id it may not write: its producer cannot be fenced nor written into.
    status, _, body = call(b, "POST", "/v1/producers", {"transactional_id": "t1"}, me)
    assert status == 403 and body["error"]["details"]["resource_type"] == "transactional_id"
    acl = {"principal": "User:member", "resource_type": "transactional_id",
           "resource_name": "t1", "operation": "write"}  # fmt: skip
    assert call(b, "POST", "/v1/acls", acl, SU)[0] == 201
    assert call(b, "POST", "/v1/producers", {"transactional_id": "t1"}, me)[0] == 201

    # Write on a prefix, no create: a produce cannot auto-create a topic under it.
    status, _, body = call(b, "POST", "/v1/topics/new1/records", {"records": [{"value": "x"}]}, me)
    assert status == 403 and body["error"]["details"]["operation"] == "create", body
    assert call(b, "GET", "/v1/topics/new1", auth=SU)[0] == 404
