"""An error answer of the broker becomes the right `dmq.errors` class, with what it said.

Proves that `error_from_response`:
- rebuilds every code of the README's error table as its class, keeping the message,
  `details`, `field`/`limit` of InvalidRequest and the range of OffsetOutOfRange;
- keeps a retriable error's delay: the body's `details.retry_after_ms` first, else the
  Retry-After header (seconds);
- falls back on the status when the body is not the API's shape (a proxy, an unknown
  route) and keeps an unknown code visible in the message;
and that `backoff_ms` doubles from retry_backoff_ms up to its cap, with bounded jitter,
unless the broker asked for a delay; that retriable and client errors are told apart as the
retry loop needs.
"""

from __future__ import annotations

import json

import pytest

from dmq import errors
from dmq.client import _limits
from dmq.client._http import backoff_ms, error_from_response


def body(code: str, message: str = "m", **details: object) -> bytes:
    return json.dumps({"error": {"code": code, "message": message, "details": details}}).encode()


@pytest.mark.parametrize(
    ("status", "code", "cls"),
    [
        (400, "invalid_request", errors.InvalidRequest),
        (400, "invalid_config", errors.InvalidConfig),
        (404, "topic_not_found", errors.TopicNotFound),
        (404, "partition_not_found", errors.PartitionNotFound),
        (404, "not_found", errors.NotFound),
        (406, "not_acceptable", errors.NotAcceptable),
        (409, "topic_already_exists", errors.TopicAlreadyExists),
        (413, "record_too_large", errors.RecordTooLarge),
        (415, "unsupported_media_type", errors.UnsupportedMediaType),
        (416, "offset_out_of_range", errors.OffsetOutOfRange),
        (429, "backpressure", errors.Backpressure),
        (503, "not_leader", errors.NotLeader),
        (503, "broker_unavailable", errors.BrokerUnavailable),
        (504, "request_timeout", errors.RequestTimeout),
        (500, "storage_error", errors.StorageError),
        (500, "internal_error", errors.DmqError),
    ],
)
def test_every_code_of_the_table_becomes_its_class(
    status: int, code: str, cls: type[errors.DmqError]
) -> None:
    error = error_from_response(status, {}, body(code, "what happened"))
    assert type(error) is cls
    assert error.code == code
    assert error.message == "what happened"


def test_field_and_limit_of_an_invalid_request_are_kept() -> None:
    error = error_from_response(
        413,
        {"Content-Type": "application/json"},
        body("record_too_large", "too big", field="records[3].value", limit=1048576),
    )
    assert isinstance(error, errors.RecordTooLarge)
    assert isinstance(error, errors.ClientError)
    assert (error.field, error.limit) == ("records[3].value", 1048576)
    assert error.details == {"field": "records[3].value", "limit": 1048576}


def test_offset_out_of_range_carries_the_valid_range() -> None:
    error = error_from_response(
        416, {}, body("offset_out_of_range", "no", offset=99, log_start_offset=5, log_end_offset=17)
    )
    assert isinstance(error, errors.OffsetOutOfRange)
    assert (error.offset, error.log_start_offset, error.log_end_offset) == (99, 5, 17)


def test_retry_after_comes_from_the_body_first_then_the_header_in_seconds() -> None:
    from_header = error_from_response(503, {"retry-after": "2"}, body("not_leader"))
    assert isinstance(from_header, errors.RetriableError)
    assert from_header.details["retry_after_ms"] == 2000
    assert from_header.retry_after_ms == 2000
    from_body = error_from_response(
        429, {"Retry-After": "1"}, body("backpressure", retry_after_ms=150)
    )
    assert from_body.details["retry_after_ms"] == 150
    capped = error_from_response(503, {"Retry-After": "3600"}, body("broker_unavailable"))
    assert capped.details["retry_after_ms"] == _limits.RETRY_AFTER_MS_MAX
    silent = error_from_response(503, {}, body("broker_unavailable"))
    assert "retry_after_ms" not in silent.details


@pytest.mark.parametrize(
    ("status", "cls"),
    [
        (400, errors.InvalidRequest),
        (404, errors.NotFound),
        (405, errors.InvalidRequest),
        (429, errors.Backpressure),
        (502, errors.BrokerUnavailable),
        (503, errors.BrokerUnavailable),
        (504, errors.RequestTimeout),
        (500, errors.DmqError),
    ],
)
def test_a_body_not_in_the_api_shape_falls_back_on_the_status(
    status: int, cls: type[errors.DmqError]
) -> None:
    error = error_from_response(status, {}, b"<html>Bad Gateway</html>")
    assert type(error) is cls
    assert "Bad Gateway" in error.message


def test_an_unknown_code_keeps_the_status_class_and_shows_the_code() -> None:
    error = error_from_response(409, {}, body("group_rebalancing", "wait"))
    assert type(error) is errors.TopicAlreadyExists  # what 409 means in this client
    assert error.message == "group_rebalancing: wait"
    unknown_503 = error_from_response(503, {}, body("leader_election", "soon"))
    assert isinstance(unknown_503, errors.RetriableError)


def test_retriable_and_client_errors_are_told_apart() -> None:
    assert isinstance(error_from_response(503, {}, body("not_leader")), errors.RetriableError)
    for status, code in [
        (400, "invalid_request"),
        (404, "topic_not_found"),
        (416, "offset_out_of_range"),
    ]:
        error = error_from_response(status, {}, body(code))
        assert isinstance(error, errors.ClientError)
        assert not isinstance(error, errors.RetriableError)


def test_backoff_doubles_up_to_its_cap_with_bounded_jitter() -> None:
    plain = errors.BrokerUnavailable("x")
    for attempt in range(12):
        expected = min(100 * 2**attempt, _limits.RETRY_BACKOFF_MS_MAX)
        for _ in range(20):
            delay = backoff_ms(attempt, 100, plain)
            assert expected * 0.8 - 1 <= delay <= expected * 1.2
    asked = errors.Backpressure("x", retry_after_ms=1500)
    assert backoff_ms(0, 100, asked) == 1500
