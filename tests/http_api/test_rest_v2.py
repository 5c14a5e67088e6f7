"""The Confluent REST Proxy v2 surface (http_api/rest_v2.py) answers the API reference's
examples, sent as documented, with the documented answers.

Proves, against a real `dmq serve` over real HTTP, with the documented content types:
- produce with the json and binary embedded formats, to a topic and to a partition,
  answers one {partition, offset, error_code: null, error: null} per record in order, and
  key_schema_id/value_schema_id null;
- topics and partitions are listed and described in the proxy's shapes;
- a consumer instance is created (instance_id, base_uri), subscribes, fetches every record
  produced (binary as base64, json embedded), long-polls until records arrive, commits
  (given offsets: the committed offset is offset + 1; empty body: everything fetched),
  reads its committed offsets back, and is deleted (then 40403);
- bad input answers the proxy's error shape and codes: 40401, 40402, 40403, 40601, 40902,
  415, 406, 422/42204;
- (hypothesis) any JSON value round-trips through the json format, any bytes through binary;
- an instance idle past rest_v2_instance_timeout_ms is deleted and leaves its group.
"""

from __future__ import annotations

import base64
import json
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests_support import BrokerProcess

V2 = "application/vnd.kafka.v2+json"
V2_JSON = "application/vnd.kafka.json.v2+json"
V2_BINARY = "application/vnd.kafka.binary.v2+json"
PRODUCE_ACCEPT = "application/vnd.kafka.v2+json, application/vnd.kafka+json, application/json"


@pytest.fixture(scope="module")
def proxy(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    # No auto-created topics: producing to an unknown topic is 40401, as on the proxy.
    proc = BrokerProcess(
        tmp_path_factory.mktemp("rest_v2") / "broker",
        extra_args=["--auto-create-topics", "false"],
    )
    try:
        proc.start()
        for name, partitions in (("test", 3), ("jsontest", 1), ("polltest", 1)):
            status, _ = proc.json("POST", "/v1/topics", {"name": name, "partitions": partitions})
            assert status == 201
        yield proc
    finally:
        proc.stop()


def call(
    url: str,
    method: str,
    body: Any = None,
    content_type: str | None = None,
    accept: str | None = None,
    timeout_s: float = 30,
) -> tuple[int, str, Any]:
    """One curl-shaped request: (status, Content-Type, parsed JSON body or None)."""
    data = None if body is None else body if isinstance(body, bytes) else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, method=method)
    if content_type is not None:
        req.add_header("Content-Type", content_type)
    if accept is not None:
        req.add_header("Accept", accept)
    try:
        with urllib.request.urlopen(req, timeout=timeout_s) as resp:
            status, headers, raw = resp.status, resp.headers, resp.read()
    except urllib.error.HTTPError as err:
        status, headers, raw = err.code, err.headers, err.read()
    return status, headers.get("Content-Type", ""), json.loads(raw) if raw else None


def assert_error(answer: tuple[int, str, Any], status: int, error_code: int) -> None:
    got_status, content_type, body = answer
    assert (got_status, body and body.get("error_code")) == (status, error_code), answer
    assert content_type.startswith(V2), answer
    assert set(body) == {"error_code", "message"} and body["message"], body


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def test_produce_json_to_a_topic_as_documented(proxy: BrokerProcess) -> None:
    records = [
        {"key": "somekey", "value": {"foo": "bar"}},
        {"value": ["foo", "bar"], "partition": 1},
        {"value": 53.5},
    ]
    status, ctype, body = call(
        proxy.url + "/topics/test", "POST", {"records": records}, V2_JSON, PRODUCE_ACCEPT
    )
    assert status == 200 and ctype.startswith(V2), body
    assert body["key_schema_id"] is None and body["value_schema_id"] is None
    assert len(body["offsets"]) == 3
    assert body["offsets"][1]["partition"] == 1
    for entry in body["offsets"]:
        assert set(entry) == {"partition", "offset", "error_code", "error"}
        assert entry["error_code"] is None and entry["error"] is None
        assert entry["offset"] >= 0 and 0 <= entry["partition"] < 3


