"""One group's pysyncobj object, and what raft/ does around pysyncobj 0.3.17's internals.

`GroupSyncObj` is the SyncObj of every group: its one `@replicated` method applies a batch
of commands (one Raft entry, raft/proposals.py) to the group's StateMachine. The helpers
below read or patch private names of pysyncobj 0.3.17 (the version is pinned in
pyproject.toml): the election no-op a leader must apply before it serves reads, a step
down to a later term that pysyncobj's own messages never tell a leader of, and the file
descriptors SyncObj leaves open when it is destroyed or drops a snapshot transfer.
raft/README.md ("What raft/ changes in pysyncobj") lists each of them with its reason.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable
from typing import Any

from pysyncobj import SyncObj, replicated
from pysyncobj.syncobj import _RAFT_STATE

from raft import safe_pickle
from raft.types import StateMachine

# pysyncobj unpickles its log commands itself: only through the restricted unpickler. Set
# here, beside the only subclass of SyncObj raft/ runs, so no group exists without it.
safe_pickle.guard_pysyncobj()


def leader_ready(sync_obj: SyncObj) -> bool:
    """Leader, and its election no-op (pysyncobj's private index of it) is applied."""
    noop = sync_obj._SyncObj__noopIDx
    return bool(sync_obj._isLeader()) and noop is not None and sync_obj.raftLastApplied >= noop


def become_follower_at(sync_obj: SyncObj, term: int) -> bool:
    """Raft's rule for a message of a later term (raft/higher_term.py, step 2), which
    pysyncobj applies itself to request_vote and append_entries only: take `term` with no
    vote, become a follower, follow no leader. Forwarded commands waiting on the old leader
    fail LEADER_CHANGED, as in pysyncobj's own campaign. True if it followed or was a
    leader (the caller settles what that leader held)."""
    had_leader = sync_obj._SyncObj__raftLeader is not None
    sync_obj._SyncObj__setCurrentTerm(term, None)  # the journal's meta: synced this round
    sync_obj._SyncObj__setState(_RAFT_STATE.FOLLOWER)
    if had_leader:
        sync_obj._SyncObj__raftLeader = None
        sync_obj._SyncObj__onLeaderChanged()
    return had_leader


class GroupSyncObj(SyncObj):  # type: ignore[misc]  # pysyncobj is untyped
    """A SyncObj whose one replicated method applies a batch of commands to a StateMachine."""

    def __init__(self, machine: StateMachine, *args: Any, **kwargs: Any) -> None:
        self._machine = machine
        super().__init__(*args, **kwargs)

    @replicated  # type: ignore[untyped-decorator]
    def _apply_batch(self, commands: list[bytes]) -> list[Any]:
        # A machine with `apply_at(index, position, command)` is told where each command
        # sits in the Raft log (dmq/partition/machine.py skips what it applied before a restart).
        # pysyncobj raises raftLastApplied only after the entry's apply returns.
        apply_at = getattr(self._machine, "apply_at", None)
        if apply_at is None:
            return [self._machine.apply(command) for command in commands]
        index = self.raftLastApplied + 1
        return [apply_at(index, k, command) for k, command in enumerate(commands)]


def close_pysyncobj_files(sync_obj: Any) -> None:
    """Close what SyncObj.destroy() leaves open in pysyncobj 0.3.17 with autoTick=False.

    Its notifier pipe pair, and a snapshot being sent or received: harmless at process exit,
    a leak of two or more descriptors per remove_group otherwise. Private names: the
    version is pinned.
    """
    notifier = getattr(sync_obj, "_SyncObj__pipeNotifier", None)
    if notifier is not None:
        pipe_r = notifier._PipeNotifier__pipeR
        sync_obj._poller.unsubscribe(pipe_r)
        for fd in (pipe_r, notifier._PipeNotifier__pipeW):
            with contextlib.suppress(OSError):
                os.close(fd)
    serializer = sync_obj._SyncObj__serializer
    incoming = serializer._Serializer__incomingTransmissionFile
    if incoming is not None and not isinstance(incoming, bytes):  # bytes: in-memory mode
        incoming.close()
        serializer._Serializer__incomingTransmissionFile = None
    for transmission in serializer._Serializer__transmissions.values():
        file = transmission.get("file")
        if file is not None:
            file.close()
    serializer._Serializer__transmissions.clear()


def close_dropped_transfers(serializer: Any) -> None:
    """Make pysyncobj 0.3.17's Serializer close the snapshot files it drops.

    A leader opens its snapshot file once per follower it sends it to, and forgets it
    unclosed when the transfer ends, is cancelled, or a new snapshot resets the transfers:
    a descriptor leaked per transfer until the garbage collector (and a ResourceWarning).
    Each of the three methods that drop transfers is wrapped to close what it dropped.
    """

    def closing(method: Callable[..., Any]) -> Callable[..., Any]:
        def call(*args: Any) -> Any:
            before: dict[Any, dict[str, Any]] = serializer._Serializer__transmissions
            if not before:  # the usual case (checkSerializing runs in every tick)
                return method(*args)
            files = [t["file"] for t in before.values() if "file" in t]
            try:
                return method(*args)
            finally:
                kept = {id(t.get("file")) for t in serializer._Serializer__transmissions.values()}
                for file in files:
                    if id(file) not in kept:
                        file.close()

        return call

    for name in ("getTransmissionData", "checkSerializing", "cancelTransmisstion"):
        setattr(serializer, name, closing(getattr(serializer, name)))
