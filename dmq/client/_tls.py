"""TLS of the client: which certificates it trusts and which it presents.

An `https://` URL is checked against the system's CAs unless a CA file is given: the
`tls=` argument of every client class (an `ssl.SSLContext`, e.g. from `tls_context`), else
the environment (`DMQ_CA`, `DMQ_CERT`, `DMQ_KEY`), which also reaches the clients built
inside the CLI and spark_io. A broker with `tls_client_auth = required` refuses a client
that presents no certificate signed by its CA: give `cert_file` and `key_file`.
"""

from __future__ import annotations

import os
import ssl
from collections.abc import Mapping

ENV_CA = "DMQ_CA"  # PEM file of the CA(s) that sign the brokers' certificates
ENV_CERT = "DMQ_CERT"  # PEM client certificate, presented when a broker asks for one
ENV_KEY = "DMQ_KEY"  # its private key (else the key is read from the DMQ_CERT file)


def tls_context(
    ca_file: str | None = None, cert_file: str | None = None, key_file: str | None = None
) -> ssl.SSLContext:
    """A client context: the broker's certificate checked against `ca_file` (else the
    system's CAs) and its address; `cert_file`/`key_file` presented when asked for."""
    context = ssl.create_default_context(cafile=ca_file or None)
    if cert_file:
        context.load_cert_chain(cert_file, key_file or None)
    elif key_file:
        raise ValueError("key_file needs cert_file")
    return context


def tls_from_env(environ: Mapping[str, str] | None = None) -> ssl.SSLContext | None:
    """The context DMQ_CA, DMQ_CERT and DMQ_KEY describe; None when none is set."""
    env = os.environ if environ is None else environ
    ca, cert, key = env.get(ENV_CA), env.get(ENV_CERT), env.get(ENV_KEY)
    if not (ca or cert or key):
        return None
    return tls_context(ca, cert, key)
