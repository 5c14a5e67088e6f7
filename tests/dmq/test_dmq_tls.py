"""Proves the TLS settings' checks and the contexts built from them (dmq/config.py,
dmq/tls.py, dmq/client/_tls.py, dmq/dev_certs.py), without processes:

- tls_cert and tls_key go together, tls_cert needs tls_ca, tls_ca and tls_client_auth
  need tls_cert, tls_client_auth is none|optional|required: each refused naming the field;
- an unreadable or mismatched file is an InvalidConfig naming the setting, at start;
- broker_tls: None with TLS off; the HTTP listener asks for client certificates as
  tls_client_auth says, the Raft listener always requires one, the peers' client checks
  the server's certificate and name;
- the client's context comes from DMQ_CA/DMQ_CERT/DMQ_KEY only when one is set;
- `dmq cert dev` refuses to overwrite its files unless --force, and its broker certificate
  names every host given.
"""

from __future__ import annotations

import ipaddress
import ssl
from pathlib import Path

import pytest
from cryptography import x509

from dmq import cli
from dmq.client._tls import tls_from_env
from dmq.config import BrokerConfig, load_config
from dmq.dev_certs import write_dev_certs
from dmq.errors import InvalidConfig
from dmq.tls import broker_tls


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_dev_certs(tmp_path_factory.mktemp("certs"), ["127.0.0.1", "localhost"]).ca.parent


def _tls(certs: Path, **extra: str) -> dict[str, str]:
    return {
        "tls_cert": str(certs / "broker.pem"),
        "tls_key": str(certs / "broker-key.pem"),
        "tls_ca": str(certs / "ca.pem"),
        **extra,
    }


@pytest.mark.parametrize(
    ("settings", "field"),
    [
        ({"tls_cert": "c.pem"}, "tls_key"),
        ({"tls_key": "k.pem"}, "tls_cert"),
        ({"tls_cert": "c.pem", "tls_key": "k.pem"}, "tls_ca"),
        ({"tls_ca": "ca.pem"}, "tls_ca"),
        ({"tls_client_auth": "required"}, "tls_client_auth"),
        (
            {"tls_cert": "c", "tls_key": "k", "tls_ca": "a", "tls_client_auth": "yes"},
            "tls_client_auth",
        ),
    ],
)
def test_inconsistent_tls_settings_are_refused_naming_the_field(
    settings: dict[str, str], field: str
) -> None:
    with pytest.raises(InvalidConfig) as caught:
        load_config(settings, environ={})
    assert caught.value.details["field"] == field


def test_unreadable_files_are_refused_naming_the_setting(certs: Path, tmp_path: Path) -> None:
    with pytest.raises(InvalidConfig) as caught:
        broker_tls(BrokerConfig(**_tls(certs, tls_key=str(certs / "client-key.pem"))))
    assert caught.value.details["field"] == "tls_cert"  # the key of another certificate
    with pytest.raises(InvalidConfig) as caught:
        broker_tls(BrokerConfig(**_tls(certs, tls_ca=str(tmp_path / "missing.pem"))))
    assert caught.value.details["field"] == "tls_ca"


@pytest.mark.parametrize(
    ("mode", "verify"),
    [("none", ssl.CERT_NONE), ("optional", ssl.CERT_OPTIONAL), ("required", ssl.CERT_REQUIRED)],
)
def test_contexts_follow_the_settings(certs: Path, mode: str, verify: ssl.VerifyMode) -> None:
    assert broker_tls(BrokerConfig()) is None
    config = load_config(_tls(certs, tls_client_auth=mode), environ={})
    assert config.http_scheme == "https"
    tls = broker_tls(config)
    assert tls is not None
    assert tls.http_server.verify_mode == verify
    assert tls.raft.server.verify_mode == ssl.CERT_REQUIRED
    for client in (tls.http_client, tls.raft.client):
        assert client.verify_mode == ssl.CERT_REQUIRED and client.check_hostname


def test_client_context_from_the_environment(certs: Path) -> None:
    assert tls_from_env({}) is None
    context = tls_from_env({"DMQ_CA": str(certs / "ca.pem")})
    assert context is not None and context.verify_mode == ssl.CERT_REQUIRED
    with_cert = tls_from_env(
        {"DMQ_CERT": str(certs / "client.pem"), "DMQ_KEY": str(certs / "client-key.pem")}
    )
    assert with_cert is not None


def test_cert_dev_names_every_host_and_keeps_existing_files(tmp_path: Path) -> None:
    hosts = "127.0.0.11,127.0.0.12,broker.local"
    assert cli.main(["cert", "dev", "--dir", str(tmp_path), "--hosts", hosts]) == 0
    cert = x509.load_pem_x509_certificate((tmp_path / "broker.pem").read_bytes())
    names = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert set(names.get_values_for_type(x509.IPAddress)) == {
        ipaddress.ip_address("127.0.0.11"),
        ipaddress.ip_address("127.0.0.12"),
    }
    assert names.get_values_for_type(x509.DNSName) == ["broker.local"]
    before = (tmp_path / "ca.pem").read_bytes()
    assert cli.main(["cert", "dev", "--dir", str(tmp_path)]) == 2  # exists: refused
    assert (tmp_path / "ca.pem").read_bytes() == before
    assert cli.main(["cert", "dev", "--dir", str(tmp_path), "--force"]) == 0
    assert (tmp_path / "ca.pem").read_bytes() != before
