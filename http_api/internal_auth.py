"""Serve the internal routes (`/v1/internal/*`) only to brokers that sign their calls.

With a cluster secret, a request to an internal path must carry a valid
`X-Dmq-Signature` (dmq/internal_auth.py has the scheme); otherwise it is answered 401
`unauthenticated` with `details.reason` (missing, malformed, expired, signature) and
logged, and its handler never runs. The check runs before the handler, on the path the
router matches (so no spelling of a path reaches an internal handler unchecked), and reads
the body once (the handler reads the same bytes again). Without a secret nothing is
checked: an unsecured cluster must keep its ports private.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable

from aiohttp import web

from dmq import errors, internal_auth
from http_api.forward import broker_of

_log = logging.getLogger("dmq.http")

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@web.middleware
async def internal_auth_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    secret = broker_of(request).cluster_secret
    if secret is not None and internal_auth.is_internal(request.path):
        body = await request.read()
        header = request.headers.get(internal_auth.SIGNATURE_HEADER)
        try:
            internal_auth.verify(secret, request.method, request.raw_path, body, header)
        except errors.Unauthenticated as exc:
            _log.warning(
                "refused %s %s from %s: %s",
                request.method,
                request.path[:200],
                request.remote,
                exc.message,
            )
            raise
    return await handler(request)
