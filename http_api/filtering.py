"""The `tags=` and `filter=` query parameters of fetches (dmq/selector.py).

One place turns them into a RecordFilter for the partition fetch, the group fetch and
(later) the share-group fetch, and a bad one into a 400 that names the parameter, the
column and the limit: {"error": {"code": "invalid_request", "details": {"field":
"filter", "column": 12}}}.
"""

from __future__ import annotations

from aiohttp import web

from dmq import errors
from dmq.config import BrokerConfig
from dmq.selector import FilterParamError, RecordFilter, SelectorLimits, compile_filter


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
