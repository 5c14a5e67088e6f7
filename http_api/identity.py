"""The cluster's identity at the HTTP border: calls of another cluster refused, stray data
listed.

- `check_cluster_id` (a stage of http_api/edge.py's middleware): a request that names a cluster (`X-Dmq-Cluster-Id`: every
  broker-to-broker call once its broker knows the id, and `dmq serve --join` asking for
  the cluster) is answered 409 `cluster_id_mismatch` when this broker belongs to another
  one, with one warning line naming both ids; its handler never runs. A request naming no
  cluster (a client, a new broker with an empty data directory) passes as before.
- `GET /v1/storage/set-aside`: the partition data this broker set aside instead of opening
  or deleting it (dmq/broker/strays.py), so that an operator can recover it.
"""

from __future__ import annotations

import logging
from typing import Any

from aiohttp import web

from dmq import errors
from dmq.internal_auth import CLUSTER_ID_HEADER
from http_api import codec
from http_api.forward import broker_of

_log = logging.getLogger("dmq.http")


def check_cluster_id(request: web.Request) -> None:
    """Raise ClusterIdMismatch (logged) for a request naming another cluster than ours
    (http_api/edge.py calls this on every request, before the handler)."""
    theirs = request.headers.get(CLUSTER_ID_HEADER, "")
    if theirs:
        broker = broker_of(request)
        ours = broker.cluster_id
        if ours and theirs != ours:
            message = (
                f"broker {broker.config.node_id} is of cluster {ours}; this request comes "
                f"from cluster {theirs[:80]}: refused (a broker never serves another "
                f"cluster: check the caller's --peers, --join and data directory)"
            )
            _log.warning(
                "refused %s %s from %s: %s",
                request.method,
                request.path[:200],
                request.remote,
                message,
            )
            raise errors.ClusterIdMismatch(message, cluster_id=ours, request_cluster_id=theirs[:80])


async def set_aside(request: web.Request) -> web.Response:
    return codec.json_response(broker_of(request).strays.report())


IDENTITY_ROUTES: tuple[tuple[str, str, Any], ...] = (("GET", "/v1/storage/set-aside", set_aside),)
