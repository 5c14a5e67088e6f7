"""TLS for a broker: the standard library's ssl contexts built from the tls_* settings.

One place turns `tls_cert`, `tls_key`, `tls_ca` and `tls_client_auth` (dmq/config.py) into
the four contexts a broker uses:

- `http_server`: the HTTP API's listener (clients, and other brokers' internal calls);
  it asks for a client certificate as `tls_client_auth` says (Kafka's ssl.client.auth:
  none, optional — checked against the CA when one is sent —, required);
- `http_client`: this broker's calls on other brokers (dmq/peers.py, http_api/forward.py),
  https only, the server checked against `tls_ca` and its address (an IP or DNS
  subject alternative name), and this broker's certificate presented as a client's;
- `raft_server` / `raft_client`: the Raft transport (raft/transport.py, through
  raft/tls.py). Both sides always present and check a certificate signed by `tls_ca`
  (mutual TLS): the Raft port serves brokers only.

TLS 1.2 is the oldest version accepted; the cipher suites are the ssl module's defaults.

Reload (`reload_into`, on SIGHUP: dmq/server.py): the files are read again into the
running contexts, so connections made after it present the new certificate and trust the
CAs of the new `tls_ca` file; connections already open keep theirs. The new files are
checked first by building fresh contexts from them: a file that cannot be read or a key
that does not match leaves every context as it was. A CA only ever adds to a running
context's trust (OpenSSL has no way to drop one): a CA removed from the file stays trusted
until the broker restarts -- which is what a rotation needs anyway (old and new CA trusted
while certificates move from one to the other).
"""

from __future__ import annotations

import ssl
from dataclasses import dataclass

from dmq.config import BrokerConfig
from dmq.errors import InvalidConfig
from raft.tls import RaftTls

CLIENT_AUTH_MODES = {
    "none": ssl.CERT_NONE,
    "optional": ssl.CERT_OPTIONAL,
    "required": ssl.CERT_REQUIRED,
}


@dataclass(frozen=True, slots=True)
class BrokerTls:
    """The contexts of a broker with TLS on (module docstring)."""

    http_server: ssl.SSLContext
    http_client: ssl.SSLContext
    raft: RaftTls


def _load_chain(context: ssl.SSLContext, config: BrokerConfig) -> None:
    try:
        context.load_cert_chain(config.tls_cert, config.tls_key)
    except (OSError, ssl.SSLError) as exc:
        raise InvalidConfig(
            f"cannot load tls_cert {config.tls_cert} with tls_key {config.tls_key}: {exc}",
            field="tls_cert",
        ) from exc


def _load_ca(context: ssl.SSLContext, config: BrokerConfig) -> None:
    try:
        context.load_verify_locations(cafile=config.tls_ca)
    except (OSError, ssl.SSLError) as exc:
        raise InvalidConfig(f"cannot load tls_ca {config.tls_ca}: {exc}", field="tls_ca") from exc


def _server(config: BrokerConfig, verify_mode: ssl.VerifyMode) -> ssl.SSLContext:
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    _load_chain(context, config)
    if verify_mode != ssl.CERT_NONE:
        _load_ca(context, config)
    context.verify_mode = verify_mode
    return context


def _client(config: BrokerConfig) -> ssl.SSLContext:
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)  # check_hostname, CERT_REQUIRED
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    _load_ca(context, config)
    _load_chain(context, config)  # presented when the other broker asks for one
    return context


def reload_into(contexts: tuple[ssl.SSLContext, ...], config: BrokerConfig) -> None:
    """Read the certificate chain and the CA file again into running contexts (module
    docstring). Call `broker_tls(config)` first: it raises on bad files, this does not
    check them again half-way."""
    for context in contexts:
        _load_chain(context, config)
        _load_ca(context, config)


def broker_tls(config: BrokerConfig) -> BrokerTls | None:
    """The contexts for `config`, or None when TLS is off (no tls_cert). Raises
    InvalidConfig naming the setting when a file cannot be read or does not match."""
    if not config.tls_enabled:
        return None
    return BrokerTls(
        http_server=_server(config, CLIENT_AUTH_MODES[config.tls_client_auth]),
        http_client=_client(config),
        raft=RaftTls(server=_server(config, ssl.CERT_REQUIRED), client=_client(config)),
    )
