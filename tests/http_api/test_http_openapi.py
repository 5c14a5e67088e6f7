"""The OpenAPI document describes exactly the running API.

Proves that `openapi_document(config)`:
- is a valid OpenAPI 3.1 document (openapi-spec-validator, every $ref resolved);
- has exactly the (method, path) pairs of the router that `make_app` builds, no more, no less;
- lists, for each error status, the codes of every dmq.errors class the status table maps
  to that status;
- takes its bounds from the BrokerConfig it is given;
- is what a live broker serves at GET /openapi.json for the config it runs with.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from openapi_spec_validator import validate

from dmq import errors
from dmq.broker import Broker
from dmq.config import BrokerConfig, load_config
from http_api.app import make_app
from http_api.console import CONSOLE_PATHS
from http_api.errors import status_for
from http_api.openapi import ERROR_STATUSES, openapi_document

HTTP_METHODS = {"get", "put", "post", "delete", "options", "head", "patch", "trace"}


def _operations(doc: dict[str, Any]) -> set[tuple[str, str]]:
    return {
        (method.upper(), path)
        for path, item in doc["paths"].items()
        for method in item
        if method in HTTP_METHODS
    }


def _parameter(doc: dict[str, Any], path: str, method: str, name: str) -> dict[str, Any]:
    params = doc["paths"][path][method].get("parameters", [])
    return next(p for p in params if p["name"] == name)


def test_document_is_valid_openapi_3_1() -> None:
    doc = openapi_document(BrokerConfig())
    assert doc["openapi"].startswith("3.1.")
    validate(doc)  # raises OpenAPIValidationError naming the first problem


def test_document_has_every_route_of_the_router_and_no_other(tmp_path: Path) -> None:
    config = BrokerConfig(data_dir=str(tmp_path))
    # The web console's routes serve static files, not the API: they are left out of the
    # document on purpose (http_api/console/; tests/http_api/test_http_console.py).
    router_routes = {
        (route.method, route.resource.canonical)
        for route in make_app(Broker(config)).router.routes()
        if route.resource is not None and route.resource.canonical not in CONSOLE_PATHS
    }
    documented = _operations(openapi_document(config))
    assert router_routes - documented == set(), "routes missing from the document"
    assert documented - router_routes == set(), "documented operations the router lacks"


def _error_classes() -> list[type[errors.DmqError]]:
    found: list[type[errors.DmqError]] = [errors.DmqError]
    for cls in found:
        found.extend(cls.__subclasses__())
    return found


def test_error_codes_of_each_status_match_the_status_table() -> None:
    for cls in _error_classes():
        status = status_for(cls.__new__(cls))
        assert status in ERROR_STATUSES, f"{cls.__name__} maps to undocumented status {status}"
        assert cls.code in ERROR_STATUSES[status][1], f"{cls.code} missing from status {status}"


def test_bounds_follow_the_broker_config() -> None:
    config = BrokerConfig(
        fetch_wait_ms_max=1234, fetch_records_max=77, produce_records_max=9, batch_bytes_max=65536,
        record_bytes_max=4096, request_bytes_max=65536, fetch_bytes_max=65536,
    )  # fmt: skip
    doc = openapi_document(config)
    fetch = "/v1/topics/{topic}/partitions/{partition}/records"
    assert _parameter(doc, fetch, "get", "wait_ms")["schema"]["maximum"] == 1234
    assert _parameter(doc, fetch, "get", "max_records")["schema"]["maximum"] == 77
    assert _parameter(doc, fetch, "get", "max_bytes")["schema"]["maximum"] == 65536
    schemas = doc["components"]["schemas"]
    assert schemas["ProduceRequest"]["properties"]["records"]["maxItems"] == 9
    assert schemas["TopicConfig"]["properties"]["max_record_bytes"]["maximum"] == 65536
    assert schemas["ProduceRecord"]["additionalProperties"] is False
    validate(doc)


def test_live_broker_serves_the_document_for_its_config(broker_factory: Any) -> None:
    flags = {"fetch_wait_ms_max": "1500", "produce_records_max": "123"}
    extra_args = [
        arg for name, value in flags.items() for arg in (f"--{name.replace('_', '-')}", value)
    ]
    broker = broker_factory(extra_args=extra_args).start()
    status, served = broker.json("GET", "/openapi.json")
    assert status == 200
    config = load_config(flags, environ=os.environ)
    assert served == json.loads(json.dumps(openapi_document(config)))
