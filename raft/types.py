"""The value types raft/ shares between its modules: what a group replicates (StateMachine)
and what a replica reports (ReplicaStatus).

They sit in a module of their own, with no behaviour and no import of the rest of raft/,
so that every module (the replica, the node loop, the pysyncobj glue, the demo) can name
them without importing the module that hosts the others.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol


class StateMachine(Protocol):
    """What a group replicates. apply() must be deterministic: same commands, same state.

    apply() runs on the tick thread, in log order, once per committed command, on every
    replica; it must not raise (an exception stops the node: replicas would diverge), nor
    should restore() (it stops the node too: the state would be half-restored).
    snapshot() / restore() serialise the whole state for log compaction and for followers
    that fell behind the leader's compacted log.
    """

    def apply(self, command: bytes) -> Any: ...

    def snapshot(self) -> bytes: ...

    def restore(self, snapshot: bytes) -> None: ...


@dataclass(frozen=True, slots=True)
class ReplicaStatus:
    group_id: int
    node_id: str
    is_leader: bool
    leader_id: str | None
    term: int
    commit_index: int
    last_applied: int
    journal_entries: int
    # A leader has applied the no-op pysyncobj appends when it is elected: only then does
    # its state hold every entry committed before its term (Raft dissertation 6.4, the
    # first step of a read). Before, its high watermark may lag what the previous leader
    # acknowledged (a stale read jepsen/ found at leadership transfers).
    leader_ready: bool = False
