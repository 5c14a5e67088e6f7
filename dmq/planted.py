"""Planted bugs: deliberate faults the Jepsen harness (jepsen/) must catch.

A planted bug is off unless the environment variable `DMQ_PLANTED_BUG` names it when the
broker starts (`python -m jepsen.run --planted-bug NAME` sets it on every broker it
starts). Each hook in the broker is one or two lines that call `active(NAME)`; with the
variable unset they change nothing. Never set it outside the harness.

| name | hook | what goes wrong |
|---|---|---|
| `ack-before-commit` | dmq/partition/replica.py `append` | acks=all answers once the leader's own journal has the entry (without an offset, as acks=1), before a majority does: a failover loses acknowledged records |
| `no-fsync` | dmq/broker/broker.py `raft_config_for` | the Raft journals are never fdatasync'ed (as `--raft-durability none`, whatever the flag says): a power loss drops acknowledged records |
| `stale-read` | dmq/broker/routing.py `serving_replica` | any broker with a replica serves fetches from it, even a follower that is behind or cut off: reads miss acknowledged records |
| `lease-read` | dmq/broker/fetch.py `_serving`, dmq/broker/routing.py `_lease_read` | every read (fetch, offsets) skips the ReadIndex confirmation and is answered from a lease: a leader that heard from a majority lately holds it for two election timeouts (the step-down time before check-quorum) and answers while it lasts, even cut off, paused or stepped down meanwhile: the others elect a new leader after one election timeout, and the old one answers a high watermark older than a write the new leader acknowledged |
| `fetch-off-by-one` | dmq/broker/fetch.py `fetch` | a fetch from offset o > 0 reads from o + 1: one record is skipped |
| `share-double-delivery` | dmq/broker/share.py `_deliveries` | a share-group poll answers every fresh record it read, not only those its AcquireRecords locked: two members get the same record at once |
| `delay-early` | dmq/broker/delay.py `release_loop` | the release duty believes it is 2 s later than it is: delayed records are appended up to 2 s before their deliver_at |
| `txn-partial-markers` | dmq/broker/transactions.py `_finish` | a commit's marker is written to the transaction's first partition only, yet the transaction is completed: the others keep its records open (never visible to read_committed), a non-atomic commit |
| `read-committed-leak` | dmq/broker/transactions.py `read_committed` | read_committed reads up to the high watermark, ignoring the LSO: records of open transactions (later aborted, or not yet committed) are served |
| `tiered-delete-before-upload` | dmq/partition/replica.py `_delete_uploaded` | local retention of a tiered topic deletes closed segments past local retention as if every one below the high watermark were uploaded, without waiting for the committed remote `add`: a segment deleted before the leader's next upload round (every `remote_upload_interval_ms`) is gone from every replica and never reaches the object store, and acknowledged records with it |
| `volatile-offsets` | dmq/broker/groups.py `commit`, `committed`, `fetch` | a commit is acknowledged once it is in the answering broker's memory (`volatile_commit`), never proposed to the metadata group: a restart or a new metadata leader forgets it |
"""

from __future__ import annotations

import os
from collections.abc import Mapping

PLANTED_BUG_ENV = "DMQ_PLANTED_BUG"

PLANTED_BUGS: tuple[str, ...] = (
    "ack-before-commit",
    "delay-early",
    "fetch-off-by-one",
    "lease-read",
    "no-fsync",
    "read-committed-leak",
    "share-double-delivery",
    "stale-read",
    "tiered-delete-before-upload",
    "txn-partial-markers",
    "volatile-offsets",
)

# Read once: the harness sets the variable before the broker process starts.
_ACTIVE = os.environ.get(PLANTED_BUG_ENV, "")


def active(name: str) -> bool:
    """True if the planted bug `name` is switched on in this process."""
    if name not in PLANTED_BUGS:
        raise ValueError(f"unknown planted bug {name!r}; known: {', '.join(PLANTED_BUGS)}")
    return name == _ACTIVE


# volatile-offsets: (group, topic, partition) -> offset, in this process only.
_VOLATILE: dict[tuple[str, str, int], int] = {}


def volatile_commit(group: str, offsets: tuple[tuple[str, int, int], ...]) -> bool:
    """With volatile-offsets on: keep the commit in memory only and return True (the
    caller acknowledges it without proposing it); else False."""
    if not active("volatile-offsets"):
        return False
    _VOLATILE.update(((group, t, p), o) for t, p, o in offsets)
    return True


def volatile_view(
    group: str, committed: Mapping[tuple[str, int], int]
) -> Mapping[tuple[str, int], int]:
    """The committed offsets as the buggy broker sees them: its memory over the state.
    With the bug off nothing is ever kept, and `committed` is returned as it is (no copy
    on the group fetch's path)."""
    if not _VOLATILE:
        return committed
    found = dict(committed)
    found.update(((t, p), o) for (g, t, p), o in _VOLATILE.items() if g == group)
    return found
