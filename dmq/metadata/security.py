"""The security domain of the metadata catalogue: users, ACLs and quotas (pure).

What the brokers authenticate and authorise HTTP callers against when they run with
`--auth on` (dmq/broker/security.py; dmq/README.md, "Security"). Commands:

- `PutUser`: create a user or replace its credential. It carries the salted scrypt key
  the receiving broker derived from the password, never the password: the Raft log, the
  snapshots and the catalogue hold no secret a reader could replay;
- `DeleteUser`: remove a user (its ACLs and quota stay: Kafka keeps them too, so that a
  user re-created later gets them back);
- `AddAcl` / `RemoveAcl`: one binding, as Kafka's (principal, resource type, pattern,
  name, operation, allow|deny). Adding one that exists is a no-op; removing one that
  does not is rejected (`unknown_acl`);
- `SetQuota`: a principal's produce and fetch bytes/s and requests/s; all 0 removes it.

State: `MetadataState.security`; JSON key `security`, left out while empty so that every
older snapshot is written back byte for byte. It is in the catalogue: observers
authenticate and authorise too. The catalogue JSON travels only on /v1/internal (signed
with the cluster secret); no public route returns a key or a salt.

Rules apply() keeps, whatever commands arrive:

- a user name is 1..NAME_CHARS_MAX of [A-Za-z0-9._@-] (no ':': it separates name and
  password in HTTP Basic and in the bearer token); salts and keys are hex of bounded size;
  scrypt parameters are within SCRYPT_*_MAX (a verification must stay affordable);
- `acls` is sorted and distinct; every binding's fields are among the words above, a
  principal is "User:<name>" or "User:*", a cluster binding names "cluster";
- at most USERS_MAX users, ACLS_MAX bindings, QUOTAS_MAX quotas: more is rejected;
- a rejection leaves the state unchanged; every change bumps metadata_version (observers
  follow it).

`authorize` is the one evaluation of the ACLs, pure: deny wins over allow; a literal
binding matches its name (or every name, if "*"), a prefixed one every name that starts
with it; `all` matches every operation; an allowed read, write, delete or alter implies
describe (as in Kafka). Superusers are the caller's business (they bypass it).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Final

from dmq.metadata.codec import FieldCodec
from dmq.metadata.registry import CommandSpec, Domain
from dmq.metadata.state import (
    COMMAND_VERSION,
    REJECT_INVALID_ARGUMENT,
    AclBinding,
    Applied,
    MetadataState,
    Outcome,
    QuotaSpec,
    Rejected,
    SecurityState,
    UserCredential,
    bump,
)

REJECT_UNKNOWN_USER: Final = "unknown_user"
REJECT_UNKNOWN_ACL: Final = "unknown_acl"
REJECT_TOO_MANY: Final = "security_limit"

RESOURCE_TYPES: Final = ("cluster", "topic", "group", "share_group", "transactional_id")
PATTERNS: Final = ("literal", "prefixed")
OPERATIONS: Final = ("read", "write", "create", "delete", "alter", "describe", "all")
PERMISSIONS: Final = ("allow", "deny")
CLUSTER_NAME: Final = "cluster"  # the one cluster resource's name
ANY_PRINCIPAL: Final = "User:*"
_IMPLY_DESCRIBE: Final = frozenset({"read", "write", "delete", "alter"})

# Replicated bounds: they change only with a new command version (state.py's rule).
NAME_CHARS_MAX: Final = 64
RESOURCE_NAME_CHARS_MAX: Final = 249
USERS_MAX: Final = 10_000
ACLS_MAX: Final = 10_000
QUOTAS_MAX: Final = 10_000
SALT_HEX_MAX: Final = 128
KEY_HEX_MAX: Final = 256
# scrypt cost bounds: N*r*128 bytes of memory per verification (2**17*8*128 = 128 MiB).
SCRYPT_N_MAX: Final = 2**17
SCRYPT_R_MAX: Final = 16
SCRYPT_P_MAX: Final = 4
RATE_MAX: Final = 2**40  # a quota's bytes/s or requests/s
_NAME_CHARS: Final = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789._@-")
_HEX: Final = frozenset("0123456789abcdef")


def is_user_name(value: str) -> bool:
    return 0 < len(value) <= NAME_CHARS_MAX and set(value) <= _NAME_CHARS


def is_principal(value: str) -> bool:
    kind, sep, name = value.partition(":")
    return kind == "User" and sep == ":" and (name == "*" or is_user_name(name))


@dataclass(frozen=True, slots=True)
class PutUser:
    """Create `name`, or replace its credential (salt and key as lowercase hex)."""

    name: str
    salt: str
    key: str
    n: int
    r: int
    p: int
    now_ms: int
    version: int = COMMAND_VERSION


@dataclass(frozen=True, slots=True)
class DeleteUser:
    name: str
    now_ms: int
    version: int = COMMAND_VERSION


@dataclass(frozen=True, slots=True)
class AddAcl:
    principal: str
    resource_type: str
    pattern: str
    resource_name: str
    operation: str
    permission: str
    now_ms: int
    version: int = COMMAND_VERSION


@dataclass(frozen=True, slots=True)
class RemoveAcl:
    principal: str
    resource_type: str
    pattern: str
    resource_name: str
    operation: str
    permission: str
    now_ms: int
    version: int = COMMAND_VERSION


@dataclass(frozen=True, slots=True)
class SetQuota:
    """A principal's rates (0 = unlimited); all three 0 removes its quota."""

    principal: str
    produce_bytes_per_s: int
    fetch_bytes_per_s: int
    requests_per_s: int
    now_ms: int
    version: int = COMMAND_VERSION


