"""The OpenAPI paths and schemas of the cluster identity's route (http_api/identity.py):
the partition data a broker set aside. Assembled by http_api/openapi.py."""

from __future__ import annotations

from typing import Any

from http_api.openapi_schema import NULLABLE_STRING, object_schema, ok, operation, ref


def identity_paths() -> dict[str, Any]:
    return {
        "/v1/storage/set-aside": {
            "get": operation(
                "storage_set_aside",
                "Partition data this broker set aside (stray: unknown to the catalogue), "
                "never opened as a replica nor deleted",
                {"200": ok("SetAside")},
            )
        },
    }


def identity_schemas() -> dict[str, Any]:
    count = {"type": ["integer", "null"]}
    entry = object_schema(
        {
            "path": {"type": "string"},
            "bytes": {"type": "integer", "minimum": 0},
            "original": NULLABLE_STRING,
            "topic_id": count,
            "partition": count,
            "reason": NULLABLE_STRING,
            "set_aside_ms": count,
        },
        ("path", "bytes", "original", "topic_id", "partition", "reason", "set_aside_ms"),
    )
    return {
        "SetAside": object_schema(
            {
                "data_dir": {"type": "string"},
                "set_aside": {"type": "array", "items": ref("SetAsideEntry")},
                "truncated": {"type": "boolean"},
            },
            ("data_dir", "set_aside", "truncated"),
        ),
        "SetAsideEntry": entry,
    }