def test_produce_binary_to_a_topic_and_a_partition_as_documented(proxy: BrokerProcess) -> None:
    records = [
        {"key": "a2V5", "value": "Y29uZmx1ZW50"},
        {"value": "a2Fma2E=", "partition": 1},
        {"value": "bG9ncw=="},
    ]
    status, _, body = call(
        proxy.url + "/topics/test", "POST", {"records": records}, V2_BINARY, PRODUCE_ACCEPT
    )
    assert status == 200 and len(body["offsets"]) == 3, body
    assert body["offsets"][1]["partition"] == 1
    records = [{"key": "a2V5", "value": "Y29uZmx1ZW50"}, {"value": "a2Fma2E="}]
    status, _, body = call(
        proxy.url + "/topics/test/partitions/1", "POST", {"records": records}, V2_BINARY, V2
    )
    assert status == 200, body
    first, second = body["offsets"]
    assert first["partition"] == second["partition"] == 1
    assert second["offset"] == first["offset"] + 1  # one partition: consecutive offsets


def test_topics_and_partitions_are_listed_and_described(proxy: BrokerProcess) -> None:
    status, ctype, names = call(proxy.url + "/topics", "GET", accept=V2)
    assert status == 200 and ctype.startswith(V2)
    assert {"test", "jsontest"} <= set(names)
    status, _, topic = call(proxy.url + "/topics/test", "GET", accept=V2)
    assert status == 200 and topic["name"] == "test" and isinstance(topic["configs"], dict)
    assert [p["partition"] for p in topic["partitions"]] == [0, 1, 2]
    status, _, partitions = call(proxy.url + "/topics/test/partitions", "GET")
    assert status == 200 and partitions == topic["partitions"]
    status, _, one = call(proxy.url + "/topics/test/partitions/1", "GET", accept=V2)
    assert status == 200 and one == topic["partitions"][1]
    assert one["replicas"] == [{"broker": one["leader"], "leader": True, "in_sync": True}]
    status, _, offsets = call(proxy.url + "/topics/test/partitions/1/offsets", "GET")
    assert status == 200 and offsets["beginning_offset"] == 0 and offsets["end_offset"] >= 0


def _create(proxy: BrokerProcess, group: str, body: dict[str, Any]) -> str:
    status, ctype, answer = call(proxy.url + f"/consumers/{group}", "POST", body, V2, V2)
    assert status == 200 and ctype.startswith(V2), answer
    assert answer["base_uri"] == f"{proxy.url}/consumers/{group}/instances/{answer['instance_id']}"
    return str(answer["base_uri"])


def _fetch_until(base_uri: str, accept: str, count: int, deadline_s: float = 20) -> list[Any]:
    got: list[Any] = []
    deadline = time.monotonic() + deadline_s
    while len(got) < count and time.monotonic() < deadline:
        status, ctype, records = call(
            base_uri + "/records?timeout=3000&max_bytes=300000", "GET", accept=accept
        )
        assert status == 200 and ctype.startswith(accept), records
        got.extend(records)
    return got


def test_binary_consumer_fetches_commits_reads_offsets_and_is_deleted(
    proxy: BrokerProcess,
) -> None:
    produced = [{"key": b64(b"key"), "value": b64(f"v{i}".encode()), "partition": i % 3}
                for i in range(6)]  # fmt: skip
    status, _, _ = call(proxy.url + "/topics/test", "POST", {"records": produced}, V2_BINARY)
    assert status == 200
    body = {"name": "my_consumer", "format": "binary", "auto.offset.reset": "earliest",
            "auto.commit.enable": "false"}  # fmt: skip
    base_uri = _create(proxy, "testgroup", body)
    assert call(base_uri + "/subscription", "POST", {"topics": ["test"]}, V2)[0] == 204
    assert call(base_uri + "/subscription", "GET", accept=V2)[2] == {"topics": ["test"]}
    # Everything in the topic: 8 records from the produce tests (when run) and these 6.
    end = sum(
        call(proxy.url + f"/topics/test/partitions/{p}/offsets", "GET")[2]["end_offset"]
        for p in range(3)
    )
    records = _fetch_until(base_uri, V2_BINARY, end)
    assert len(records) == end
    for r in records:
        assert set(r) == {"topic", "key", "value", "partition", "offset"} and r["topic"] == "test"
    values = {base64.b64decode(r["value"]) for r in records}
    assert {f"v{i}".encode() for i in range(6)} <= values
    # Fetched records are not fetched again (positions moved), whether committed or not.
    assert call(base_uri + "/records?timeout=100", "GET", accept=V2_BINARY)[2] == []
    last = {}
    for r in records:
        last[r["partition"]] = max(last.get(r["partition"], -1), r["offset"])
    commit = {"offsets": [{"topic": "test", "partition": p, "offset": o} for p, o in last.items()]}
    status, _, answer = call(base_uri + "/offsets", "POST", commit, V2)
    assert status == 200 and answer is None
    ask = {"partitions": [{"topic": "test", "partition": p} for p in sorted(last)]}
    status, _, committed = call(base_uri + "/offsets", "GET", ask, V2, V2)
    assert status == 200
    assert committed == {"offsets": [{"topic": "test", "partition": p, "offset": last[p] + 1,
                                      "metadata": ""} for p in sorted(last)]}  # fmt: skip
    assert call(base_uri, "DELETE", content_type=V2)[0] == 204
    assert_error(call(base_uri + "/records", "GET", accept=V2_BINARY), 404, 40403)


