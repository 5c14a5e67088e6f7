"""What every request must be before any stage reads it (the first stage of
http_api/edge.py's middleware after the error mapping): its dmq headers well formed, and,
when it changes state, sent by a page of this broker's origin or by a non-browser client.

1. **Headers.** `Authorization` and every `X-Dmq-*` header are credentials or numbers
   that later stages parse; a value that is not visible ASCII (invalid UTF-8, a
   non-latin-1 character, a control byte) or longer than its bound is refused here, 401
   `unauthenticated` (`reason` malformed) for a credential, 400 `invalid_request` for the
   others, `details.field` naming the header, so no later stage can fail on it with a 500
   (a 5,000-digit number once overflowed Python's integer parsing). aiohttp itself
   refuses a header with a NUL, CR or LF byte before any stage runs (its own 400).
2. **Cross-site requests.** A browser attaches HTTP Basic credentials to requests that
   another site's page makes, and sends some of them without asking the server first: a
   POST with a `text/plain`, form or multipart body (CORS "simple" requests). Every
   state-changing request (POST, PUT, PATCH, DELETE) of the public API is therefore
   refused 403 `forbidden` (`details.field` Origin) when its `Origin` names another
   host than the one it was sent to (browsers send `Origin` on every cross-origin POST),
   and, on every such /v1 route but produce, 415 when its body comes with one of those
   three content types: admin, group and share-group routes take JSON. Produce keeps its
   documented types (`text/plain` for `curl --data-binary`); the Confluent v2 routes
   already take only their `+json` types and JSON (415 in the proxy's shape). The web console sends its own origin and the
   `X-Dmq-Client` header (a custom header: a cross-site page cannot send it without a
   CORS preflight, which dmq never grants). Internal routes (signed by brokers) are not
   browser targets and are left to http_api/internal_auth.py.
3. **Expect.** aiohttp answers `Expect` before any middleware, and its own answer to an
   unknown value echoed the value into a body it could not encode (a 500 for invalid
   UTF-8): every route takes `expect_100` instead, which answers 417 in JSON naming the
   header; so does a request that matches no route (`Router`: its 404 or 405 follows).
"""

from __future__ import annotations

import json
import urllib.parse
from collections.abc import Awaitable, Callable
from typing import Final

from aiohttp import hdrs, web
from aiohttp.http import HttpVersion11
from aiohttp.web_urldispatcher import MatchInfoError, UrlMappingMatchInfo

from dmq import errors
from dmq.internal_auth import SIGNATURE_HEADER, is_internal
from dmq.peers import FORWARDED_HEADER

AUTHORIZATION: Final = "Authorization"
# Longest value of a dmq header but Authorization (whose bound is dmq/broker/security.py's
# HEADER_CHARS_MAX): a signature is ~80 characters, a cluster id 36, a delay 19 digits.
# Cost: none; a longer value is refused unread.
DMQ_HEADER_CHARS_MAX: Final = 256
# How many relays a request may have been through: one today (a relay is never relayed
# again); the header is parsed as a number, so its digits are bounded.
FORWARDED_DIGITS_MAX: Final = 3
CLIENT_HEADER: Final = "X-Dmq-Client"  # sent by the web console: a custom header
_CREDENTIALS: Final = (AUTHORIZATION, SIGNATURE_HEADER)
_STATE_CHANGING: Final = frozenset({"POST", "PUT", "PATCH", "DELETE"})
# The body types a browser sends cross-site without a CORS preflight (Fetch standard,
# "CORS-safelisted request-header" Content-Type).
_SIMPLE_BODY_TYPES: Final = frozenset(
    {"text/plain", "application/x-www-form-urlencoded", "multipart/form-data"}
)
# Routes whose documented body types include a simple one (README.md, "Produce").
_PRODUCE_ROUTES: Final = frozenset({"/v1/topics/{topic}/records"})


def _visible_ascii(value: str) -> bool:
    """Visible ASCII, space and tab (RFC 9110 field-vchar without obs-text)."""
    return value.isascii() and all(c == "\t" or " " <= c <= "~" for c in value)