SecurityCommand = PutUser | DeleteUser | AddAcl | RemoveAcl | SetQuota

CODEC: Final = FieldCodec(
    {
        "name": "str",
        "salt": "str",
        "key": "str",
        "n": "int",
        "r": "int",
        "p": "int",
        "principal": "str",
        "resource_type": "str",
        "pattern": "str",
        "resource_name": "str",
        "operation": "str",
        "permission": "str",
        "produce_bytes_per_s": "int",
        "fetch_bytes_per_s": "int",
        "requests_per_s": "int",
        "now_ms": "int",
    }
)


def _invalid(message: str, field: str) -> Rejected:
    return Rejected(REJECT_INVALID_ARGUMENT, message, field)


def _is_hex(value: str, chars_max: int) -> bool:
    return 0 < len(value) <= chars_max and set(value) <= _HEX


def _put_user(state: MetadataState, cmd: PutUser, now_ms: int) -> Outcome:
    sec = state.security
    if not is_user_name(cmd.name):
        return state, _invalid(
            f"name must be 1-{NAME_CHARS_MAX} characters of [A-Za-z0-9._@-]", "name"
        )
    if not _is_hex(cmd.salt, SALT_HEX_MAX) or not _is_hex(cmd.key, KEY_HEX_MAX):
        return state, _invalid("salt and key must be lowercase hex", "salt")
    n, r, p = cmd.n, cmd.r, cmd.p
    if not (2 <= n <= SCRYPT_N_MAX and n & (n - 1) == 0 and 1 <= r <= SCRYPT_R_MAX):
        return state, _invalid(f"scrypt n must be a power of 2 <= {SCRYPT_N_MAX}", "n")
    if not 1 <= p <= SCRYPT_P_MAX:
        return state, _invalid(f"scrypt p must be 1-{SCRYPT_P_MAX}", "p")
    if cmd.name not in sec.users and len(sec.users) >= USERS_MAX:
        return state, Rejected(REJECT_TOO_MANY, f"at most {USERS_MAX} users", "name")
    credential = UserCredential(cmd.salt, cmd.key, n, r, p, now_ms)
    users = {**sec.users, cmd.name: credential}
    return _changed(state, now_ms, replace(sec, users=users))


def _delete_user(state: MetadataState, cmd: DeleteUser, now_ms: int) -> Outcome:
    sec = state.security
    if cmd.name not in sec.users:
        return state, Rejected(REJECT_UNKNOWN_USER, f"no user {cmd.name!r}", "name")
    users = {k: v for k, v in sec.users.items() if k != cmd.name}
    return _changed(state, now_ms, replace(sec, users=users))


def binding_problem(b: AclBinding) -> Rejected | None:
    """Why `b` is not a well-formed binding (None if it is)."""
    if not is_principal(b.principal):
        return _invalid("principal must be User:<name> or User:*", "principal")
    for field, value, allowed in (
        ("resource_type", b.resource_type, RESOURCE_TYPES),
        ("pattern", b.pattern, PATTERNS),
        ("operation", b.operation, OPERATIONS),
        ("permission", b.permission, PERMISSIONS),
    ):
        if value not in allowed:
            return _invalid(f"{field} must be one of {', '.join(allowed)}", field)
    if not 0 < len(b.name) <= RESOURCE_NAME_CHARS_MAX:
        return _invalid(
            f"resource_name must be 1-{RESOURCE_NAME_CHARS_MAX} characters", "resource_name"
        )
    if b.resource_type == "cluster" and (b.name, b.pattern) != (CLUSTER_NAME, "literal"):
        return _invalid('a cluster binding names "cluster", literal', "resource_name")
    return None


def _binding(cmd: AddAcl | RemoveAcl) -> AclBinding:
    return AclBinding(
        cmd.principal, cmd.resource_type, cmd.pattern, cmd.resource_name, cmd.operation,
        cmd.permission,
    )  # fmt: skip


def _add_acl(state: MetadataState, cmd: AddAcl, now_ms: int) -> Outcome:
    binding = _binding(cmd)
    problem = binding_problem(binding)
    if problem is not None:
        return state, problem
    sec = state.security
    if binding in sec.acls:
        return state, Applied(state.metadata_version)  # already there: nothing changes
    if len(sec.acls) >= ACLS_MAX:
        return state, Rejected(REJECT_TOO_MANY, f"at most {ACLS_MAX} ACLs", "principal")
    return _changed(state, now_ms, replace(sec, acls=tuple(sorted((*sec.acls, binding)))))


