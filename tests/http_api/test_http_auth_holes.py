"""Proves, on a real `dmq serve --auth on`, that the holes of issue 40 (items 1, 2, 3, 8) are
closed, with its principals: bob (read on group g-bob and topic app-orders), carol (write
on transactional id tx-carol, all on share groups prefixed sg-carol, read and write on
app-carol) and a topic secret-payroll only the superuser may see:

1. a REST v2 consumer (and a /v1 member) subscribed by `topic_pattern` is served, and
   shown, only the topics it may describe and read;
2. a transactional offset commit needs read on the group it commits into;
3. a share group's dead-letter topic needs write (and create, to be created) when it is
   configured, whether the PUT names it or the group keeps its own or the default
   `<group>.dlq`, and again when written, for the principal that configured it: a
   refusal leaves the record DEAD_LETTERING, and granting the right later lets it through;
8. a hidden topic in an offset commit answers as a missing one, and group descriptions
   and offsets do not show it.
"""

from __future__ import annotations

import base64
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.http_api.test_http_auth import SU, SUPERUSER, call
from tests_support import BrokerProcess

BOB, CAROL = "Bearer bob:bob-password-1", "Bearer carol:carol-password-1"
V2 = "application/vnd.kafka.v2+json"


def _acl(user: str, rtype: str, name: str, op: str, pattern: str = "literal") -> dict[str, str]:
    return {"principal": f"User:{user}", "resource_type": rtype, "resource_name": name,
            "operation": op, "pattern": pattern}  # fmt: skip


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    data_dir: Path = tmp_path_factory.mktemp("holes") / "data"
    b = BrokerProcess(
        data_dir, extra_args=["--auth", "on"], env={"DMQ_SUPERUSER_TOKEN": SUPERUSER}
    ).start()
    try:
        for name in ("bob", "carol"):
            user = {"name": name, "password": f"{name}-password-1"}
            assert call(b, "POST", "/v1/auth/users", user, SU)[0] == 201
        for acl in (
            _acl("bob", "group", "g-bob", "read"),
            _acl("bob", "topic", "app-orders", "read"),
            _acl("carol", "transactional_id", "tx-carol", "write"),
            _acl("carol", "share_group", "sg-carol", "all", "prefixed"),
            _acl("carol", "topic", "app-carol", "read"),
            _acl("carol", "topic", "app-carol", "write"),
        ):
            assert call(b, "POST", "/v1/acls", acl, SU)[0] == 201
        for topic in ("secret-payroll", "app-orders", "app-carol"):
            assert call(b, "POST", "/v1/topics", {"name": topic, "partitions": 3}, SU)[0] == 201
            records = {"records": [{"value": f"{topic}-{i}", "partition": i} for i in range(3)]}
            assert call(b, "POST", f"/v1/topics/{topic}/records", records, SU)[0] == 200
        yield b
    finally:
        b.stop()


def _values(doc: Any) -> list[str]:
    return sorted(base64.b64decode(r["value"]).decode() for r in doc)


def test_1_a_v2_pattern_subscription_reads_only_readable_topics(broker: BrokerProcess) -> None:
    b = broker
    consumer = {"name": "c1", "format": "binary", "auto.offset.reset": "earliest"}
    status, _, made = call(b, "POST", "/consumers/g-bob", consumer, BOB, V2)
    assert status == 200, made
    base = "/consumers/g-bob/instances/c1"
    pattern = {"topic_pattern": "(secret|app)-.*"}
    assert call(b, "POST", base + "/subscription", pattern, BOB, V2)[0] == 204
    got: list[str] = []
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline and len(got) < 3:
        status, _, records = call(b, "GET", base + "/records?timeout=500", auth=BOB)
        assert status == 200, records
        got += _values(records)
    assert sorted(got) == ["app-orders-0", "app-orders-1", "app-orders-2"], got
    status, _, assigned = call(b, "GET", base + "/assignments", auth=BOB)
    assert {p["topic"] for p in assigned["partitions"]} == {"app-orders"}, assigned
    _, _, subscription = call(b, "GET", base + "/subscription", auth=BOB)
    assert subscription["topics"] == ["app-orders"], subscription
    assert call(b, "DELETE", base, auth=BOB)[0] == 204


