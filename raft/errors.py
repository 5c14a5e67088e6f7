"""Errors raised by raft/ at its border: pysyncobj's FAIL_REASON codes never leave the package.

raft/ may not import dmq/, so its branch of dmq's error tree lives here (as log/'s does in
log/errors.py) and the Broker translates it into dmq/errors.py at its own border::

    RaftError
    ├── NotApplied                  the command is certainly not in the log: retrying is safe
    │   ├── NotLeader               no leader known, or the node asked is not the leader;
    │   │                           `leader_id` / `leader_address` name the leader if known
    │   ├── QueueFull               a bounded proposal queue is full (backpressure)
    │   ├── Discarded               a new leader overwrote the entry before it committed
    │   └── RequestDenied           pysyncobj refused the command (e.g. membership change)
    ├── OutcomeUnknown              the command may or may not commit: do not blindly retry
    │   └── Timeout                 no answer within the deadline
    ├── CommandTooLarge             the command is over batch_bytes_max (the caller's fault)
    ├── ReplicaStopped              the node or group is shutting down (or crashed)
    │   └── StoppedInFlight         ... after the command reached pysyncobj: it may still
    │                               commit on the others (also an OutcomeUnknown)
    ├── GroupStalled                the group's storage failed (a full disk): it takes no
    │   │                           proposal, acknowledges nothing, and retries (`no_space`)
    │   └── StalledInFlight         ... after the command reached pysyncobj (OutcomeUnknown)
    ├── ApplyDeferred               raised by a state machine: this command cannot be applied
    │                               now and nothing of it was; the group stalls and retries
    └── PeerRefused                 a peer's bytes were refused; its connection is closed
        ├── FrameError              (raft/transport.py) not a frame stream
        ├── WireError               (raft/wire.py) not a message of the protocol
        ├── UnsafePickle            (raft/safe_pickle.py) a pickle the restricted unpickler
        │                           refuses (a global outside its list, or the wrong shape)
        └── AuthFailed              (raft/auth.py) the hello does not prove the secret

PeerRefused never leaves raft/: the transport logs one line and closes the connection.

`retriable` is True for the whole NotApplied branch: the same command may be proposed again
without risk of applying it twice. OutcomeUnknown errors need an idempotent command (for
instance a producer id + sequence) before a retry is safe.
"""

from __future__ import annotations


class RaftError(Exception):
    """Base of every error raft/ raises."""

    retriable = False


class NotApplied(RaftError):
    """The command is certainly not in any log: proposing it again cannot apply it twice."""

    retriable = True


class NotLeader(NotApplied):
    """This replica cannot get the command into the log now.

    Raised when no leader is known (election in progress, no quorum reachable) or when the
    node a command was forwarded to no longer leads. `leader_id` and `leader_address` name the
    leader this replica last heard of, or are None.
    """

    def __init__(self, group_id: int, leader_id: str | None, leader_address: str | None) -> None:
        where = f"leader is {leader_id} at {leader_address}" if leader_id else "no leader known"
        super().__init__(f"group {group_id}: not leader ({where})")
        self.group_id = group_id
        self.leader_id = leader_id
        self.leader_address = leader_address


class QueueFull(NotApplied):
    """A bounded queue of proposals is full; `limit` is its bound (commands)."""

    def __init__(self, group_id: int, limit: int) -> None:
        super().__init__(f"group {group_id}: more than {limit} proposals in flight")
        self.group_id = group_id
        self.limit = limit


class Discarded(NotApplied):
    """The entry was overwritten by a new leader's log before it committed."""


class RequestDenied(NotApplied):
    """pysyncobj refused the command."""


class OutcomeUnknown(RaftError):
    """The command may have been committed, or may still be, or may never be."""


class Timeout(OutcomeUnknown):
    """The command was not committed and applied locally within the deadline."""

    def __init__(self, group_id: int, timeout_s: float) -> None:
        super().__init__(f"group {group_id}: not applied within {timeout_s:.3f} s")
        self.group_id = group_id
        self.timeout_s = timeout_s


class CommandTooLarge(RaftError):
    """A command over the size one Raft entry may carry; `limit` is that size in bytes."""

    def __init__(self, group_id: int, size: int, limit: int) -> None:
        super().__init__(f"group {group_id}: command of {size} bytes is over {limit}")
        self.group_id = group_id
        self.size = size
        self.limit = limit


class ReplicaStopped(RaftError):
    """The node or the group was stopped (or its tick thread died) before the command applied."""


class StoppedInFlight(ReplicaStopped, OutcomeUnknown):
    """The group stopped after the command was handed to pysyncobj: it may be in the
    others' logs and commit there, so a retry could apply it twice."""


class PeerRefused(RaftError):
    """A peer sent bytes that raft/ will not act on: the connection is closed, and the
    node goes on (its tick thread never stops for what a peer sent)."""


class UnsafePickle(PeerRefused):
    """Bytes that pysyncobj would unpickle were refused by raft/safe_pickle.py."""


class AuthFailed(PeerRefused):
    """A connection did not prove it knows the cluster secret (raft/auth.py)."""


class GroupStalled(RaftError):
    """The group's journal or state machine could not write (a full disk, an I/O error):
    until a retry succeeds the group is not ticked, acknowledges nothing and refuses new
    proposals (raft/README.md, "A full disk"). A proposal refused with it is not in the log.
    `no_space` tells a full disk (ENOSPC) from another I/O error."""

    def __init__(self, message: str, *, no_space: bool) -> None:
        super().__init__(message)
        self.no_space = no_space


class StalledInFlight(GroupStalled, OutcomeUnknown):
    """The group stalled after the command reached pysyncobj: it may still commit (here
    after the retry, or on the others), so a retry could apply it twice."""


class ApplyDeferred(RaftError):
    """Raised by a state machine's apply: the command cannot be applied now (its storage
    refused the write) and the machine's state is as before the call. The replica stalls
    and applies the same command again later; apply must stay deterministic meanwhile."""

    def __init__(self, message: str, *, no_space: bool) -> None:
        super().__init__(message)
        self.no_space = no_space


# How a reader says that a format is newer than it reads (the same words as dmq/compat.py,
# which raft/ may not import; the broker's log line names the release).
TOO_NEW_ADVICE = (
    "upgrade this broker to the release that wrote it, or restore the data directory from a "
    "copy taken before that release first started on it"
)


def too_new(what: str, found: int, readable_max: int) -> str:
    return (
        f"{what}: format {found} was written by a dmq newer than this one; this dmq reads "
        f"formats up to {readable_max}: {TOO_NEW_ADVICE}"
    )