def test_json_consumer_long_polls_and_commits_what_it_fetched(proxy: BrokerProcess) -> None:
    body = {"name": "json_consumer", "format": "json", "auto.offset.reset": "latest"}
    base_uri = _create(proxy, "jsongroup", body)
    assert call(base_uri + "/subscription", "POST", {"topics": ["polltest"]}, V2)[0] == 204
    assert _fetch_until(base_uri, V2_JSON, 0) == []  # joins; position: the end (latest)
    assert call(base_uri + "/records?timeout=200", "GET", accept=V2_JSON)[2] == []
    answers: list[Any] = []
    started = time.monotonic()
    poll = threading.Thread(
        target=lambda: answers.append(
            call(base_uri + "/records?timeout=10000", "GET", accept=V2_JSON)
        )
    )
    poll.start()
    time.sleep(0.5)  # the fetch is waiting when the records come
    records = [{"key": "somekey", "value": {"foo": "bar"}}, {"value": ["foo", "bar"]},
               {"value": 53.5}]  # fmt: skip
    assert call(proxy.url + "/topics/polltest", "POST", {"records": records}, V2_JSON)[0] == 200
    poll.join(15)
    elapsed = time.monotonic() - started
    status, ctype, got = answers[0]
    assert status == 200 and ctype.startswith(V2_JSON)
    got += _fetch_until(base_uri, V2_JSON, 3 - len(got))
    assert elapsed < 10, "the long-poll answered when records arrived, not at its timeout"
    assert [(r["key"], r["value"]) for r in got] == [
        ("somekey", {"foo": "bar"}), (None, ["foo", "bar"]), (None, 53.5)]  # fmt: skip
    # A json instance asked for binary: the proxy's 40601.
    assert_error(call(base_uri + "/records", "GET", accept=V2_BINARY), 406, 40601)
    # Empty body: commit everything fetched.
    assert call(base_uri + "/offsets", "POST", content_type=V2)[0] == 200
    ask = {"partitions": [{"topic": "polltest", "partition": 0}]}
    committed = call(base_uri + "/offsets", "GET", ask, V2)[2]["offsets"]
    assert committed[0]["offset"] == got[-1]["offset"] + 1
    assert call(base_uri + "/subscription", "DELETE")[0] == 204
    assert call(base_uri + "/subscription", "GET")[2] == {"topics": []}
    assert call(base_uri, "DELETE")[0] == 204


def test_bad_input_answers_the_proxys_errors(proxy: BrokerProcess) -> None:
    url = proxy.url
    one = {"records": [{"value": "a2Fma2E="}]}
    assert_error(call(url + "/topics/nope", "GET"), 404, 40401)
    assert_error(call(url + "/topics/nope", "POST", one, V2_BINARY), 404, 40401)
    assert_error(call(url + "/topics/test/partitions/7", "GET"), 404, 40402)
    assert_error(call(url + "/topics/test/partitions/7", "POST", one, V2_BINARY), 404, 40402)
    assert_error(call(url + "/topics/test", "POST", one, "application/vnd.kafka.avro.v2+json"),
                 415, 415)  # fmt: skip
    assert_error(call(url + "/topics/test", "POST", one, "text/plain"), 415, 415)
    assert_error(call(url + "/topics", "GET", accept="text/html"), 406, 406)
    assert_error(call(url + "/topics/test", "POST", {"records": "x"}, V2_JSON), 422, 422)
    bad = {"records": [{"value": "not base64!"}]}
    status, _, body = call(url + "/topics/test", "POST", bad, V2_BINARY)
    assert status == 422 and "records[0].value" in body["message"]
    ghost = url + "/consumers/testgroup/instances/ghost"
    assert_error(call(ghost + "/records", "GET", accept=V2_BINARY), 404, 40403)
    assert_error(call(ghost + "/subscription", "POST", {"topics": ["test"]}, V2), 404, 40403)
    assert_error(call(ghost, "DELETE"), 404, 40403)
    assert_error(call(url + "/consumers/g", "POST", {"format": "avro"}, V2), 422, 42204)
    _create(proxy, "dupgroup", {"name": "twice"})
    assert_error(call(url + "/consumers/dupgroup", "POST", {"name": "twice"}, V2), 409, 40902)
    assert_error(call(url + "/consumers/dupgroup", "POST", {"name": "x"}, "text/plain"), 415, 415)
    assert call(url + "/consumers/dupgroup/instances/twice", "DELETE")[0] == 204


JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**63), 2**63) | st.text(max_size=20)
    | st.floats(allow_nan=False, allow_infinity=False),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner,
                                                                 max_size=4),
    max_leaves=12,
)  # fmt: skip


@settings(max_examples=25, deadline=None, database=None)
@given(key=JSON_VALUES, value=JSON_VALUES, raw=st.binary(max_size=64))
def test_embedded_formats_round_trip(
    proxy: BrokerProcess, key: Any, value: Any, raw: bytes
) -> None:
    """Whatever JSON a json produce embeds comes back as that JSON, and whatever bytes a
    binary produce embeds come back as those bytes (null stays null)."""
    url = proxy.url + "/topics/jsontest/partitions/0"
    record = {"key": key, "value": value}
    status, _, body = call(url, "POST", {"records": [record]}, V2_JSON)
    assert status == 200, body
    offset = body["offsets"][0]["offset"]
    status, ctype, got = call(url + f"/records?offset={offset}&timeout=1000", "GET",
                              accept=V2_JSON)  # fmt: skip
    assert status == 200 and ctype.startswith(V2_JSON), got
    assert (got[0]["key"], got[0]["value"], got[0]["offset"]) == (key, value, offset)
    status, _, body = call(url, "POST", {"records": [{"value": b64(raw)}]}, V2_BINARY)
    offset = body["offsets"][0]["offset"]
    status, _, got = call(url + f"/records?offset={offset}", "GET", accept=V2_BINARY)
    assert got[0]["key"] is None and base64.b64decode(got[0]["value"]) == raw


def test_idle_instance_is_deleted_and_leaves_its_group(broker_factory: Any) -> None:
    broker = broker_factory(extra_args=["--rest-v2-instance-timeout-ms", "1000"]).start()
    base_uri = _create(broker, "idlegroup", {"name": "idle"})
    assert call(base_uri + "/subscription", "POST", {"topics": ["t"]}, V2)[0] == 204
    status, group = broker.json("GET", "/v1/groups/idlegroup")
    assert status == 200 and group["member_count"] == 1, group
    time.sleep(1.5)  # idle past rest_v2_instance_timeout_ms
    _create(broker, "idlegroup", {"name": "other"})  # any instance call sweeps idle ones
    assert_error(call(base_uri + "/records", "GET", accept=V2_BINARY), 404, 40403)
    status, group = broker.json("GET", "/v1/groups/idlegroup")
    # The member left: the group is empty, or gone (an empty group without offsets is).
    assert status == 404 or group["member_count"] == 0, (status, group)


def test_a_record_that_is_not_json_stops_a_json_instance(proxy: BrokerProcess) -> None:
    assert proxy.json("POST", "/v1/topics", {"name": "rawtest"})[0] == 201
    records = {"records": [{"value": b64(b"\xff")}]}
    assert call(proxy.url + "/topics/rawtest", "POST", records, V2_BINARY)[0] == 200
    base_uri = _create(proxy, "rawgroup", {"format": "json", "auto.offset.reset": "earliest"})
    assert call(base_uri + "/subscription", "POST", {"topics": ["rawtest"]}, V2)[0] == 204
    for _ in range(2):  # not skipped: the instance stays before the record it cannot give
        assert_error(call(base_uri + "/records?timeout=2000", "GET", accept=V2_JSON), 406, 40601)
    assert call(base_uri, "DELETE")[0] == 204
