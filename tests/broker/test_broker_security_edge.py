"""Proves dmq/broker/security.py's defences against password guessing, without a broker:

- an unknown user costs the same scrypt work as a known user with a wrong password (one
  derivation with the parameters every user is created with), so the time of a refusal
  does not tell whether a user exists;
- one client address may have at most `auth_checks_per_address_max` password checks
  under way or queued: the next is 429 naming the limit, while another address is
  served, and the address's count goes back to 0 once its checks finish.
"""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any, cast

import pytest

from dmq import errors
from dmq.broker import security
from dmq.broker.security import SCRYPT_N, SecurityService
from dmq.config import BrokerConfig
from dmq.metadata.state import MetadataState, SecurityState, UserCredential


def _service(users: dict[str, UserCredential], **config: Any) -> SecurityService:
    state = MetadataState(security=SecurityState(users=users))
    ctx = SimpleNamespace(
        config=BrokerConfig(auth="on", **config), metadata=SimpleNamespace(state=state)
    )
    return SecurityService(cast(Any, ctx))


def _alice() -> UserCredential:
    salt = b"salt-salt-salt-1"
    key = security.derive_key("alice-pass", salt, SCRYPT_N, 8, 1)
    return UserCredential(salt.hex(), key.hex(), SCRYPT_N, 8, 1, 0)


def test_unknown_users_cost_the_same_scrypt_as_known_ones(monkeypatch: pytest.MonkeyPatch) -> None:
    service = _service({"alice": _alice()})
    derivations: list[tuple[str, int]] = []
    real = security.derive_key

    def counted(password: str, salt: bytes, n: int, r: int, p: int) -> bytes:
        derivations.append((password, n))
        return real(password, salt, n, r, p)

    monkeypatch.setattr(security, "derive_key", counted)

    async def refused(header: str) -> str:
        with pytest.raises(errors.Unauthenticated) as exc:
            await service.authenticate(header, "10.0.0.1")
        return exc.value.message

    async def scenario() -> None:
        known = await refused("Bearer alice:wrong-pass")
        unknown = await refused("Bearer mallory:wrong-pass")
        assert known == unknown  # the same words too
        assert derivations == [("wrong-pass", SCRYPT_N), ("wrong-pass", SCRYPT_N)]

    asyncio.run(scenario())


def test_password_checks_per_address_are_bounded() -> None:
    service = _service({"alice": _alice()}, auth_checks_per_address_max=2)

    async def attempt(password: str, address: str) -> str:
        try:
            await service.authenticate(f"Bearer alice:{password}", address)
        except errors.Unauthenticated:
            return "401"
        except errors.Backpressure as exc:
            assert exc.details["limit"] == 2
            assert exc.details["field"] == "auth_checks_per_address_max"
            return "429"
        return "200"

    async def scenario() -> None:
        guesses = [attempt(f"guess-{i}", "10.0.0.66") for i in range(4)]
        results = await asyncio.gather(*guesses, attempt("alice-pass", "10.0.0.7"))
        assert sorted(results[:4]) == ["401", "401", "429", "429"], results
        assert results[4] == "200"
        assert service._checks == {}  # every check finished and was counted down
        assert service.report()["refused"]["password_checks"] == 2
        assert await attempt("guess-9", "10.0.0.66") == "401"  # served again

    asyncio.run(scenario())
