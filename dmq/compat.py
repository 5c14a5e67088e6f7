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

Feature levels (Kafka's finalized features, `metadata.version`): one integer per cluster
saying which formats and rules every broker may rely on. Each release supports a range of
levels, FEATURE_LEVEL_MIN..FEATURE_LEVEL_MAX, and says so on every HTTP answer
(FEATURES_HEADER, "0-1"); 0.1.0 says nothing and supports level 0 only. The cluster's
*finalized* level is replicated state of the metadata catalogue (dmq/metadata/features.py),
0 until an operator raises it; it is raised only once every registered broker's range
holds the target (`laggards`), and never lowered. What each level gates: FEATURE_LEVELS.

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


FEATURES_HEADER: Final = "X-Dmq-Feature-Levels"
FEATURE_LEVEL_MIN: Final = 0
FEATURE_LEVEL_MAX: Final = 1
# A level above this is refused as a mistake (400): levels are small integers, raised
# once per release that changes a format.
FEATURE_LEVEL_LIMIT: Final = 1_000
# What a finalized level turns on, cluster-wide (README.md, "Releases and upgrading").
# Each is something 0.1.0 cannot do, so a cluster at that level has no room for 0.1.0.
FEATURE_LEVELS: Final = {
    0: "0.1.0's formats, commands and calls (a mixed 0.1.0/0.2.0 cluster; rollback possible)",
    1: (
        "every internal call must carry the bound signature (nonce and receiver): plain "
        "ones are refused (401, reason `plain`); a broker whose range excludes the "
        "finalized level is refused as a Raft peer"
    ),
}
# A peer's range as its answers name it: (min, max), inclusive.
LevelRange = tuple[int, int]
RANGE_WITHOUT_HEADER: Final[LevelRange] = (0, 0)  # 0.1.0's


def features_header_value() -> str:
    return f"{FEATURE_LEVEL_MIN}-{FEATURE_LEVEL_MAX}"


def feature_range_of(headers: Mapping[str, str]) -> LevelRange | None:
    """The feature levels a broker's answer says it supports: (0, 0) for an answer
    without the header (0.1.0), None for one that cannot be read."""
    value = headers.get(FEATURES_HEADER)
    if value is None:
        return RANGE_WITHOUT_HEADER
    low, sep, high = value.partition("-")
    if not sep or not (low.isdigit() and high.isdigit()) or len(value) > 20:
        return None
    lo, hi = int(low), int(high)
    return (lo, hi) if lo <= hi else None


def laggards(
    level: int, brokers: Mapping[str, tuple[str | None, LevelRange | None]]
) -> dict[str, str]:
    """node id -> why it cannot run at `level`, for every broker (node id -> its release
    and range, None: not heard from) whose range does not hold `level`. A broker not heard
    from is a laggard: finalizing must not rest on a guess."""
    refused: dict[str, str] = {}
    for node_id, (release, levels) in sorted(brokers.items()):
        if levels is None:
            refused[node_id] = "not reachable: its release and feature levels are unknown"
        elif not levels[0] <= level <= levels[1]:
            refused[node_id] = (
                f"runs dmq {release or 'unknown'}, which supports feature levels "
                f"{levels[0]} to {levels[1]}"
            )
    return refused


def highest_common_level(ranges: list[LevelRange]) -> int | None:
    """The highest level every range holds (None: they share none)."""
    if not ranges:
        return None
    low, high = max(r[0] for r in ranges), min(r[1] for r in ranges)
    return high if low <= high else None


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
