"""OpenAPI: the `tags` and `filter` query parameters of fetches (http_api/filtering.py),
shared by the partition fetch (openapi_records) and the group fetch (openapi_groups)."""

from __future__ import annotations

from typing import Any

from dmq.config import BrokerConfig
from dmq.selector import TAGS_CHARS_MAX, TAGS_MAX
from http_api.openapi_schema import query


def filter_parameters(config: BrokerConfig) -> list[dict[str, Any]]:
    return [
        query(
            "tags",
            {"type": "string", "minLength": 1, "maxLength": TAGS_CHARS_MAX},
            f"only records whose `tag` header is one of these (comma-separated, at most "
            f"{TAGS_MAX}); json/ndjson only",
        ),
        query(
            "filter",
            {"type": "string", "minLength": 1, "maxLength": config.filter_chars_max},
            "only records for which this SQL92 selector over headers, $key and $timestamp "
            "is TRUE (e.g. `region = 'eu' AND price BETWEEN 10 AND 20`); a bad one is a 400 "
            "naming the column; json/ndjson only",
        ),
    ]
