"""The OpenAPI paths and schemas of users, ACLs and quotas (http_api/auth.py). Assembled
by http_api/openapi.py."""

from __future__ import annotations

from typing import Any

from http_api.openapi_schema import json_body, object_schema, ok, operation, query

_NAME = {"type": "string", "minLength": 1, "maxLength": 64, "pattern": "^[A-Za-z0-9._@-]+$"}
_PRINCIPAL = {"type": "string", "pattern": "^User:(\\*|[A-Za-z0-9._@-]{1,64})$"}
_RATE = {"type": "integer", "minimum": 0, "maximum": 2**40, "description": "0: unlimited"}
_RESOURCE_TYPE = {
    "type": "string",
    "enum": ["cluster", "topic", "group", "share_group", "transactional_id"],
}
_AUTH_ERRORS = (400, 401, 403)


def auth_paths() -> dict[str, Any]:
    user_parameter = {"name": "name", "in": "path", "required": True, "schema": _NAME}
    return {
        "/v1/auth/whoami": {
            "get": operation(
                "auth_whoami",
                "The caller's principal, and this broker's credential cache and refusals",
                {"200": ok("WhoAmI")},
                errors=(401,),
            )
        },
        "/v1/auth/users": {
            "get": operation(
                "auth_list_users",
                "Users (names, creation time, quota; never a key or salt). Describe on cluster",
                {"200": ok("Users")},
                errors=(401, 403),
            ),
            "post": operation(
                "auth_put_user",
                "Create a user or replace its password (stored as a salted scrypt key). "
                "Without a password one is generated and returned once as `token`. "
                "Alter on cluster",
                {"201": ok("UserCreated")},
                body=json_body("UserRequest"),
                errors=_AUTH_ERRORS,
            ),
        },
        "/v1/auth/users/{name}": {
            "delete": operation(
                "auth_delete_user",
                "Remove a user (its ACLs and quota stay). Alter on cluster",
                {"200": ok(object_schema({"deleted": {"type": "string"}}, ("deleted",)))},
                parameters=[user_parameter],
                errors=(*_AUTH_ERRORS, 404),
            )
        },
        "/v1/acls": {
            "get": operation(
                "acl_list",
                "ACL bindings, optionally of one principal or resource type. Describe on cluster",
                {"200": ok("Acls")},
                parameters=[
                    query("principal", {"type": "string"}, "only this principal's"),
                    query("resource_type", {"type": "string"}, "only this resource type's"),
                ],
                errors=(401, 403),
            ),
            "post": operation(
                "acl_add",
                "Add an ACL binding (a no-op if it exists). Alter on cluster",
                {"201": ok("Acl")},
                body=json_body("AclRequest"),
                errors=_AUTH_ERRORS,
            ),
            "delete": operation(
                "acl_remove",
                "Remove one ACL binding, given whole. Alter on cluster",
                {"200": ok(object_schema({"deleted": {"$ref": "#/components/schemas/Acl"}}))},
                body=json_body("AclRequest"),
                errors=(*_AUTH_ERRORS, 404),
            ),
        },
        "/v1/quotas": {
            "get": operation(
                "quota_list",
                "Quotas per principal, with what is left of each on this broker",
                {"200": ok("Quotas")},
                errors=(401, 403),
            ),
            "post": operation(
                "quota_set",
                "Set a principal's quotas (User:* is the default); all 0 removes them",
                {"200": ok("QuotaRequest")},
                body=json_body("QuotaRequest"),
                errors=_AUTH_ERRORS,
            ),
        },
    }


def auth_schemas() -> dict[str, Any]:
    rates = {
        "produce_bytes_per_s": _RATE,
        "fetch_bytes_per_s": _RATE,
        "requests_per_s": _RATE,
    }
    acl = {
        "principal": _PRINCIPAL,
        "resource_type": _RESOURCE_TYPE,
        "pattern": {"type": "string", "enum": ["literal", "prefixed"], "default": "literal"},
        "resource_name": {"type": "string", "minLength": 1, "maxLength": 249},
        "operation": {
            "type": "string",
            "enum": ["read", "write", "create", "delete", "alter", "describe", "all"],
        },
        "permission": {"type": "string", "enum": ["allow", "deny"], "default": "allow"},
    }
    quota = {"type": ["object", "null"], "properties": rates}
    return {
        "WhoAmI": object_schema(
            {"principal": {"type": ["string", "null"]}, "superuser": {"type": "boolean"}},
            ("principal", "superuser"),
            closed=False,
        ),
        "UserRequest": object_schema(
            {"name": _NAME, "password": {"type": "string", "minLength": 8, "maxLength": 1024}},
            ("name",),
        ),
        "UserCreated": object_schema(
            {
                "name": {"type": "string"},
                "principal": {"type": "string"},
                "token": {"type": "string", "description": "name:password, shown once"},
            },
            ("name", "principal"),
        ),
        "Users": object_schema(
            {
                "users": {
                    "type": "array",
                    "items": object_schema(
                        {
                            "name": {"type": "string"},
                            "created_ms": {"type": "integer"},
                            "quota": quota,
                        },  # fmt: skip
                        ("name", "created_ms", "quota"),
                    ),
                }
            },
            ("users",),
        ),
        "AclRequest": object_schema(acl, ("principal", "resource_type", "operation")),
        "Acl": object_schema(acl, tuple(acl)),
        "Acls": object_schema(
            {"acls": {"type": "array", "items": {"$ref": "#/components/schemas/Acl"}}},
            ("acls",),
        ),
        "QuotaRequest": object_schema({"principal": _PRINCIPAL, **rates}, ("principal",)),
        "Quotas": object_schema(
            {"quotas": {"type": "array", "items": {"type": "object"}}}, ("quotas",)
        ),
    }