def test_1_a_v1_pattern_join_lists_and_serves_only_readable_topics(broker: BrokerProcess) -> None:
    b = broker
    join = {"topic_pattern": "secret-.*|app-orders"}
    status, _, member = call(b, "POST", "/v1/groups/g-bob/members", join, BOB)
    assert status == 201, member
    assert {a["topic"] for a in member["assignment"]} <= {"app-orders"}, member
    path = f"/v1/groups/g-bob/members/{member['member_id']}/records?wait_ms=1000"
    topics: set[str] = set()
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline and not topics:  # until its partitions are handed over
        status, _, fetched = call(b, "GET", path, auth=BOB)
        assert status == 200 and "secret-payroll" not in str(fetched), fetched
        topics = {p["topic"] for p in fetched["partitions"]}
    assert topics == {"app-orders"}, topics
    assert call(b, "DELETE", f"/v1/groups/g-bob/members/{member['member_id']}", auth=BOB)[0] == 204


def test_2_transactional_offsets_need_read_on_the_group(broker: BrokerProcess) -> None:
    b = broker
    status, _, producer = call(b, "POST", "/v1/producers", {"transactional_id": "tx-carol"}, CAROL)
    assert status == 201, producer
    body = {"producer_id": producer["producer_id"], "producer_epoch": producer["producer_epoch"],
            "group": "g-bob", "offsets": [{"topic": "app-carol", "partition": 0, "offset": 999}]}  # fmt: skip
    status, _, refused = call(b, "POST", "/v1/transactions/tx-carol/offsets", body, CAROL)
    assert status == 403, refused
    details = refused["error"]["details"]
    assert (details["resource_type"], details["resource_name"], details["operation"]) == (
        "group", "g-bob", "read",
    )  # fmt: skip
    _, _, offsets = call(b, "GET", "/v1/groups/g-bob/offsets", auth=SU)
    assert all(o["offset"] != 999 for o in offsets.get("offsets", [])), offsets


def _share_reject(b: BrokerProcess, group: str) -> None:
    status, _, joined = call(b, "POST", f"/v1/share-groups/{group}/members",
                             {"topics": ["app-carol"]}, CAROL)  # fmt: skip
    assert status == 201, joined
    member = joined["member_id"]
    path = f"/v1/share-groups/{group}/members/{member}/records?wait_ms=2000&max_records=1"
    status, _, polled = call(b, "GET", path, auth=CAROL)
    assert status == 200 and polled["records"], polled
    r = polled["records"][0]
    acks = {"acks": [{"topic": r["topic"], "partition": r["partition"], "offsets": [r["offset"]],
                      "type": "reject"}]}  # fmt: skip
    status, _, acked = call(
        b, "POST", f"/v1/share-groups/{group}/members/{member}/acks", acks, CAROL
    )
    assert status == 200, acked


def _dead_lettering(b: BrokerProcess, group: str) -> int:
    _, _, doc = call(b, "GET", f"/v1/share-groups/{group}", auth=SU)
    return sum(p["dead_lettering"] for p in doc["partitions"])


def test_3_a_a_named_dead_letter_topic_is_checked_when_set(broker: BrokerProcess) -> None:
    b = broker
    # A hidden topic is refused as missing; a new one needs create as well as write.
    status, _, refused = call(b, "PUT", "/v1/share-groups/sg-carol",
                              {"dead_letter_topic": "secret-payroll"}, CAROL)  # fmt: skip
    assert status == 404 and refused["error"]["code"] == "topic_not_found", refused
    status, _, refused = call(b, "PUT", "/v1/share-groups/sg-carol",
                              {"dead_letter_topic": "app-carol-dlq"}, CAROL)  # fmt: skip
    assert status == 404 and refused["error"]["code"] == "topic_not_found", refused
    assert (
        call(b, "POST", "/v1/acls", _acl("carol", "topic", "app-carol-dlq", "write"), SU)[0] == 201
    )
    status, _, refused = call(b, "PUT", "/v1/share-groups/sg-carol",
                              {"dead_letter_topic": "app-carol-dlq"}, CAROL)  # fmt: skip
    assert status == 403 and refused["error"]["details"]["operation"] == "create", refused
    assert call(b, "GET", "/v1/topics/app-carol-dlq", auth=SU)[0] == 404


