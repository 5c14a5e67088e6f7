"""The `tags=` and `filter=` query parameters of fetches (dmq/selector.py).

One place turns them into a RecordFilter for the partition fetch, the group fetch and
(later) the share-group fetch, and a bad one into a 400 that names the parameter, the
column and the limit: {"error": {"code": "invalid_request", "details": {"field":
"filter", "column": 12}}}.
"""

from __future__ import annotations

from aiohttp import web

from dmq import errors
from dmq.broker.filtering import encode_kept
from dmq.broker.types import FetchResult
from dmq.config import BrokerConfig
from dmq.selector import FilterParamError, RecordFilter, SelectorLimits, compile_filter

BATCHES_CONTENT_TYPE = "application/vnd.dmq.batches"


def filtered_batch_response(result: FetchResult, headers: dict[str, str]) -> web.Response:
    """A binary filtered fetch: the kept records as one batch (empty body: none kept)."""
    return web.Response(
        body=encode_kept(result.records), content_type=BATCHES_CONTENT_TYPE, headers=headers
    )


def record_filter(request: web.Request, config: BrokerConfig) -> RecordFilter | None:
    """The request's fetch filter, None without one; InvalidRequest (400) if malformed."""
    tags = request.query.get("tags")
    selector = request.query.get("filter")
    limits = SelectorLimits(chars_max=config.filter_chars_max)
    try:
        return compile_filter(tags, selector, limits)
    except FilterParamError as exc:
        raise errors.InvalidRequest(
            f"{exc.field}: {exc.error}",
            field=exc.field,
            column=exc.error.column,
            limit=exc.error.limit,
        ) from exc
