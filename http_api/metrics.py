"""`GET /metrics` and the request-latency middleware (dmq/broker/metrics.py owns the registry).

The route is outside /v1 and outside the OpenAPI document, as Prometheus expects of a
scrape target; it answers even while the broker starts (the families it cannot read yet
are left out). With `--auth on` it needs describe on the cluster (http_api/auth.py's
ROUTE_NEEDS: it names every topic and group), like the other cluster-wide reads;
Prometheus sends a token. http_api/README.md documents it.

The edge middleware (http_api/edge.py) observes every request's latency into
`dmq_http_request_duration_seconds{method, route, status_class}`, labelled with the route
*template* (`/v1/topics/{topic}/records`), never the raw path: its series are bounded by
the route table whatever paths clients send. It observes outermost, so it sees the status
the error mapping gave. A handler cancelled (the server stopping) is not observed.
"""

from __future__ import annotations

from aiohttp import web

from dmq.broker.metrics import CONTENT_TYPE, UNMATCHED_ROUTE
from http_api.forward import broker_of


def route_template(request: web.Request) -> str:
    route = request.match_info.route
    resource = route.resource if route is not None else None
    return resource.canonical if resource is not None else UNMATCHED_ROUTE


async def metrics(request: web.Request) -> web.Response:
    body = await broker_of(request).metrics.render()
    # CONTENT_TYPE carries its own charset parameter: passed as a header, not content_type.
    return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE})


METRICS_ROUTES = (("GET", "/metrics", metrics),)
