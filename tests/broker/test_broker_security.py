"""Proves the pieces of dmq/broker/security.py without a broker process:

- `parse_authorization` reads Bearer and Basic, refuses anything else (401 `malformed`);
- `CredentialCache` keeps at most its bound (least recently used out first), and an entry
  answers only for the very credential object it was checked against (a changed
  password or a deleted user misses);
- `SecurityService.authenticate`: the superuser token (a ':' in it too) bypasses users;
  a user's password is checked once by scrypt, then from the cache; a wrong one is
  refused and cached too; a changed password is checked again.
"""

from __future__ import annotations

import asyncio
import base64
from dataclasses import replace
from types import SimpleNamespace
from typing import Any, cast

import pytest

from dmq import errors
from dmq.broker.security import CredentialCache, SecurityService, derive_key, parse_authorization
from dmq.config import BrokerConfig
from dmq.metadata.state import MetadataState, SecurityState, UserCredential


def test_parse_authorization() -> None:
    assert parse_authorization("Bearer alice:pw:x") == ("alice", "pw:x", "alice:pw:x")
    assert parse_authorization("bearer tok") == ("tok", "", "tok")
    basic = "Basic " + base64.b64encode(b"bob:secret").decode()
    assert parse_authorization(basic) == ("bob", "secret", None)
    for bad in ("Digest x", "Bearer", "Basic !!!", "Basic " + base64.b64encode(b"nocolon").decode(),
                "Bearer " + "x" * 5000):  # fmt: skip
        with pytest.raises(errors.Unauthenticated) as refused:
            parse_authorization(bad)
        assert refused.value.details["reason"] == "malformed"


def _credential(password: str, salt: bytes = b"salt-salt-salt-1") -> UserCredential:
    key = derive_key(password, salt, 2**10, 8, 1)  # small N: a unit test
    return UserCredential(salt.hex(), key.hex(), 2**10, 8, 1, 0)


def test_cache_is_bounded_and_follows_the_credential() -> None:
    cache = CredentialCache(entries_max=2, ttl_ms=60_000)
    c1, c2 = _credential("one-password"), _credential("two-password")
    for k in (b"a", b"b", b"c"):
        cache.put(k, c1, True)
    assert len(cache) == 2 and cache.get(b"a", c1) is None  # the oldest went first
    assert cache.get(b"c", c1) is True
    assert cache.get(b"c", c2) is None  # another credential object: checked again
    assert cache.get(b"c", None) is None  # the user was deleted


def _service(monkeypatch: pytest.MonkeyPatch, users: dict[str, UserCredential]) -> Any:
    monkeypatch.setenv("DMQ_SUPERUSER_TOKEN", "super:token:with:colons")
    state = MetadataState(security=SecurityState(users=users))
    metadata = SimpleNamespace(state=state)
    ctx = SimpleNamespace(config=BrokerConfig(auth="on"), metadata=metadata)
    return SecurityService(cast(Any, ctx)), metadata


def test_authenticate_superuser_users_and_the_cache(monkeypatch: pytest.MonkeyPatch) -> None:
    service, metadata = _service(monkeypatch, {"alice": _credential("alice-pass")})

    async def scenario() -> None:
        su = await service.authenticate("Bearer super:token:with:colons")
        assert su.superuser
        alice = await service.authenticate("Bearer alice:alice-pass")
        assert str(alice) == "User:alice" and not alice.superuser
        await service.authenticate("Basic " + base64.b64encode(b"alice:alice-pass").decode())
        assert await service.authenticate("Bearer alice:alice-pass") == alice
        assert service.cache.hits == 1 and service.cache.misses == 2  # two header forms
        for _ in range(2):
            with pytest.raises(errors.Unauthenticated):
                await service.authenticate("Bearer alice:wrong-pass")
        assert service.cache.hits == 2  # the refusal was cached too
        changed = {"alice": _credential("new-password", b"salt-salt-salt-2")}
        metadata.state = replace(metadata.state, security=SecurityState(users=changed))
        with pytest.raises(errors.Unauthenticated):
            await service.authenticate("Bearer alice:alice-pass")  # the old one, refused
        assert (await service.authenticate("Bearer alice:new-password")).name == "alice"
        with pytest.raises(errors.Unauthenticated) as missing:
            await service.authenticate(None)
        assert missing.value.details["reason"] == "missing"

    asyncio.run(scenario())
