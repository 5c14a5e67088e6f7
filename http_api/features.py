"""HTTP routes of feature levels (dmq/broker/features.py): thin, as every handler here.

- `GET /v1/cluster/features` -> the finalized level and what it means, the highest level
  every broker supports now (`finalizable_level`), and every registered broker's release and supported range as
  it answers now (`reachable` false: it did not answer; its range is null);
- `POST /v1/cluster/features/finalize` `{"level": n}` (optional; default: the highest this
  release supports) -> 200 `{"finalized_level", "requested_level"}`; 409
  `feature_level_unsupported` naming each broker that does not support it (or did not
  answer) in `details.laggards`, nothing changed; 400 for a level below the finalized one.
"""

from __future__ import annotations

from aiohttp import web

from dmq import errors
from dmq.compat import FEATURE_LEVEL_LIMIT
from http_api import codec
from http_api.forward import broker_of


async def features(request: web.Request) -> web.Response:
    return codec.json_response(await broker_of(request).features.features())


async def finalize(request: web.Request) -> web.Response:
    raw = await request.read()
    doc = codec.parse_json_object(raw) if raw.strip() else {}
    level = doc.get("level")
    if level is not None and (
        not isinstance(level, int)
        or isinstance(level, bool)
        or not 0 <= level <= FEATURE_LEVEL_LIMIT
    ):
        raise errors.InvalidRequest(
            f"level must be an integer 0-{FEATURE_LEVEL_LIMIT}",
            field="level",
            limit=FEATURE_LEVEL_LIMIT,
        )
    return codec.json_response(await broker_of(request).features.finalize(level))


FEATURE_ROUTES: tuple[tuple[str, str, object], ...] = (
    ("GET", "/v1/cluster/features", features),
    ("POST", "/v1/cluster/features/finalize", finalize),
)
