"""Which peers a node refuses now, and why: a rule its caller sets (raft/ knows none).

raft/ authenticates a peer (raft/auth.py) but cannot know whether its software may take
part: dmq refuses a broker whose release cannot run at the cluster's finalized feature
level (dmq/compat.py), which it learns over HTTP, not from the hello (0.1.0's hello and
this release's are the same bytes). The transport asks `check(peer_id)` at every hello and
every maintain() round; while a peer is refused, both directions of its link stay closed.
One warning when a peer starts being refused, one info line when it no longer is: the
check runs every round and must not flood the log.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

logger = logging.getLogger(__name__)


class PeerRefusals:
    """`rule(peer_id)`: why that peer may not be one now, or None. Called on the Raft
    tick thread; the caller replaces `rule` with one reference assignment."""

    def __init__(self) -> None:
        self.rule: Callable[[str], str | None] = lambda peer_id: None
        self._refused: set[str] = set()

    def check(self, peer_id: str) -> str | None:
        reason = self.rule(peer_id)
        if reason is None and peer_id in self._refused:
            self._refused.discard(peer_id)
            logger.info("peer %s is no longer refused", peer_id)
        elif reason is not None and peer_id not in self._refused:
            self._refused.add(peer_id)
            logger.warning("refusing peer %s: %s", peer_id, reason)
        return reason
