"""Proves the route table (http_api/access.py, ROUTE_NEEDS) on a real `dmq serve --auth on`:

- every route of the OpenAPI document has an entry (a new route without one fails here),
  and http_api/README.md shows the table as the code has it;
- walking every route of the OpenAPI document, for each resource its entry names in the
  path, the query or the body, a principal allowed everything but that one right is
  refused, and the refusal names that resource (403 with its operation, type and name;
  404 topic_not_found when the right is describe on a topic), while the same call naming
  another resource of the same type is not refused for it;
- a topic the principal may not describe answers, on every route that names a topic,
  exactly as a topic that exists nowhere (same status, code and message but for the name).

The resources known only at run time (`run:` needs) are proven by
tests/http_api/test_http_auth_holes.py.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from dmq.config import BrokerConfig
from http_api.access import KINDS, ROUTE_NEEDS, Need, is_static, table_markdown
from http_api.openapi import openapi_document
from tests.http_api.test_http_auth import SU, SUPERUSER, call
from tests_support import BrokerProcess

WALKER = "walker"
AUTH = f"Bearer {WALKER}:walker-pass-1"
REFUSED = "refused-name"  # the resource whose right is taken away
ALLOWED = {"topic": "walk-topic", "group": "walk-group", "transactional_id": "walk-txn",
           "share_group": "walk-share", "cluster": "cluster"}  # fmt: skip
HIDDEN, MISSING = "walk-hidden", "walk-missing"  # exists but may not be described / exists not
_PARAM_TYPES = {"topic": "topic", "group": "group", "transactional_id": "transactional_id"}
_NUMERIC = {"partition", "p", "broker_id"}
ROOT = Path(__file__).resolve().parents[2]


def _routes() -> list[tuple[str, str]]:
    doc = openapi_document(BrokerConfig())
    return [
        (method.upper(), template)
        for template, item in doc["paths"].items()
        for method in item
        if method in ("get", "post", "put", "patch", "delete")
    ]


def test_every_documented_route_has_a_table_entry() -> None:
    missing = [route for route in _routes() if route not in ROUTE_NEEDS]
    assert not missing, f"routes without an entry in http_api/access.py ROUTE_NEEDS: {missing}"
    for route, needs in ROUTE_NEEDS.items():
        assert needs and all(n in KINDS or n.source for n in needs), route


def test_the_readme_shows_the_table_the_code_uses() -> None:
    readme = (ROOT / "http_api" / "README.md").read_text()
    assert table_markdown() in readme, "regenerate the table: http_api.access.table_markdown()"


def _acl(resource_type: str, name: str, operation: str, permission: str) -> dict[str, str]:
    return {"principal": f"User:{WALKER}", "resource_type": resource_type,
            "resource_name": name, "operation": operation, "permission": permission}  # fmt: skip


@pytest.fixture(scope="module")
def walker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    data_dir: Path = tmp_path_factory.mktemp("access") / "data"
    broker = BrokerProcess(
        data_dir, extra_args=["--auth", "on"], env={"DMQ_SUPERUSER_TOKEN": SUPERUSER}
    ).start()
    try:
        user = {"name": WALKER, "password": "walker-pass-1"}
        assert call(broker, "POST", "/v1/auth/users", user, SU)[0] == 201
        for resource_type, name in ALLOWED.items():
            acl = _acl(resource_type, "cluster" if name == "cluster" else "*", "all", "allow")
            assert call(broker, "POST", "/v1/acls", acl, SU)[0] == 201
        assert call(broker, "POST", "/v1/topics", {"name": HIDDEN}, SU)[0] == 201
        yield broker
    finally:
        broker.stop()


def _body_at(path: str, name: str) -> Any:
    """The smallest JSON value holding `name` at `path` (http_api/access.py strings_at)."""
    value: Any = name
    for step in reversed(path.split(".")):
        key = step.removesuffix("[]")
        value = {key: [value] if step.endswith("[]") else value}
    return value


def _merge(a: dict[str, Any], b: dict[str, Any]) -> dict[str, Any]:
    out = dict(a)
    for k, v in b.items():
        out[k] = _merge(out[k], v) if isinstance(out.get(k), dict) and isinstance(v, dict) else v
    return out


def _request(template: str, needs: tuple[Need, ...], target: Need, name: str) -> tuple[str, Any]:
    """The path and body of a call naming `name` where `target` takes its name, and an
    allowed name everywhere else."""

    def fill(m: re.Match[str]) -> str:
        param = m.group(1)
        if target.source == f"path:{param}":
            return name
        if param in _NUMERIC:
            return "0"
        return ALLOWED.get(_PARAM_TYPES.get(param, ""), "x")

    path = re.sub(r"\{([a-z_]+)\}", fill, template)
    body: dict[str, Any] = {}
    query = []
    for need in needs:
        if not is_static(need) or need.source in ("cluster",) or need.source.startswith("path:"):
            continue
        kind, _, where = need.source.partition(":")
        value = name if need is target else ALLOWED[need.resource_type]
        if kind == "query":
            query.append(f"{where}={value}")
        else:
            body = _merge(body, _body_at(where, value))
    return path + ("?" + "&".join(query) if query else ""), body


def _static_needs() -> Iterator[tuple[str, str, Need]]:
    for method, template in _routes():
        for need in ROUTE_NEEDS[(method, template)]:
            if is_static(need):
                yield method, template, need


def _content_type(template: str) -> str:
    return "application/json" if template.startswith("/v1") else "application/vnd.kafka.v2+json"


def test_each_resource_of_each_route_is_refused_without_its_right(walker: BrokerProcess) -> None:
    checked = 0
    for method, template, need in _static_needs():
        needs = ROUTE_NEEDS[(method, template)]
        name = "cluster" if need.source == "cluster" else REFUSED
        denials = [_acl(need.resource_type, name, need.operation, "deny")]
        if (need.resource_type, need.operation) == ("topic", "create"):  # create on cluster too
            denials.append(_acl("cluster", "cluster", "create", "deny"))
        for acl in denials:
            assert call(walker, "POST", "/v1/acls", acl, SU)[0] == 201
        try:
            path, body = _request(template, needs, need, name)
            status, _, answer = call(walker, method, path, body, AUTH, _content_type(template))
        finally:
            for acl in denials:
                assert call(walker, "DELETE", "/v1/acls", acl, SU)[0] == 200
        where = (method, template, need.source, status, answer)
        if (need.resource_type, need.operation) == ("topic", "describe"):
            assert status == 404 and answer["error"]["code"] == "topic_not_found", where
            assert repr(name) in answer["error"]["message"], where
        else:
            assert status == 403, where
            details = answer["error"]["details"]
            refused = (details["resource_type"], details["resource_name"], details["operation"])
            assert refused == (need.resource_type, name, need.operation), where
        checked += 1
    assert checked > 80, checked


def test_a_hidden_topic_answers_as_a_missing_one_on_every_route(walker: BrokerProcess) -> None:
    # Hidden: no right at all on it (a deny of describe alone leaves read, which implies
    # seeing it, as in Kafka).
    denials = [_acl("topic", t, "all", "deny") for t in (HIDDEN, MISSING)]
    for acl in denials:
        assert call(walker, "POST", "/v1/acls", acl, SU)[0] == 201
    compared = 0
    try:
        for method, template, need in _static_needs():
            # Creating needs create (or create on the cluster), which, as in Kafka, may
            # learn that a name is taken (409): a principal that may create any topic.
            if need.resource_type != "topic" or (method, template) == ("POST", "/v1/topics"):
                continue
            answers = []
            for name in (HIDDEN, MISSING):
                path, body = _request(template, ROUTE_NEEDS[(method, template)], need, name)
                status, _, answer = call(walker, method, path, body, AUTH, _content_type(template))
                answers.append((status, str(answer).replace(name, "<topic>")))
            assert answers[0] == answers[1], (method, template, need.source, answers)
            assert answers[0][0] == 404 and "topic_not_found" in answers[0][1], answers
            compared += 1
    finally:
        for acl in denials:
            call(walker, "DELETE", "/v1/acls", acl, SU)
    assert compared > 30, compared
