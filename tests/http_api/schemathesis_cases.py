"""A live broker answers every generated request as its OpenAPI document says.

Proves, with schemathesis generating requests for every operation of GET /openapi.json
(both valid and invalid by the schema, a bounded number per operation), that the broker:
- never answers 5xx (a 500 is a handler bug: an exception the API did not translate);
- answers every 4xx with the error shape {"error": {"code", "message", "details"}}
  (the Confluent REST Proxy v2 routes, operationId v2_*, with the proxy's own shape);
- answers statuses, content types, headers and JSON bodies that the document allows;
- logs no traceback while doing so.

The operations are split over three test modules (test_http_schemathesis_*.py: the first
and second half of the /v1 operations by operationId, and the REST Proxy v2 ones), each
with a broker of its own, so that `make test`'s workers run them side by side; this
module holds what they share and is not collected itself.

The broker runs with small limits (fetch_wait_ms_max, record and batch sizes) so that
generated long-polls and bodies stay fast; the document states those same limits.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from schemathesis import GenerationMode
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_headers_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from dmq.config import BrokerConfig
from http_api.openapi import openapi_document
from tests_support import BrokerProcess

# The API's two non-JSON request bodies: a batch is opaque bytes, NDJSON is text.
schemathesis.serializer.alias("application/vnd.dmq.batch", "application/octet-stream")
schemathesis.serializer.alias("application/x-ndjson", "text/plain")
# The Confluent REST Proxy v2 bodies (http_api/rest_v2.py) are JSON.
for _v2_type in ("json.v2", "binary.v2", "v2", ""):
    schemathesis.serializer.alias(
        f"application/vnd.kafka{'.' if _v2_type else ''}{_v2_type}+json", "application/json"
    )

EXAMPLES_PER_OPERATION = 100
LIMITS = {
    "fetch-wait-ms-max": "20",  # a generated long-poll waits at most 20 ms
    "record-bytes-max": "4096",
    "batch-bytes-max": "65536",
    "request-bytes-max": "262144",
    "fetch-bytes-max": "65536",
    "produce-records-max": "50",
    "segment-bytes": "1048576",  # generated topics are many; keep their segments small
    # Generated topics may ask for 1,000 partitions each: each is a Raft group with its
    # files; a low cap keeps the fuzzed broker small (and proves the limit answers 400).
    "replicas-per-broker-max": "300",
}
CHECKS = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_headers_conformance,
    response_schema_conformance,
]


SEEDED_TOPIC = "seeded"
# Operations that also get cases aimed at the seeded topic's partition 0: random topic
# names almost never exist, so without these the handlers past the 404 go untested.
SEEDED_OPERATIONS = {"describe_topic", "alter_topic_config", "produce", "fetch", "list_offsets"}
# A consumer group with one member on the seeded topic: group operations aimed at it reach
# past the 404/409 of random names (heartbeat, group fetch, commit, describe with lag).
SEEDED_GROUP = "seeded-group"
SEEDED_GROUP_OPERATIONS = {
    "describe_group", "heartbeat", "group_fetch", "commit_offsets", "read_group_offsets",
    "leave_group", "reset_group_offsets",
}  # fmt: skip
SEEDED_MEMBER: dict[str, str] = {}
# The Confluent REST v2 routes aimed at the seeded topic, and at a v2 consumer instance
# subscribed to it in a group of its own (not deleted or unsubscribed: the others need it).
SEEDED_V2_GROUP, SEEDED_V2_INSTANCE = "seeded-v2-group", "seeded-v2"
SEEDED_V2_OPERATIONS = {
    "v2_get_topic", "v2_produce", "v2_get_partitions", "v2_get_partition",
    "v2_produce_partition", "v2_get_partition_offsets", "v2_get_partition_records",
    "v2_get_subscription", "v2_get_assignments", "v2_get_records", "v2_commit_offsets",
    "v2_get_offsets", "v2_seek", "v2_seek_to_beginning", "v2_seek_to_end", "v2_subscribe",
}  # fmt: skip


def _seed(broker: BrokerProcess) -> None:
    """A topic with text, keyed, headered and non-UTF-8 records (the last answers 406
    when fetched as a string)."""
    status, _ = broker.json("POST", "/v1/topics", {"name": SEEDED_TOPIC, "partitions": 2})
    assert status == 201
    records = [
        {"key": "k", "value": "v", "headers": [{"key": "h", "value": "x"}], "partition": 0},
        {"value": None, "partition": 0},
        {"key": "/w==", "value": "/w==", "partition": 0},  # b"\xff": not UTF-8
    ]
    body = {"records": records[:2]}
    assert broker.json("POST", f"/v1/topics/{SEEDED_TOPIC}/records", body)[0] == 200
    body = {"records": records[2:], "value_encoding": "base64"}
    assert broker.json("POST", f"/v1/topics/{SEEDED_TOPIC}/records", body)[0] == 200
    join = {"topics": [SEEDED_TOPIC], "session_timeout_ms": 300_000}
    status, member = broker.json("POST", f"/v1/groups/{SEEDED_GROUP}/members", join)
    assert status == 201 and len(member["assignment"]) == 2, member
    SEEDED_MEMBER["member_id"] = member["member_id"]
    v2 = "application/vnd.kafka.v2+json"
    body = {"name": SEEDED_V2_INSTANCE, "auto.offset.reset": "earliest"}
    assert broker.json("POST", f"/consumers/{SEEDED_V2_GROUP}", body, v2)[0] == 200
    instance = f"/consumers/{SEEDED_V2_GROUP}/instances/{SEEDED_V2_INSTANCE}"
    body = {"topics": [SEEDED_TOPIC]}
    assert broker.request("POST", instance + "/subscription", body, v2)[0] == 204


@pytest.fixture(scope="module")
def live_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    extra_args = [arg for name, value in LIMITS.items() for arg in (f"--{name}", value)]
    proc = BrokerProcess(tmp_path_factory.mktemp("schemathesis") / "broker", extra_args=extra_args)
    try:
        proc.start()
        _seed(proc)
        yield proc
    finally:
        proc.stop()


@pytest.fixture(scope="module")
def api_schema(live_broker: BrokerProcess) -> Any:
    return schemathesis.openapi.from_url(live_broker.url + "/openapi.json")


def assert_error_shape(response: Any, case: Any = None) -> None:
    """Every 4xx is JSON {"error": {"code": str, "message": str, "details": object}}."""
    if not 400 <= response.status_code < 500:
        return
    headers = {name.lower(): values for name, values in response.headers.items()}
    content_type = headers.get("content-type", [""])[0]
    assert content_type.startswith("application/json"), (
        f"4xx with Content-Type {content_type!r}: {response.status_code} {response.text[:200]!r}"
        f" for {case.as_curl_command() if case is not None else ''}"[:2000]
    )
    body = json.loads(response.content)
    error = body["error"]
    assert set(body) == {"error"} and set(error) == {"code", "message", "details"}, body
    assert isinstance(error["code"], str) and error["code"], body
    assert isinstance(error["message"], str) and error["message"], body
    assert isinstance(error["details"], dict), body


def assert_rest_v2_error_shape(response: Any, case: Any) -> None:
    """The Confluent REST Proxy v2 routes (operationId v2_*) answer every 4xx in the
    proxy's shape instead: {"error_code": int, "message": str}."""
    if not 400 <= response.status_code < 500:
        return
    body = json.loads(response.content)
    assert set(body) == {"error_code", "message"}, (body, case.as_curl_command())
    assert isinstance(body["error_code"], int) and body["message"], body