def check_headers(request: web.Request, header_chars_max: int) -> None:
    """Refuse (module docstring, 1) a request whose Authorization or X-Dmq-* header is not
    visible ASCII within its bound. `header_chars_max` bounds Authorization."""
    for name, value in request.headers.items():
        upper = name.upper()
        is_auth = upper == AUTHORIZATION.upper()
        if not (is_auth or upper.startswith("X-DMQ-")):
            continue
        bound = header_chars_max if is_auth else DMQ_HEADER_CHARS_MAX
        if len(value) <= bound and _visible_ascii(value):
            if upper == FORWARDED_HEADER.upper() and not _is_hops(value):
                raise errors.InvalidRequest(
                    f"{FORWARDED_HEADER} must be 1-{FORWARDED_DIGITS_MAX} digits",
                    field=FORWARDED_HEADER,
                    limit=FORWARDED_DIGITS_MAX,
                )
            continue
        canonical = next((c for c in _CREDENTIALS if c.upper() == upper), None)
        message = f"{name} must be at most {bound} characters of visible ASCII"
        if canonical is not None:
            raise errors.Unauthenticated(message, field=canonical, reason="malformed", limit=bound)
        raise errors.InvalidRequest(message, field=name, limit=bound)


def _is_hops(value: str) -> bool:
    return 0 < len(value) <= FORWARDED_DIGITS_MAX and value.isdigit()


def check_same_site(request: web.Request) -> None:
    """Refuse (module docstring, 2) a state-changing request from another site's page."""
    if request.method not in _STATE_CHANGING or is_internal(request.path):
        return
    origin = request.headers.get("Origin")
    if origin is not None and not _same_origin(origin, request.host):
        raise errors.Forbidden(
            f"Origin {origin[:100]!r} is not this broker's: cross-site requests that "
            f"change state are refused",
            field="Origin",
            reason="cross_origin",
        )
    if request.content_type in _SIMPLE_BODY_TYPES and request.body_exists:
        route = request.match_info.route.resource
        template = "" if route is None else route.canonical
        # Produce keeps its documented types; the Confluent v2 routes refuse every type
        # but theirs and JSON already, in the proxy's error shape (http_api/rest_v2.py).
        if template in _PRODUCE_ROUTES or not template.startswith("/v1/"):
            return
        raise errors.UnsupportedMediaType(
            f"Content-Type {request.content_type!r} is refused on a route that changes "
            f"state (a browser sends it cross-site unasked): send application/json",
            field="Content-Type",
        )


def _same_origin(origin: str, host: str) -> bool:
    """Whether `Origin` names the host (and port) the request was sent to. The scheme is
    not compared: a TLS-terminating proxy in front makes it differ, and the same host
    and port is the same server either way. `null` (a sandboxed or privacy-stripped
    origin) is foreign."""
    try:
        parts = urllib.parse.urlsplit(origin)
    except ValueError:  # e.g. an unclosed IPv6 bracket
        return False
    return parts.scheme in ("http", "https") and bool(parts.netloc) and parts.netloc == host


async def expect_100(request: web.Request) -> None:
    """Every route's Expect handler (module docstring, 3): `100-continue` as aiohttp
    does, anything else 417 in the API's error shape, without echoing the value."""
    expect = request.headers.get(hdrs.EXPECT, "")
    if request.version != HttpVersion11:
        return
    if expect.lower() == "100-continue":
        await request.writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")
        request.writer.output_size = 0  # the body proper has not started
        return
    error = {"code": "invalid_request", "message": "Expect must be 100-continue",
             "details": {"field": "Expect"}}  # fmt: skip
    raise web.HTTPExpectationFailed(
        text=json.dumps({"error": error}), content_type="application/json"
    )


class _NoRoute(MatchInfoError):
    """aiohttp's answer for a request no route matches (404, 405), with `expect_100` as its
    Expect handler instead of aiohttp's own."""

    @property
    def expect_handler(self) -> Callable[[web.Request], Awaitable[None]]:
        return expect_100


class Router(web.UrlDispatcher):
    """The app's router: a request that matches no route gets `expect_100` too (module
    docstring, 3), so no Expect value reaches aiohttp's handler, whose 417 can be a 500."""

    async def resolve(self, request: web.Request) -> UrlMappingMatchInfo:
        match = await super().resolve(request)
        if isinstance(match, MatchInfoError):
            return _NoRoute(match.http_exception)
        return match
