"""Loopback addresses for multi-node runs: one port free on every node's address.

Shared by the benchmarks and the test harnesses (tests may import bench/, not the other
way round). Each node of a local cluster gets its own loopback address (127.0.0.11,
.12, ...), as the fault harness wants, and all of them the same port.
"""

from __future__ import annotations

import socket
from collections.abc import Iterable, Sequence

PORT_TRIES_MAX = 200


def common_free_port(hosts: Sequence[str], avoid: Iterable[int] = ()) -> int:
    """A port free on every address in `hosts`, not in `avoid` (checked by binding: the
    OS could still hand it to someone else before the caller binds it)."""
    avoided = set(avoid)
    for _ in range(PORT_TRIES_MAX):
        with socket.socket() as probe:
            probe.bind((hosts[0], 0))
            port = int(probe.getsockname()[1])
        if port in avoided:
            continue
        try:
            for host in hosts[1:]:
                with socket.socket() as other:
                    other.bind((host, port))
            return port
        except OSError:
            continue
    raise RuntimeError(f"no free port common to {', '.join(hosts)}")
