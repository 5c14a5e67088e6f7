"""Authentication, authorisation and quotas of the HTTP API (`dmq serve --auth on`).

The users, ACLs and quotas are replicated in the metadata group (dmq/metadata/security.py);
this service is each broker's side of them. http_api/auth.py calls, for every public
request, in order:

1. `authenticate(header)`: the `Authorization` header to a `Principal`, or Unauthenticated
   (401). `Bearer <token>` is the bootstrap superuser's token (env DMQ_SUPERUSER_TOKEN,
   compared in constant time) or a user's `name:password`; `Basic` carries the same pair.
   A password is checked by deriving its scrypt key with the user's salt and comparing
   in constant time (`hmac.compare_digest`). scrypt costs tens of milliseconds of CPU on
   purpose, so a verified credential is cached (`CredentialCache`): a bounded LRU keyed
   by the SHA-256 of the header, each entry trusted for `auth_cache_ttl_ms` and only
   while the user's credential in the catalogue is the very one it was checked against
   (a changed password or a deleted user misses at once, on every broker, as soon as it
   applies the change). Failures are cached the same way, so a client retrying a wrong
   password does not cost a scrypt each time. An unknown user's password is derived
   too, against a made-up credential, so that the answer takes as long as for a known
   user with a wrong password (no enumeration of users by timing). At most
   VERIFY_CONCURRENCY derivations run at once, on worker threads (hashlib.scrypt
   releases the GIL): the event loop keeps serving while one runs; one client address
   may have at most `auth_checks_per_address_max` under way or queued (429 naming the
   limit past it), so that it cannot queue scrypt work ahead of other clients' logins;
2. `charge_request(principal, body_bytes, fetch_reserve_bytes)`: the principal's
   requests/s and (for a produce) bytes/s quotas, the body's bytes as read (however it
   was framed: a chunked body has no Content-Length); over quota, QuotaExceeded (429,
   Retry-After) before anything is done. A request that answers records reserves its
   `max_bytes` from the fetch bucket at once, so that a principal's parallel long-polls
   share one debt: while the reservations of those in flight empty the bucket, its next
   fetches are refused;
3. `check(principal, resource_type, name, operation)`: the ACLs (superusers bypass them).
   Refused: Forbidden (403) naming the operation and the resource, except a topic the
   principal may not even describe, which is TopicNotFound (404), as in Kafka: a
   principal learns nothing of topics it may not see;
4. after a read, `charge_fetch(principal, bytes, reserved)`: the reservation is given
   back and the answer's bytes are counted; a principal in debt is refused its next
   requests until the bucket refills.

Quotas are token buckets per principal and per broker (Kafka's are per broker too): a
bucket holds at most one second of its rate, may go into debt by one request, and a
request is refused only while it is empty, so a request larger than the rate still
passes, and nothing is ever dropped: a refused request did nothing and is retried.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import hashlib
import hmac
import math
import os
import secrets
import time
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Final

from dmq import errors
from dmq.broker.context import BrokerContext
from dmq.metadata.machine import AddAcl, DeleteUser, PutUser, RemoveAcl, SetQuota
from dmq.metadata.security import (
    ANY_PRINCIPAL,
    CLUSTER_NAME,
    authorize,
    binding_problem,
    is_principal,
    is_user_name,
    quota_of,
)
from dmq.metadata.service import wall_ms
from dmq.metadata.state import AclBinding, QuotaSpec, SecurityState, UserCredential

SUPERUSER_ENV: Final = "DMQ_SUPERUSER_TOKEN"
SUPERUSER_NAME: Final = "superuser"  # reserved: no user may take it
# scrypt: N=2**14, r=8 takes 16 MiB and about 30-60 ms of one core per derivation.
SCRYPT_N: Final = 2**14
SCRYPT_R: Final = 8
SCRYPT_P: Final = 1
SALT_BYTES: Final = 16
KEY_BYTES: Final = 32
PASSWORD_CHARS_MIN: Final = 8
PASSWORD_CHARS_MAX: Final = 1024
SUPERUSER_TOKEN_CHARS_MIN: Final = 16
HEADER_CHARS_MAX: Final = 4096  # a longer Authorization header is refused unread
VERIFY_CONCURRENCY: Final = 2  # scrypt derivations at once (each one core, 16 MiB)
QUOTA_BURST_S: Final = 1.0  # a bucket holds this many seconds of its rate
CHALLENGE: Final = 'Bearer realm="dmq", Basic realm="dmq"'  # WWW-Authenticate
__all__ = [
    "CHALLENGE",
    "HEADER_CHARS_MAX",
    "QUOTA_KINDS",
    "AclBinding",
    "Principal",
    "SecurityService",
]  # http_api


@dataclass(frozen=True, slots=True)
class Principal:
    name: str
    superuser: bool = False

    def __str__(self) -> str:
        return f"User:{self.name}"


def derive_key(password: str, salt: bytes, n: int, r: int, p: int) -> bytes:
    """scrypt of `password`: the only form a password is ever kept in."""
    return hashlib.scrypt(
        password.encode(), salt=salt, n=n, r=r, p=p, maxmem=2 * 128 * n * r * p + 2**20,
        dklen=KEY_BYTES,
    )  # fmt: skip


def _unauthenticated(reason: str, message: str) -> errors.Unauthenticated:
    return errors.Unauthenticated(message, field="Authorization", reason=reason)


def parse_authorization(header: str) -> tuple[str, str, str | None]:
    """(name, password, the bearer token as sent or None for Basic) of an Authorization
    header; Unauthenticated if it is neither `Bearer <token>` nor `Basic <base64
    name:password>`."""
    if len(header) > HEADER_CHARS_MAX:
        raise _unauthenticated("malformed", f"Authorization header over {HEADER_CHARS_MAX} chars")
    scheme, _, value = header.strip().partition(" ")
    value = value.strip()
    if scheme.lower() == "bearer" and value:
        name, _, password = value.partition(":")
        return name, password, value
    if scheme.lower() == "basic" and value:
        try:
            decoded = base64.b64decode(value, validate=True).decode()
        except (binascii.Error, UnicodeDecodeError):
            raise _unauthenticated("malformed", "Basic credentials are not base64") from None
        name, sep, password = decoded.partition(":")
        if sep:
            return name, password, None
    raise _unauthenticated(
        "malformed", "Authorization must be 'Bearer <name>:<password>' or 'Basic <base64>'"
    )


class CredentialCache:
    """Verified (and refused) credentials: a bounded LRU keyed by the header's SHA-256.

    An entry remembers the catalogue's credential object it was checked against; it is
    used only while that object is still the user's (module docstring)."""

    def __init__(self, entries_max: int, ttl_ms: int) -> None:
        self._entries_max = entries_max
        self._ttl_s = ttl_ms / 1000
        self._entries: OrderedDict[bytes, tuple[float, UserCredential | None, bool]] = OrderedDict()
        self.hits = 0
        self.misses = 0

    @staticmethod
    def key_of(header: str) -> bytes:
        return hashlib.sha256(b"dmq auth cache\0" + header.encode()).digest()

    def get(self, key: bytes, credential: UserCredential | None) -> bool | None:
        """The cached verdict for this credential, or None if not cached (or stale)."""
        entry = self._entries.get(key)
        if entry is None or entry[0] < time.monotonic() or entry[1] is not credential:
            self.misses += 1
            return None
        self._entries.move_to_end(key)
        self.hits += 1
        return entry[2]

    def put(self, key: bytes, credential: UserCredential | None, ok: bool) -> None:
        if self._entries_max == 0 or self._ttl_s == 0:
            return
        self._entries[key] = (time.monotonic() + self._ttl_s, credential, ok)
        self._entries.move_to_end(key)
        while len(self._entries) > self._entries_max:
            self._entries.popitem(last=False)

    def __len__(self) -> int:
        return len(self._entries)


