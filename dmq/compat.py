"""What this release reads and speaks, and how it says that something is too new for it.

Every persistent and wire format of dmq carries a version, and every reader refuses a
version newer than it knows *before it changes a byte* (README.md, "Releases and
upgrading"). The formats themselves are defined where they are read (log/, raft/,
dmq/partition/, ...); this module holds what the broker adds on top:

- the release that wrote a format can only be known for formats this code knows; a newer
  one was written by a newer dmq, so `too_new_message` names this release and the highest
  format it reads, and tells the operator what to do;
- internal HTTP calls between brokers carry `X-Dmq-Version` (the release) and
  `X-Dmq-Internal-Level` (the level of the internal API the caller needs); a broker refuses
  a level above INTERNAL_LEVEL_MAX with 400, naming the caller's release and level, and
  every answer names the answering broker's release, which is how a broker knows the
  others' (GET /v1/cluster). 0.1.0 sends neither header: an answer without one is from 0.1.0,
  the one release before them.

This module imports nothing of the broker: the `dmq` command and the HTTP layer use it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Final

from dmq import __version__

VERSION_HEADER: Final = "X-Dmq-Version"
INTERNAL_LEVEL_HEADER: Final = "X-Dmq-Internal-Level"
# The internal API (/v1/internal/* and the calls brokers make of each other's public
# routes) as 0.1.0 defined it. A release that changes a call in a way an older broker
# would misread raises the level it sends for that call; an older broker then refuses it.
INTERNAL_LEVEL: Final = 1
INTERNAL_LEVEL_MAX: Final = 1
# What every call a broker makes of another carries.
CALL_HEADERS: Final = {VERSION_HEADER: __version__, INTERNAL_LEVEL_HEADER: str(INTERNAL_LEVEL)}
# The release of a peer whose answers carry no X-Dmq-Version header.
RELEASE_WITHOUT_HEADER: Final = "0.1.0"
# How to get back to a state this release can read, said in every refusal.
RESTORE_ADVICE: Final = (
    "upgrade this broker to the release that wrote it, or restore the data directory from a "
    "copy taken before that release first started on it"
)


def too_new_message(what: str, found: int | str, readable_max: int | str) -> str:
    """The one form of "this file (or peer) is newer than I read", e.g.
    "p/raft/journal: journal format 3 was written by a dmq newer than this one; this dmq
    0.2.0 reads journal formats up to 2: upgrade ..."."""
    return (
        f"{what}: format {found} was written by a dmq newer than this one; this dmq "
        f"{__version__} reads formats up to {readable_max}: {RESTORE_ADVICE}"
    )


def release_of(headers: Mapping[str, str]) -> str:
    """The release a broker's answer names (bounded: it is only shown)."""
    return headers.get(VERSION_HEADER, RELEASE_WITHOUT_HEADER)[:40]


def verifies_bound_signatures(release: str | None) -> bool:
    """Whether a peer of `release` (None: not heard from yet) checks the bound form of an
    internal call's signature (dmq/internal_auth.py: nonce and receiver). 0.1.0 knows
    only the plain form and refuses the bound one as a bad signature, so a broker signs
    plainly for a peer it has not heard from or that runs 0.1.0: a rolling upgrade from
    0.1.0 keeps every internal call working, and a cluster of this release binds every
    call from each peer's first answer on."""
    return release is not None and release != RELEASE_WITHOUT_HEADER
