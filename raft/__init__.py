"""raft/: many pysyncobj Raft groups per node, durable and fast. See raft/README.md.

The public surface: RaftNode hosts groups, Replica.propose() commits a command, and the
errors of raft/errors.py are the only exceptions that leave the package.
"""

from raft.config import RaftConfig, RaftConfigError
from raft.errors import (
    CommandTooLarge,
    Discarded,
    NotApplied,
    NotLeader,
    OutcomeUnknown,
    QueueFull,
    RaftError,
    ReplicaStopped,
    RequestDenied,
    Timeout,
)
from raft.node import RaftNode
from raft.replica import Replica
from raft.types import ReplicaStatus, StateMachine

__all__ = [
    "CommandTooLarge",
    "Discarded",
    "NotApplied",
    "NotLeader",
    "OutcomeUnknown",
    "QueueFull",
    "RaftConfig",
    "RaftConfigError",
    "RaftError",
    "RaftNode",
    "Replica",
    "ReplicaStatus",
    "ReplicaStopped",
    "RequestDenied",
    "StateMachine",
    "Timeout",
]