def test_3_b_a_put_checks_the_dead_letter_topic_the_group_will_use(
    broker: BrokerProcess,
) -> None:
    """The default '<group>.dlq', and one another principal set: a PUT that names no
    dead-letter topic still makes its caller the one dead letters are written for."""
    b = broker
    put = {"max_delivery_attempts": 1}
    status, _, refused = call(b, "PUT", "/v1/share-groups/sg-carol-2", put, CAROL)
    assert status == 404 and refused["error"]["code"] == "topic_not_found", refused
    assert call(b, "GET", "/v1/share-groups/sg-carol-2", auth=SU)[0] == 404  # nothing made
    assert (
        call(b, "POST", "/v1/acls", _acl("carol", "topic", "sg-carol-2.dlq", "write"), SU)[0] == 201
    )
    status, _, refused = call(b, "PUT", "/v1/share-groups/sg-carol-2", put, CAROL)
    assert status == 403 and refused["error"]["details"]["operation"] == "create", refused
    assert (
        call(b, "POST", "/v1/acls", _acl("carol", "topic", "sg-carol-2.dlq", "create"), SU)[0]
        == 201
    )
    status, _, done = call(b, "PUT", "/v1/share-groups/sg-carol-2", put, CAROL)
    assert status == 200 and done["dead_letter_topic"] == "sg-carol-2.dlq", done
    # The superuser points it at the hidden topic; carol may not take it over with a PUT
    # that changes something else.
    hidden = {"dead_letter_topic": "secret-payroll"}
    assert call(b, "PUT", "/v1/share-groups/sg-carol-2", hidden, SU)[0] == 200
    status, _, refused = call(b, "PUT", "/v1/share-groups/sg-carol-2", put, CAROL)
    assert status == 404 and refused["error"]["code"] == "topic_not_found", refused


def test_3_c_a_dead_letter_topic_is_checked_again_when_written(broker: BrokerProcess) -> None:
    b = broker
    for op in ("create", "write"):
        assert call(b, "POST", "/v1/acls", _acl("carol", "topic", "sg-carol.dlq", op), SU)[0] == 201
    assert (
        call(b, "PUT", "/v1/share-groups/sg-carol", {"max_delivery_attempts": 1}, CAROL)[0] == 200
    )
    # Write taken away after the PUT: the dead letter waits, the topic is not created.
    assert (
        call(b, "DELETE", "/v1/acls", _acl("carol", "topic", "sg-carol.dlq", "write"), SU)[0] == 200
    )
    _share_reject(b, "sg-carol")
    time.sleep(1.5)  # several dead-letter passes
    assert _dead_lettering(b, "sg-carol") == 1
    assert call(b, "GET", "/v1/topics/sg-carol.dlq", auth=SU)[0] == 404  # never auto-created
    assert (
        call(b, "POST", "/v1/acls", _acl("carol", "topic", "sg-carol.dlq", "write"), SU)[0] == 201
    )
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline and _dead_lettering(b, "sg-carol"):
        time.sleep(0.2)
    assert _dead_lettering(b, "sg-carol") == 0
    _, _, dlq = call(b, "GET", "/v1/topics/sg-carol.dlq/partitions/0/records", auth=SU)
    assert [r["value"] for r in dlq["records"]] and dlq["records"][0]["value"].startswith(
        "app-carol"
    )


def test_8_a_hidden_topic_is_as_missing_in_group_offsets(broker: BrokerProcess) -> None:
    b = broker
    answers = []
    for topic in ("secret-payroll", "no-such-topic"):
        commit = {"offsets": [{"topic": topic, "partition": 2, "offset": 7}]}
        status, _, answer = call(b, "POST", "/v1/groups/g-bob/offsets", commit, BOB)
        answers.append((status, str(answer).replace(topic, "<t>")))
    assert answers[0] == answers[1] and answers[0][0] == 404, answers
    assert "topic_not_found" in answers[0][1]
    # The superuser commits offsets of the hidden topic into g-bob: bob does not see them.
    commit = {"offsets": [{"topic": "secret-payroll", "partition": 2, "offset": 1},
                          {"topic": "app-orders", "partition": 0, "offset": 1}]}  # fmt: skip
    status, _, done = call(b, "POST", "/v1/groups/g-bob/offsets", commit, SU)
    assert status == 200, done
    assert call(b, "POST", "/v1/acls", _acl("bob", "group", "g-bob", "describe"), SU)[0] == 201
    for path in ("/v1/groups/g-bob", "/v1/groups/g-bob/offsets"):
        status, _, doc = call(b, "GET", path, auth=BOB)
        assert status == 200 and "app-orders" in str(doc), (path, doc)
        assert "secret-payroll" not in str(doc), (path, doc)