class _Bucket:
    """A token bucket that may go into debt (module docstring)."""

    __slots__ = ("level", "reserved", "stamp")

    def __init__(self, rate: float) -> None:
        self.level = rate * QUOTA_BURST_S
        # Bytes that requests in flight may still take (fetch reservations): counted
        # against the level at admission, given back when they answer.
        self.reserved = 0
        self.stamp = time.monotonic()

    def refill(self, rate: float) -> float:
        now = time.monotonic()
        self.level = min(rate * QUOTA_BURST_S, self.level + (now - self.stamp) * rate)
        self.stamp = now
        return self.level


QUOTA_KINDS: Final = ("produce_bytes_per_s", "fetch_bytes_per_s", "requests_per_s")


class SecurityService:
    """This broker's authentication, ACL checks and quotas (module docstring)."""

    def __init__(self, ctx: BrokerContext) -> None:
        self._ctx = ctx
        self.enabled: Final = ctx.config.auth == "on"
        token = os.environ.get(SUPERUSER_ENV, "")
        if token and len(token) < SUPERUSER_TOKEN_CHARS_MIN:
            raise errors.InvalidConfig(
                f"{SUPERUSER_ENV} must be at least {SUPERUSER_TOKEN_CHARS_MIN} characters",
                field=SUPERUSER_ENV,
                limit=SUPERUSER_TOKEN_CHARS_MIN,
            )
        # Only its digest is kept; compared in constant time.
        self._superuser_digest = hashlib.sha256(token.encode()).digest() if token else None
        c = ctx.config
        self.cache = CredentialCache(c.auth_cache_entries_max, c.auth_cache_ttl_ms)
        self._verifying = asyncio.Semaphore(VERIFY_CONCURRENCY)
        self._checks_per_address_max = c.auth_checks_per_address_max
        self._checks: dict[str, int] = {}  # client address -> checks under way or queued
        # An unknown user's password is checked against this (module docstring, 1).
        self._nobody = UserCredential(
            os.urandom(SALT_BYTES).hex(), os.urandom(KEY_BYTES).hex(),
            SCRYPT_N, SCRYPT_R, SCRYPT_P, 0,
        )  # fmt: skip
        self._buckets: dict[tuple[str, str], _Bucket] = {}
        self.refused = {"unauthenticated": 0, "forbidden": 0, "quota": 0, "password_checks": 0}

    @property
    def _sec(self) -> SecurityState:
        return self._ctx.metadata.state.security

    # --- 1. authentication ----------------------------------------------------------------

    async def authenticate(self, header: str | None, address: str | None = None) -> Principal:
        """The principal of an Authorization header sent from `address` (the client's
        IP, for the bound on its password checks)."""
        if header is None:
            self.refused["unauthenticated"] += 1
            raise _unauthenticated("missing", "this broker runs with --auth on: send credentials")
        try:
            return await self._authenticate(header, address or "")
        except errors.Unauthenticated:
            self.refused["unauthenticated"] += 1
            raise

    async def _authenticate(self, header: str, address: str) -> Principal:
        name, password, bearer = parse_authorization(header)
        if bearer is not None and self._superuser_digest is not None:
            # The whole token, whatever it holds (a ':' too), against the superuser's.
            digest = hashlib.sha256(bearer.encode()).digest()
            if hmac.compare_digest(digest, self._superuser_digest):
                return Principal(SUPERUSER_NAME, superuser=True)
        if not password:
            raise _unauthenticated("credentials", "unknown token")
        credential = self._sec.users.get(name)
        key = CredentialCache.key_of(header)
        verdict = self.cache.get(key, credential)
        if verdict is None:
            # The same scrypt work whether the user exists or not (module docstring, 1).
            matches = await self._verify(password, credential or self._nobody, address)
            verdict = credential is not None and matches
            self.cache.put(key, credential, verdict)
        if not verdict:
            raise _unauthenticated("credentials", "unknown user or wrong password")
        return Principal(name)

    async def _verify(self, password: str, credential: UserCredential, address: str) -> bool:
        under_way = self._checks.get(address, 0)
        if under_way >= self._checks_per_address_max:
            self.refused["password_checks"] += 1
            raise errors.Backpressure(
                f"{under_way} password checks from {address or 'this client'} are under way "
                f"(auth_checks_per_address_max {self._checks_per_address_max})",
                retry_after_ms=100,
                limit=self._checks_per_address_max,
                field="auth_checks_per_address_max",
            )
        self._checks[address] = under_way + 1
        salt = bytes.fromhex(credential.salt)
        c = credential
        try:
            async with self._verifying:
                key = await asyncio.to_thread(derive_key, password, salt, c.n, c.r, c.p)
        finally:
            left = self._checks[address] - 1
            if left:
                self._checks[address] = left
            else:
                del self._checks[address]
        return hmac.compare_digest(key, bytes.fromhex(credential.key))

    # --- 2. quotas --------------------------------------------------------------------------

    def charge_request(
        self, principal: Principal, produce_bytes: int = 0, fetch_reserve_bytes: int = 0
    ) -> int:
        """Count one request (and its produce bytes), reserve a fetch's bytes; return the
        bytes reserved, to give back to `charge_fetch`. QuotaExceeded while a bucket is
        empty (nothing taken then). Superusers have no quota."""
        if principal.superuser:
            return 0
        spec = quota_of(self._sec, principal.name)
        if spec is None:
            return 0
        fetch_rate = spec.fetch_bytes_per_s
        self._admit(principal, "requests_per_s", spec.requests_per_s)
        if produce_bytes:
            self._admit(principal, "produce_bytes_per_s", spec.produce_bytes_per_s)
        elif fetch_rate:  # a fetch (or anything) while fetch bytes are in debt; only a
            # fetch waits for the reservations (a heartbeat must not wait for a long-poll)
            self._admit(principal, "fetch_bytes_per_s", fetch_rate, bool(fetch_reserve_bytes))
        self._take(principal, "requests_per_s", spec.requests_per_s, 1)
        if produce_bytes:
            self._take(principal, "produce_bytes_per_s", spec.produce_bytes_per_s, produce_bytes)
        if not fetch_rate or not fetch_reserve_bytes:
            return 0
        self._bucket(principal, "fetch_bytes_per_s", fetch_rate).reserved += fetch_reserve_bytes
        return fetch_reserve_bytes

    def charge_fetch(self, principal: Principal, fetched_bytes: int, reserved: int = 0) -> None:
        """Give back a read's reservation and count the bytes it answered."""
        if principal.superuser or (fetched_bytes <= 0 and not reserved):
            return
        spec = quota_of(self._sec, principal.name)
        key = (principal.name, "fetch_bytes_per_s")
        bucket = self._buckets.get(key)
        if bucket is not None:  # the quota may have been removed meanwhile
            bucket.reserved = max(0, bucket.reserved - reserved)
        if spec is not None and spec.fetch_bytes_per_s:
            bucket = self._bucket(principal, "fetch_bytes_per_s", spec.fetch_bytes_per_s)
            bucket.level -= max(0, fetched_bytes)

    def _bucket(self, principal: Principal, kind: str, rate: int) -> _Bucket:
        bucket = self._buckets.get((principal.name, kind))
        if bucket is None:
            bucket = self._buckets[(principal.name, kind)] = _Bucket(rate)
        bucket.refill(rate)
        return bucket

    def _admit(self, principal: Principal, kind: str, rate: int, reserving: bool = False) -> None:
        """QuotaExceeded while the bucket (less, for a request that reserves, what
        requests in flight reserved) is empty or in debt: refused before anything is
        done or taken."""
        if not rate:
            return
        bucket = self._bucket(principal, kind, rate)
        if bucket.level - (bucket.reserved if reserving else 0) > 0:
            return
        self.refused["quota"] += 1
        # In debt: until it refills. Only reserved: until a request in flight answers,
        # which the client cannot know; a second is a fair guess (a long-poll's own wait
        # may be longer, and the retry is refused again then).
        owed = 1 - bucket.level if bucket.level <= 0 else rate * QUOTA_BURST_S
        wait_ms = max(1, math.ceil(1000 * owed / rate))
        raise errors.QuotaExceeded(
            f"{principal} is over its {kind} quota of {rate} on this broker",
            retry_after_ms=wait_ms,
            quota=kind,
            limit=rate,
        )

    def _take(self, principal: Principal, kind: str, rate: int, amount: int) -> None:
        if rate:
            self._bucket(principal, kind, rate).level -= amount

    # --- 3. authorisation -------------------------------------------------------------------

    def allows(self, principal: Principal, resource_type: str, name: str, operation: str) -> bool:
        if principal.superuser:
            return True
        sec = self._sec
        if authorize(sec, principal.name, resource_type, name, operation):
            return True
        # Kafka: CREATE on the cluster lets one create any topic.
        return (resource_type, operation) == ("topic", "create") and authorize(
            sec, principal.name, "cluster", CLUSTER_NAME, "create"
        )

    def allows_stored(self, principal: str, resource_type: str, name: str, operation: str) -> bool:
        """For work done later on a principal's behalf (a share group's dead letters): the
        principal as stored ("User:alice"; "" if set while auth was off, which with auth on
        now is refused: its owner must configure it again)."""
        if not self.enabled:
            return True
        name_of, sep, user = principal.partition(":")
        if not sep or name_of != "User" or not user:
            return False
        return self.allows(Principal(user, superuser=user == SUPERUSER_NAME), resource_type,
                           name, operation)  # fmt: skip

    def check(self, principal: Principal, resource_type: str, name: str, operation: str) -> None:
        if self.allows(principal, resource_type, name, operation):
            return
        self.refused["forbidden"] += 1
        if resource_type == "topic" and not self.allows(principal, "topic", name, "describe"):
            raise errors.TopicNotFound(f"topic {name!r} does not exist", field="topic")
        raise errors.Forbidden(
            f"{principal} may not {operation} {resource_type} {name!r}",
            operation=operation,
            resource_type=resource_type,
            resource_name=name,
            principal=str(principal),
        )

    # --- users, ACLs, quotas (the admin routes) -----------------------------------------------

    async def put_user(self, name: str, password: str | None) -> dict[str, Any]:
        """Create or replace `name`; a password is generated when none is given and
        returned once (it is never stored)."""
        if not is_user_name(name) or name == SUPERUSER_NAME:
            raise errors.InvalidRequest(
                "name must be 1-64 characters of [A-Za-z0-9._@-], not 'superuser'", field="name"
            )
        if password is None:
            password = secrets.token_urlsafe(24)
            generated = True
        else:
            generated = False
        if not PASSWORD_CHARS_MIN <= len(password) <= PASSWORD_CHARS_MAX:
            raise errors.InvalidRequest(
                f"password must be {PASSWORD_CHARS_MIN}-{PASSWORD_CHARS_MAX} characters",
                field="password",
                limit=PASSWORD_CHARS_MAX,
            )
        salt = os.urandom(SALT_BYTES)
        async with self._verifying:
            key = await asyncio.to_thread(derive_key, password, salt, SCRYPT_N, SCRYPT_R, SCRYPT_P)
        await self._ctx.metadata.propose(
            PutUser(name, salt.hex(), key.hex(), SCRYPT_N, SCRYPT_R, SCRYPT_P, wall_ms())
        )
        answer: dict[str, Any] = {"name": name, "principal": f"User:{name}"}
        if generated:  # shown once: the broker keeps only its scrypt key
            answer["token"] = f"{name}:{password}"
        return answer

    async def delete_user(self, name: str) -> None:
        if name not in self._sec.users:
            raise errors.NotFound(f"no user {name!r}", field="name")
        await self._ctx.metadata.propose(DeleteUser(name, wall_ms()))

    def list_users(self) -> list[dict[str, Any]]:
        sec = self._sec
        return [
            {
                "name": name,
                "created_ms": u.created_ms,
                "quota": _quota_json(sec.quotas.get(f"User:{name}")),
            }
            for name, u in sorted(sec.users.items())
        ]

    async def add_acl(self, binding: AclBinding) -> None:
        problem = binding_problem(binding)
        if problem is not None:
            raise errors.InvalidRequest(problem.message, field=problem.field)
        await self._ctx.metadata.propose(AddAcl(*_acl_fields(binding), wall_ms()))

    async def remove_acl(self, binding: AclBinding) -> None:
        if binding not in self._sec.acls:
            raise errors.NotFound("no such ACL", field="principal")
        await self._ctx.metadata.propose(RemoveAcl(*_acl_fields(binding), wall_ms()))

    def list_acls(self, principal: str | None, resource_type: str | None) -> list[AclBinding]:
        return [
            b
            for b in self._sec.acls
            if principal in (None, b.principal) and resource_type in (None, b.resource_type)
        ]

    async def set_quota(self, principal: str, rates: dict[str, int]) -> None:
        if not is_principal(principal):
            raise errors.InvalidRequest(
                "principal must be User:<name> or User:*", field="principal"
            )
        await self._ctx.metadata.propose(
            SetQuota(
                principal,
                produce_bytes_per_s=rates.get("produce_bytes_per_s", 0),
                fetch_bytes_per_s=rates.get("fetch_bytes_per_s", 0),
                requests_per_s=rates.get("requests_per_s", 0),
                now_ms=wall_ms(),
            )
        )

    def list_quotas(self) -> list[dict[str, Any]]:
        """Every quota, with this broker's bucket levels (what is left now)."""
        out = []
        for principal, spec in sorted(self._sec.quotas.items()):
            name = principal.partition(":")[2]
            levels = {
                kind: round(self._buckets[(name, kind)].refill(getattr(spec, kind)))
                for kind in QUOTA_KINDS
                if (name, kind) in self._buckets and getattr(spec, kind)
            }
            default = principal == ANY_PRINCIPAL
            out.append({"principal": principal, **(_quota_json(spec) or {}), "default": default,
                        "available_on_this_broker": levels})  # fmt: skip
        return out

    def report(self) -> dict[str, Any]:
        """For GET /v1/auth/whoami and the metrics: cache and refusal counters."""
        return {
            "auth": "on" if self.enabled else "off",
            "credential_cache": {
                "entries": len(self.cache),
                "hits": self.cache.hits,
                "misses": self.cache.misses,
            },
            "refused": dict(self.refused),
        }


def _quota_json(spec: QuotaSpec | None) -> dict[str, int] | None:
    if spec is None:
        return None
    return {k: getattr(spec, k) for k in QUOTA_KINDS}


def _acl_fields(b: AclBinding) -> tuple[str, str, str, str, str, str]:
    return (b.principal, b.resource_type, b.pattern, b.name, b.operation, b.permission)