# One test per operation, named by its operationId. (schemathesis' own pytest
# parametrization, from_fixture, does not run under pytest 9; hypothesis drives it here.)
OPERATION_IDS = sorted(
    op["operationId"]
    for item in openapi_document(BrokerConfig())["paths"].values()
    for op in item.values()
    if isinstance(op, dict) and "operationId" in op
)


V1_OPERATION_IDS = [o for o in OPERATION_IDS if not o.startswith("v2_")]
V2_OPERATION_IDS = [o for o in OPERATION_IDS if o.startswith("v2_")]
SHARDS = {
    "v1_first_half": V1_OPERATION_IDS[: len(V1_OPERATION_IDS) // 2],
    "v1_second_half": V1_OPERATION_IDS[len(V1_OPERATION_IDS) // 2 :],
    "rest_v2": V2_OPERATION_IDS,
}


def check_operation(api_schema: Any, operation_id: str) -> None:
    """Generated requests for one operation, each answer checked (module docstring)."""
    operation = api_schema.find_operation_by_id(operation_id)
    strategies = [
        operation.as_strategy(GenerationMode.POSITIVE),
        operation.as_strategy(GenerationMode.NEGATIVE),
    ]
    if operation_id in SEEDED_OPERATIONS | SEEDED_GROUP_OPERATIONS | SEEDED_V2_OPERATIONS:
        seeded = {"topic": SEEDED_TOPIC, "partition": 0, "group": SEEDED_GROUP, **SEEDED_MEMBER}
        seeded |= {"p": 0, "instance": SEEDED_V2_INSTANCE}
        if operation_id.startswith("v2_"):
            seeded["group"] = SEEDED_V2_GROUP
        fixed = {name: value for name, value in seeded.items() if f"{{{name}}}" in operation.path}
        for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):
            strategies.append(operation.as_strategy(mode, path_parameters=fixed))
    cases = st.one_of(strategies)

    @given(case=cases)
    @settings(
        max_examples=EXAMPLES_PER_OPERATION,
        deadline=None,
        database=None,
        suppress_health_check=list(HealthCheck),
    )
    def check(case: Any) -> None:
        response = case.call(timeout=10)
        assert response.status_code < 500, f"{case.method} {case.path}: {response.text[:500]}"
        if operation_id.startswith("v2_"):
            assert_rest_v2_error_shape(response, case)
        else:
            assert_error_shape(response, case)
        case.validate_response(response, checks=CHECKS)

    check()


def assert_no_traceback(live_broker: BrokerProcess) -> None:
    """Called after the generated requests (file order). A handler exception is logged
    with its traceback even though the client sees a JSON 500."""
    assert "Traceback" not in live_broker.log(), live_broker.log()


def shard_tests(shard: str) -> tuple[Callable[..., None], Callable[..., None]]:
    """The two tests of one shard's module (SHARDS), to be bound there under their names,
    beside the fixtures `live_broker` and `api_schema` imported from here."""

    @pytest.mark.parametrize("operation_id", SHARDS[shard])
    def test_every_answer_conforms_and_no_5xx(api_schema: Any, operation_id: str) -> None:
        check_operation(api_schema, operation_id)

    def test_broker_logged_no_traceback(live_broker: BrokerProcess) -> None:
        assert_no_traceback(live_broker)  # defined after the generated ones: runs after

    return test_every_answer_conforms_and_no_5xx, test_broker_logged_no_traceback