def _remove_acl(state: MetadataState, cmd: RemoveAcl, now_ms: int) -> Outcome:
    binding = _binding(cmd)
    sec = state.security
    if binding not in sec.acls:
        return state, Rejected(REJECT_UNKNOWN_ACL, "no such ACL", "principal")
    acls = tuple(b for b in sec.acls if b != binding)
    return _changed(state, now_ms, replace(sec, acls=acls))


def _set_quota(state: MetadataState, cmd: SetQuota, now_ms: int) -> Outcome:
    if not is_principal(cmd.principal):
        return state, _invalid("principal must be User:<name> or User:*", "principal")
    rates = (cmd.produce_bytes_per_s, cmd.fetch_bytes_per_s, cmd.requests_per_s)
    for name, rate in zip(
        ("produce_bytes_per_s", "fetch_bytes_per_s", "requests_per_s"), rates, strict=True
    ):
        if not 0 <= rate <= RATE_MAX:
            return state, _invalid(f"{name} must be 0-{RATE_MAX} (0: unlimited)", name)
    sec = state.security
    quotas = {k: v for k, v in sec.quotas.items() if k != cmd.principal}
    if any(rates):
        if cmd.principal not in sec.quotas and len(sec.quotas) >= QUOTAS_MAX:
            return state, Rejected(REJECT_TOO_MANY, f"at most {QUOTAS_MAX} quotas", "principal")
        quotas[cmd.principal] = QuotaSpec(*rates)
    return _changed(state, now_ms, replace(sec, quotas=dict(sorted(quotas.items()))))


def _changed(state: MetadataState, now_ms: int, sec: SecurityState) -> Outcome:
    new_state = bump(state, now_ms, security=sec)
    return new_state, Applied(new_state.metadata_version)


# --- evaluation -----------------------------------------------------------------------------


def _matches(b: AclBinding, resource_type: str, name: str) -> bool:
    if b.resource_type != resource_type:
        return False
    if b.pattern == "prefixed":
        return name.startswith(b.name)
    return b.name in (name, "*")


def authorize(sec: SecurityState, user: str, resource_type: str, name: str, operation: str) -> bool:
    """May User:`user` do `operation` on the resource? Deny wins; no binding: no."""
    principals = (f"User:{user}", ANY_PRINCIPAL)
    allowed = False
    for b in sec.acls:
        if b.principal not in principals or not _matches(b, resource_type, name):
            continue
        if b.permission == "deny":
            if b.operation in (operation, "all"):
                return False
        elif b.operation in (operation, "all") or (
            operation == "describe" and b.operation in _IMPLY_DESCRIBE
        ):
            allowed = True
    return allowed


def quota_of(sec: SecurityState, user: str) -> QuotaSpec | None:
    """The user's own quota, else the default one (User:*), else None."""
    return sec.quotas.get(f"User:{user}") or sec.quotas.get(ANY_PRINCIPAL)


# --- JSON -----------------------------------------------------------------------------------


def _to_json(state: MetadataState) -> dict[str, Any]:
    sec = state.security
    if not (sec.users or sec.acls or sec.quotas):
        return {}  # an older cluster's snapshot is written back byte for byte
    return {
        "security": {
            "users": {
                name: [u.salt, u.key, u.n, u.r, u.p, u.created_ms]
                for name, u in sorted(sec.users.items())
            },
            "acls": [list(_fields(b)) for b in sec.acls],
            "quotas": {
                p: [q.produce_bytes_per_s, q.fetch_bytes_per_s, q.requests_per_s]
                for p, q in sorted(sec.quotas.items())
            },
        }
    }


def _fields(b: AclBinding) -> tuple[str, ...]:
    return (b.principal, b.resource_type, b.pattern, b.name, b.operation, b.permission)


def _from_json(doc: dict[str, Any], state: MetadataState) -> MetadataState:
    raw = doc.get("security")
    if raw is None:  # a cluster from before the domain, or one without users
        return state
    if not isinstance(raw, dict):
        raise ValueError(f"snapshot security must be an object, not {raw!r}")
    try:
        users = {str(n): UserCredential(*u) for n, u in raw.get("users", {}).items()}
        acls = tuple(sorted(AclBinding(*b) for b in raw.get("acls", [])))
        quotas = {str(p): QuotaSpec(*q) for p, q in raw.get("quotas", {}).items()}
    except TypeError as exc:
        raise ValueError(f"snapshot security is malformed: {exc}") from exc
    return replace(state, security=SecurityState(users, acls, quotas))


DOMAIN: Final = Domain(
    name="security",
    commands=(
        CommandSpec(PutUser, _put_user, CODEC),
        CommandSpec(DeleteUser, _delete_user, CODEC),
        CommandSpec(AddAcl, _add_acl, CODEC),
        CommandSpec(RemoveAcl, _remove_acl, CODEC),
        CommandSpec(SetQuota, _set_quota, CODEC),
    ),
    json_keys=("security",),
    to_json=_to_json,
    from_json=_from_json,
    in_catalogue=True,
)
