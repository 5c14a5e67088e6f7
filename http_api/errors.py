"""The one table from error types to HTTP statuses, and the error middleware.

Every error leaves as {"error": {"code", "message", "details"}}; retriable ones
carry Retry-After. Anything unexpected is a bug: it is logged with its traceback
and answered as a 500 with code internal_error, never as an HTML page.
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web

from dmq import errors

_log = logging.getLogger("dmq.http")

REQUEST_BYTES_MAX: web.AppKey[int] = web.AppKey("request_bytes_max", int)

# Most specific first: the first isinstance match wins.
STATUS_TABLE: tuple[tuple[type[errors.DmqError], int], ...] = (
    (errors.InvalidConfig, 400),
    (errors.RecordTooLarge, 413),
    (errors.UnsupportedMediaType, 415),
    (errors.NotAcceptable, 406),
    (errors.Unauthenticated, 401),
    (errors.Forbidden, 403),
    (errors.InvalidRequest, 400),
    (errors.PartitionGone, 410),
    (errors.NotFound, 404),
    (errors.PartitionDecommissioned, 409),
    (errors.OperationConflict, 409),
    (errors.ClusterIdMismatch, 409),
    (errors.TopicAlreadyExists, 409),
    (errors.GroupConflict, 409),
    (errors.ProducerFenced, 409),
    (errors.OutOfOrderSequence, 409),
    (errors.OffsetOutOfRange, 416),
    (errors.Backpressure, 429),
    (errors.InsufficientStorage, 507),
    (errors.RequestTimeout, 504),
    (errors.RetriableError, 503),
    (errors.ClientError, 400),
    (errors.StorageError, 500),
    (errors.DmqError, 500),
)


def status_for(exc: errors.DmqError) -> int:
    for cls, status in STATUS_TABLE:
        if isinstance(exc, cls):
            return status
    return 500


def error_response(
    status: int,
    code: str,
    message: str,
    details: dict[str, Any] | None = None,
    headers: dict[str, str] | None = None,
) -> web.Response:
    body = {"error": {"code": code, "message": message, "details": details or {}}}
    return web.Response(
        status=status,
        text=json.dumps(body),
        content_type="application/json",
        headers=headers,
    )


def response_for(exc: errors.DmqError) -> web.Response:
    headers = None
    if isinstance(exc, errors.RetriableError):
        retry_ms = int(exc.details.get("retry_after_ms", exc.retry_after_ms))
        # The header has whole seconds only; the body keeps the precise hint.
        exc.details["retry_after_ms"] = retry_ms
        headers = {"Retry-After": str(max(1, math.ceil(retry_ms / 1000)))}
    return error_response(status_for(exc), exc.code, exc.message, exc.details, headers)


_HTTP_CODES = {
    404: "not_found",
    405: "method_not_allowed",
    413: "record_too_large",
    415: "unsupported_media_type",
}

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def error_response_to(request: web.Request, exc: Exception) -> web.Response:
    """The answer to an exception a request's handling raised (http_api/edge.py calls it
    for every exception but an HTTPException below 400, which aiohttp answers itself)."""
    if isinstance(exc, errors.DmqError):
        if isinstance(exc, errors.StorageError):
            # Stored data that fails its checks (a flipped bit, a torn file): the answer
            # tells the client, this tells the operator which file (log/README.md).
            _log.error("storage error on %s %s: %s", request.method, request.path, exc.message)
        return response_for(exc)
    if isinstance(exc, web.HTTPRequestEntityTooLarge):
        limit = request.app[REQUEST_BYTES_MAX]
        return error_response(
            413,
            "record_too_large",
            f"request body exceeds request_bytes_max {limit} bytes",
            {"field": "body", "limit": limit},
        )
    if isinstance(exc, web.HTTPException):
        code = _HTTP_CODES.get(
            exc.status, "invalid_request" if exc.status < 500 else "internal_error"
        )
        # A 405 names the methods the path allows (RFC 9110 requires Allow).
        allow = {"Allow": exc.headers["Allow"]} if "Allow" in exc.headers else None
        return error_response(exc.status, code, exc.reason, {"path": request.path}, allow)
    # A bug: log it, answer in the API's shape.
    _log.exception("unexpected error on %s %s", request.method, request.path, exc_info=exc)
    return error_response(500, "internal_error", "internal error; see the broker log")
