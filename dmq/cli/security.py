"""`dmq user`, `dmq acl`, `dmq quota` (registered by dmq/cli/__init__.py): the users, ACLs
and quotas of brokers run with `--auth on` (http_api/auth.py; dmq/README.md, "Security").
They authenticate with `--token` (env DMQ_TOKEN), e.g. the superuser's."""

from __future__ import annotations

import argparse
import json
from typing import Any

from dmq.cli._common import (
    Subparsers,
    add_output,
    print_fields,
    print_json,
    print_objects,
    print_table,
)
from dmq.client import Admin

_QUOTA_FLAGS = ("produce_bytes_per_s", "fetch_bytes_per_s", "requests_per_s")


def add_security(commands: Subparsers, url: argparse.ArgumentParser) -> None:
    _add_user(commands, url)
    _add_acl(commands, url)
    _add_quota(commands, url)


def _add_user(commands: Subparsers, url: argparse.ArgumentParser) -> None:
    user = commands.add_parser("user", help="users of brokers with --auth on")
    actions = user.add_subparsers(dest="user_command", metavar="ACTION", required=True)
    add = actions.add_parser("add", parents=[url], help="create a user or set its password")
    add.add_argument("name")
    add.add_argument(
        "--password", help="its password (8-1024 chars); without it one is generated and "
        "printed once, as the token NAME:PASSWORD",
    )  # fmt: skip
    add.set_defaults(handler=_user_add)
    remove = actions.add_parser("remove", parents=[url], help="remove a user")
    remove.add_argument("name")
    remove.set_defaults(handler=lambda a: _done(a, lambda admin: admin.remove_user(a.name)))
    listing = actions.add_parser("list", parents=[url], help="users and their quotas")
    add_output(listing)
    listing.set_defaults(handler=_user_list)
    whoami = actions.add_parser("whoami", parents=[url], help="who --token authenticates as")
    add_output(whoami)
    whoami.set_defaults(handler=lambda a: _print_one(a, _run(a, lambda admin: admin.whoami())))


def _add_binding_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--principal", required=True, help="User:NAME or User:*")
    parser.add_argument(
        "--resource-type", required=True,
        choices=("cluster", "topic", "group", "share_group", "transactional_id"),
        help="what kind of resource the binding is about",
    )  # fmt: skip
    parser.add_argument("--resource-name", help='the name, or prefix (default "cluster")')
    parser.add_argument("--pattern", choices=("literal", "prefixed"), default="literal",
                        help="literal: --resource-name is the name; prefixed: a name prefix "
                        "(literal)")  # fmt: skip
    parser.add_argument(
        "--operation", required=True,
        choices=("read", "write", "create", "delete", "alter", "describe", "all"),
        help="the operation allowed (or denied with --deny)",
    )  # fmt: skip
    parser.add_argument("--deny", action="store_true", help="a deny binding (deny wins)")


def _add_acl(commands: Subparsers, url: argparse.ArgumentParser) -> None:
    acl = commands.add_parser("acl", help="ACLs of brokers with --auth on (as Kafka's)")
    actions = acl.add_subparsers(dest="acl_command", metavar="ACTION", required=True)
    add = actions.add_parser("add", parents=[url], help="add one binding")
    _add_binding_arguments(add)
    add.set_defaults(handler=lambda a: _done(a, lambda admin: admin.add_acl(_binding(a))))
    remove = actions.add_parser("remove", parents=[url], help="remove one binding")
    _add_binding_arguments(remove)
    remove.set_defaults(handler=lambda a: _done(a, lambda admin: admin.remove_acl(_binding(a))))
    listing = actions.add_parser("list", parents=[url], help="the bindings")
    listing.add_argument("--principal", help="only this principal's bindings (User:NAME)")
    listing.add_argument("--resource-type", help="only bindings on this kind of resource")
    add_output(listing)
    listing.set_defaults(handler=_acl_list)


def _add_quota(commands: Subparsers, url: argparse.ArgumentParser) -> None:
    quota = commands.add_parser("quota", help="per-principal quotas, per broker")
    actions = quota.add_subparsers(dest="quota_command", metavar="ACTION", required=True)
    put = actions.add_parser("set", parents=[url], help="set (all 0: remove) a quota")
    put.add_argument("principal", help="User:NAME, or User:* for every user without one")
    for flag in _QUOTA_FLAGS:
        put.add_argument("--" + flag.replace("_", "-"), type=int, default=0, help="0: none")
    add_output(put)
    put.set_defaults(handler=_quota_set)
    listing = actions.add_parser("list", parents=[url], help="quotas, and what is left here")
    add_output(listing)
    listing.set_defaults(handler=_quota_list)


def _run(args: argparse.Namespace, call: Any) -> Any:
    with Admin(args.url, default_api_timeout_ms=args.api_timeout_ms) as admin:
        return call(admin)


def _done(args: argparse.Namespace, call: Any) -> int:
    _run(args, call)
    return 0


def _print_json(doc: Any) -> int:
    print_json(doc)
    return 0


def _print_one(args: argparse.Namespace, doc: dict[str, Any]) -> int:
    """One object of the API: as JSON, or as a FIELD / VALUE table."""
    if args.output == "json":
        return _print_json(doc)
    print_fields(doc)
    return 0


def _user_add(args: argparse.Namespace) -> int:
    answer = _run(args, lambda admin: admin.add_user(args.name, args.password))
    if "token" in answer:
        print(f"token: {answer['token']}  (shown once; send it as --token or DMQ_TOKEN)")
    else:
        print(f"user {answer['name']} set")
    return 0


def _user_list(args: argparse.Namespace) -> int:
    users = _run(args, lambda admin: admin.list_users())
    if args.output == "json":
        return _print_json({"users": users})
    rows = [("NAME", "CREATED-MS", "QUOTA")]
    rows += [(u["name"], str(u["created_ms"]), json.dumps(u["quota"])) for u in users]
    print_table(rows)
    return 0


def _binding(args: argparse.Namespace) -> dict[str, str]:
    return {
        "principal": args.principal,
        "resource_type": args.resource_type,
        "resource_name": args.resource_name or "cluster",
        "pattern": args.pattern,
        "operation": args.operation,
        "permission": "deny" if args.deny else "allow",
    }


def _acl_list(args: argparse.Namespace) -> int:
    acls = _run(args, lambda admin: admin.list_acls(args.principal, args.resource_type))
    if args.output == "json":
        return _print_json({"acls": acls})
    keys = ("principal", "resource_type", "pattern", "resource_name", "operation", "permission")
    print_table(
        [
            tuple(k.upper().replace("_", "-") for k in keys),
            *[tuple(a[k] for k in keys) for a in acls],
        ]
    )
    return 0


def _quota_set(args: argparse.Namespace) -> int:
    rates = {flag: getattr(args, flag) for flag in _QUOTA_FLAGS}
    return _print_one(args, _run(args, lambda admin: admin.set_quota(args.principal, rates)))


def _quota_list(args: argparse.Namespace) -> int:
    quotas = _run(args, lambda admin: admin.list_quotas())
    if args.output == "json":
        return _print_json(quotas)
    columns = list(dict.fromkeys(key for q in quotas for key in q)) or ["principal"]
    print_objects(quotas, columns)
    return 0
