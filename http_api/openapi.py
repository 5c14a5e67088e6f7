"""The OpenAPI 3.1 document of every route in http_api.app.ROUTES.

The document is built from the broker's configuration, so the bounds it states are
the ones the handlers enforce (max_records, wait_ms, records per request, the largest
max_record_bytes...). tests/http_api/test_http_openapi.py checks that it is a valid
OpenAPI 3.1 document and that its paths and methods are exactly the router's; the
schemathesis test then holds the running broker to it.

Shape: `openapi_document(config)` is one dict literal assembled from one module per
area: openapi_cluster (probes, cluster, operations), openapi_internal (broker to broker),
openapi_topics, openapi_records, openapi_groups, openapi_identity (set-aside data),
openapi_share, openapi_delay (scheduled records), openapi_transactions, openapi_auth (users, ACLs, quotas), openapi_rest_v2
(the Confluent REST Proxy v2 routes, in the proxy's error shape). Each builds its
paths and its named schemas with openapi_schema's helpers (parameters, bodies, operations,
error responses); no area imports this module or another area.
"""

from __future__ import annotations

from typing import Any

from dmq import __version__
from dmq.config import BrokerConfig
from http_api.openapi_auth import auth_paths, auth_schemas
from http_api.openapi_cluster import cluster_paths, cluster_schemas, operations_paths
from http_api.openapi_delay import delay_paths, delay_schemas
from http_api.openapi_groups import group_paths, group_schemas
from http_api.openapi_identity import identity_paths, identity_schemas
from http_api.openapi_internal import internal_paths
from http_api.openapi_records import record_paths, record_schemas
from http_api.openapi_rest_v2 import rest_v2_paths, rest_v2_schemas
from http_api.openapi_schema import (
    ERROR_STATUSES,
    OFFSET_HEADERS,
    error_response,
    error_schema,
    offset_header,
)
from http_api.openapi_share import share_paths, share_schemas
from http_api.openapi_topics import topic_paths, topic_schemas
from http_api.openapi_transactions import (
    extend_record_operations,
    transaction_paths,
    transaction_schemas,
)

__all__ = ["ERROR_STATUSES", "openapi_document"]


def openapi_document(config: BrokerConfig) -> dict[str, Any]:
    paths, schemas = _paths(config), _schemas(config)
    extend_record_operations(paths, schemas)  # transactional produce and fetch
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "dmq",
            "version": __version__,
            "description": "A distributed message queue: partitioned, replicated logs over "
            "HTTP/JSON. See http_api/README.md.",
        },
        "paths": paths,
        "components": {
            "schemas": schemas,
            "responses": {f"Error{status}": error_response(status) for status in ERROR_STATUSES},
            "headers": {
                "Retry-After": {
                    "description": "seconds to wait before retrying",
                    "schema": {"type": "integer", "minimum": 1},
                },
                **{name: offset_header(text) for name, text in OFFSET_HEADERS.items()},
            },
        },
    }


def _paths(config: BrokerConfig) -> dict[str, Any]:
    # The order is the document's order of paths, as before the split into areas.
    return {
        **group_paths(config),
        **cluster_paths(),
        **internal_paths(config),
        **operations_paths(),
        **topic_paths(),
        **record_paths(config),
        **identity_paths(),
        **share_paths(config),
        **delay_paths(config),
        **transaction_paths(),
        **rest_v2_paths(config),  # Confluent REST Proxy v2, outside /v1
        **auth_paths(),  # users, ACLs, quotas
    }


def _schemas(config: BrokerConfig) -> dict[str, Any]:
    return {
        "Error": error_schema(),
        **cluster_schemas(),
        **topic_schemas(config),
        **record_schemas(config),
        **group_schemas(config),
        **identity_schemas(),
        **share_schemas(config),
        **delay_schemas(),
        **transaction_schemas(),
        **rest_v2_schemas(config),
        **auth_schemas(),
    }
