"""Loopback addresses for multi-node runs: one port free on every node's address.

Shared by the benchmarks and the test harnesses (tests may import bench/, not the other
way round). Each node of a local cluster gets its own loopback address (127.0.0.11,
.12, ...), as the fault harness wants, and all of them the same port.
"""

from __future__ import annotations

import contextlib
import random
import socket
from collections.abc import Iterable, Sequence
from pathlib import Path

PORT_TRIES_MAX = 200
PORT_FLOOR = 10_000  # ports are drawn from here up to the kernel's ephemeral range


def ephemeral_low() -> int:
    """The first port of the kernel's ephemeral range (outgoing connections and bind to
    port 0 take theirs from it); 32768 where it cannot be read."""
    with contextlib.suppress(OSError, ValueError, IndexError):
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    return 32_768


def common_free_port(hosts: Sequence[str], avoid: Iterable[int] = ()) -> int:
    """A port free on every address in `hosts`, not in `avoid`, drawn below the kernel's
    ephemeral range (checked by binding). The broker binds it moments later: a port from
    the ephemeral range (bind to 0) could meanwhile become the local end of any outgoing
    connection on the machine, and a loaded test run saw a broker exit with "Address
    already in use"; below the range only another draw can take it."""
    avoided = set(avoid)
    low = ephemeral_low()
    for _ in range(PORT_TRIES_MAX):
        port = random.randrange(PORT_FLOOR, low)  # noqa: S311 - a port, not a secret
        if port in avoided:
            continue
        try:
            for host in hosts:
                with socket.socket() as other:
                    other.bind((host, port))
            return port
        except OSError:
            continue
    raise RuntimeError(f"no free port common to {', '.join(hosts)}")
