"""TLS for the Raft transport: the two contexts a node's Network wraps its sockets with.

raft/ builds no context itself (it knows no certificate files or settings): the caller
passes ready `ssl.SSLContext`s. With them, every connection runs a TLS handshake right
after TCP connects, before raft/auth.py's challenge and hello, and every frame after it
is encrypted. The server context should require a client certificate (mutual TLS), so
that only holders of a certificate of the cluster's CA reach the hello at all; the
client context checks the peer's certificate against the peer's address as it appears
in the peers map (an IP address or a DNS name of the certificate).
"""

from __future__ import annotations

import ssl
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class RaftTls:
    server: ssl.SSLContext  # wraps accepted connections
    client: ssl.SSLContext  # wraps connections this node opens
