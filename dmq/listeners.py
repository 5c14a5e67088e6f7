"""What a broker says when one of its listeners cannot take its address.

`[Errno 98] Address already in use` alone left the operator to guess which of the
broker's addresses (HTTP or Raft) was taken; `bind_error` names the listener, the
address, the setting that chose it and what to do.
"""

from __future__ import annotations

import errno
import os

# errno -> what it means for a listening address, and what to do.
_REMEDIES = {
    errno.EADDRINUSE: "another process listens there (`ss -ltnp` names it): stop it, "
    "or give this broker another port with {flag}",
    errno.EADDRNOTAVAIL: "no network interface of this machine has that address: "
    "choose one it has with {flag} (127.0.0.1 for this machine only)",
    errno.EACCES: "ports below 1024 need privileges: choose a higher one with {flag}",
}


def bind_error(listener: str, addr: str, flag: str, exc: OSError) -> OSError | None:
    """The OSError to report for `listener` (e.g. "HTTP") failing to bind `addr`, chosen
    by `flag`; None when `exc` is not an error of binding an address."""
    remedy = _REMEDIES.get(exc.errno or 0)
    if remedy is None:
        return None
    reason = os.strerror(exc.errno or 0)  # asyncio's strerror repeats the address
    return OSError(
        exc.errno,
        f"the {listener} listener cannot bind {addr} ({flag}): {reason}; "
        + remedy.format(flag=flag),
    )
