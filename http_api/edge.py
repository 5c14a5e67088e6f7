"""The one middleware every request passes: metrics, error mapping, the internal routes'
signature, auth, the cluster id check and relaying, in that order (#22).

They were six aiohttp middlewares, a coroutine and a call each per request; this runs
the same stages in the same order inline, and skips those that cannot apply (no cluster
secret: no signature to check; auth off: no principal), so a request pays one coroutine:

1. metrics (outermost): every request's latency and the status it was finally given,
   observed into `dmq_http_request_duration_seconds` (http_api/metrics.py); a request
   cancelled (the server stopping) is not observed;
2. errors: any exception below becomes the API's JSON error (http_api/errors.py's table);
   an HTTPException below 400 (a redirect) passes to aiohttp as it is;
2b. the request's dmq headers are well formed, and a state-changing request does not
   come from another site's page (http_api/request_guard.py);
3. with a cluster secret, a call of an internal route must be signed
   (http_api/internal_auth.py);
4. with auth on, authentication, the route's ACL (ROUTE_NEEDS), quotas, then stages 5-6
   and the handler, then a read's bytes charged (http_api/auth.py);
5. a request naming another cluster is refused (http_api/identity.py);
6. the handler; a ForwardRequest it raises is relayed (http_api/forward.py).

Every answer names this broker's release in X-Dmq-Version, and an internal call asking for
an internal API level this release does not speak is refused before stage 3
(dmq/compat.py).
"""

from __future__ import annotations

import asyncio
import time

from aiohttp import web

from dmq import __version__
from dmq.broker import ForwardRequest
from dmq.broker.security import HEADER_CHARS_MAX
from dmq.compat import FEATURES_HEADER, VERSION_HEADER, features_header_value
from http_api.auth import run_authorized
from http_api.errors import error_response_to
from http_api.forward import BROKER, Handler, relay
from http_api.identity import check_cluster_id
from http_api.internal_auth import check_internal_call, check_internal_level
from http_api.metrics import route_template
from http_api.request_guard import check_headers, check_same_site


async def _identified(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Stages 5 and 6 (what auth runs once it let the request through)."""
    check_cluster_id(request)
    try:
        return await handler(request)
    except ForwardRequest as forward:
        return await relay(request, forward)


@web.middleware
async def edge_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    started = time.perf_counter()
    broker = request.app[BROKER]
    status = 500  # an exception not turned into a response (cannot happen: stage 2)
    try:
        try:
            check_headers(request, HEADER_CHARS_MAX)
            check_same_site(request)
            check_internal_level(request)
            secret = broker.cluster_secret
            if secret is not None:
                await check_internal_call(request, secret)
            security = broker.security
            if security.enabled:
                response = await run_authorized(
                    request, security, lambda r: _identified(r, handler)
                )
            else:
                check_cluster_id(request)
                try:
                    response = await handler(request)
                except ForwardRequest as forward:
                    response = await relay(request, forward)
        except web.HTTPException as exc:
            if exc.status < 400:
                raise
            response = error_response_to(request, exc)
        except Exception as exc:
            response = error_response_to(request, exc)
        status = response.status
        if not response.prepared:  # a streamed answer sent its headers already
            response.headers[VERSION_HEADER] = __version__
            response.headers[FEATURES_HEADER] = features_header_value()
        return response
    except web.HTTPException as exc:
        status = exc.status
        raise
    except asyncio.CancelledError:
        status = 0  # not observed
        raise
    finally:
        if status:
            broker.metrics.observe_request(
                request.method, route_template(request), status, time.perf_counter() - started
            )
