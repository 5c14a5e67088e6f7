"""`dmq cert dev`: a self-signed CA and the certificates of a local cluster, for development.

Writes, in one directory (keys readable by their owner only):

- `ca.pem` / `ca-key.pem`: a CA valid `days` days, the `tls_ca` of every broker and the
  `--ca` / `DMQ_CA` of every client;
- `broker.pem` / `broker-key.pem`: one certificate for every broker of the cluster, its
  subject alternative names the `hosts` given (IP addresses and DNS names: a broker is
  checked against the address other brokers and clients use), usable as a server's and
  as a client's (brokers present it to each other: the Raft port is mutual TLS);
- `client.pem` / `client-key.pem`: a client certificate, for brokers with
  `tls_client_auth = optional | required`.

EC P-256 keys and SHA-256 signatures: quick to make and to check. Not for production:
the CA's key sits next to the certificates it signed.
"""

from __future__ import annotations

import datetime
import ipaddress
import os
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

DAYS_DEFAULT = 365
HOSTS_DEFAULT = ("127.0.0.1", "localhost")
FILES = ("ca.pem", "ca-key.pem", "broker.pem", "broker-key.pem", "client.pem", "client-key.pem")

PrivateKey = ec.EllipticCurvePrivateKey


@dataclass(frozen=True, slots=True)
class DevCerts:
    ca: Path
    broker_cert: Path
    broker_key: Path
    client_cert: Path
    client_key: Path


def _name(common_name: str) -> x509.Name:
    return x509.Name(
        [
            x509.NameAttribute(NameOID.ORGANIZATION_NAME, "dmq development"),
            x509.NameAttribute(NameOID.COMMON_NAME, common_name),
        ]
    )


def _alt_name(host: str) -> x509.GeneralName:
    try:
        return x509.IPAddress(ipaddress.ip_address(host))
    except ValueError:
        return x509.DNSName(host)


def _builder(
    subject: str, issuer: x509.Name, key: PrivateKey, days: int
) -> x509.CertificateBuilder:
    now = datetime.datetime.now(datetime.UTC)
    return (
        x509.CertificateBuilder()
        .subject_name(_name(subject))
        .issuer_name(issuer)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))  # clocks a little apart
        .not_valid_after(now + datetime.timedelta(days=days))
    )


def _leaf(
    subject: str,
    usages: list[x509.ObjectIdentifier],
    hosts: list[str],
    ca_cert: x509.Certificate,
    ca_key: PrivateKey,
    days: int,
) -> tuple[x509.Certificate, PrivateKey]:
    key = ec.generate_private_key(ec.SECP256R1())
    builder = (
        _builder(subject, ca_cert.subject, key, days)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage(usages), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()),
            critical=False,
        )
    )
    if hosts:
        builder = builder.add_extension(
            x509.SubjectAlternativeName([_alt_name(h) for h in hosts]), critical=False
        )
    return builder.sign(ca_key, hashes.SHA256()), key


def _write(path: Path, data: bytes, *, private: bool) -> None:
    flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC
    fd = os.open(path, flags, 0o600 if private else 0o644)
    with os.fdopen(fd, "wb") as out:
        out.write(data)


def _key_pem(key: PrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


def _cert_pem(cert: x509.Certificate) -> bytes:
    return cert.public_bytes(serialization.Encoding.PEM)


def write_dev_certs(
    directory: Path, hosts: list[str], *, days: int = DAYS_DEFAULT, force: bool = False
) -> DevCerts:
    """Write the six files (module docstring) into `directory`. FileExistsError if one
    is there already, unless `force`; ValueError for no hosts or days < 1."""
    if not hosts:
        raise ValueError("name at least one host (an IP address or DNS name)")
    if days < 1:
        raise ValueError("days must be >= 1")
    directory.mkdir(parents=True, exist_ok=True)
    taken = [name for name in FILES if (directory / name).exists()]
    if taken and not force:
        raise FileExistsError(f"{directory / taken[0]} exists (--force replaces it)")
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_cert = (
        _builder("dmq development CA", _name("dmq development CA"), ca_key, days)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), False)
        .sign(ca_key, hashes.SHA256())
    )
    server_and_client = [ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]
    broker_cert, broker_key = _leaf("dmq broker", server_and_client, hosts, ca_cert, ca_key, days)
    client_cert, client_key = _leaf(
        "dmq client", [ExtendedKeyUsageOID.CLIENT_AUTH], [], ca_cert, ca_key, days
    )
    out = DevCerts(
        ca=directory / "ca.pem",
        broker_cert=directory / "broker.pem",
        broker_key=directory / "broker-key.pem",
        client_cert=directory / "client.pem",
        client_key=directory / "client-key.pem",
    )
    _write(out.ca, _cert_pem(ca_cert), private=False)
    _write(directory / "ca-key.pem", _key_pem(ca_key), private=True)
    _write(out.broker_cert, _cert_pem(broker_cert), private=False)
    _write(out.broker_key, _key_pem(broker_key), private=True)
    _write(out.client_cert, _cert_pem(client_cert), private=False)
    _write(out.client_key, _key_pem(client_key), private=True)
    return out
