"""Every limit and timing of raft/ in one place, and the one SyncObjConf built from them.

`RaftConfig` is what a node is tuned with (one per RaftNode, shared by its groups);
`build_syncobj_conf` turns it into pysyncobj's SyncObjConf, naming every pysyncobj option,
including those our transport and journal make irrelevant, so that no library default is
silently in force. `RaftConfig.check()` verifies the relations between limits at start-up.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

from pysyncobj import SyncObjConf

from raft.errors import RaftError

KIB = 1024
MIB = 1024 * KIB

# A frame is refused (the connection is closed) above this size: it bounds the memory one
# peer can make us allocate. Must exceed the largest append_entries message (see check()).
FRAME_BYTES_MAX = 32 * MIB


class RaftConfigError(RaftError, ValueError):
    """Two limits contradict each other, or one is out of range."""


@dataclass(frozen=True, slots=True)
class RaftConfig:
    # --- timing -------------------------------------------------------------------------
    # A group this node leads is ticked every heartbeat_interval_s when nothing happens
    # (its heartbeat is then due); a group it follows, every follower_tick_interval_s, so a
    # lost leader is noticed (heartbeats it receives need no tick of their own) -- but a
    # follower that knows its leader and has nothing to apply is ticked only at its election
    # deadline or once a second (RaftNode checks without a tick). Cost: one pysyncobj tick
    # (~10-30 us) per group per interval, plus the heartbeats (a frame to each follower and
    # its reply per heartbeat_interval_s) -- but only while a group is busy: an idle,
    # caught-up group quiesces (raft/quiesce.py) and costs neither, its liveness coming
    # from a node heartbeat per peer per heartbeat_interval_s. 1,000 idle groups: 2-4% of a
    # core per node (24-49% before quiescence). `python -m bench.raft_bench --idle`
    # measures it against failover time.
    # tick_interval_s bounds how long the tick thread sleeps.
    tick_interval_s: float = 0.025
    follower_tick_interval_s: float = 0.1
    # A leader sends append_entries (a heartbeat if empty) at least this often. New entries
    # and commit-index advances are sent at once, not on this period.
    heartbeat_interval_s: float = 0.1
    # A follower that hears no leader for a random time in [min, max) starts an election.
    # Failover time is about max + one round of votes. Too low: spurious elections when a
    # 2-core machine is saturated; too high: slow failover.
    election_timeout_min_s: float = 0.4
    election_timeout_max_s: float = 0.8
    # Check-quorum: a leader that heard from no majority for this long steps down
    # (pysyncobj's leaderFallbackTimeout), so proposals on a partitioned old leader fail
    # (NotLeader) instead of hanging, and the majority, which grants pre-votes once it hears
    # no leader, elects another. An election timeout, as etcd's checkQuorum.
    leader_step_down_s: float = 0.8
    # Pre-vote (raft/prevote.py): a node whose election timeout ran out first asks whether a
    # majority would vote for it and raises its term only if so; a member that heard from
    # a live leader within election_timeout_min_s says no. False: pysyncobj's plain
    # elections (a node cut off from the leader alone deposes it: tests' negative control).
    pre_vote: bool = True
    # Delay between connection attempts to a peer that is down.
    connect_retry_s: float = 0.2
    # A connection whose sent data stays unacknowledged this long is closed (TCP_USER_TIMEOUT)
    # and retried: how long a partitioned peer's queue can grow before it is dropped.
    peer_unacked_timeout_s: float = 5.0
    # --- durability ---------------------------------------------------------------------
    # "fsync": no append_entries, append reply or vote reply leaves the node before the
    # journal writes (entries, truncations, term and vote) made before it are fdatasync'ed.
    # "none": the same writes reach the OS page cache only; a power loss may lose
    # acknowledged commands (a process crash does not). For benchmarks and users who ask.
    durability: Literal["fsync", "none"] = "fsync"
    # --- proposals ----------------------------------------------------------------------
    # Commands waiting (not yet handed to pysyncobj) or in flight (handed, not yet applied)
    # per group. Beyond either bound propose() raises QueueFull at once.
    proposals_max: int = 65_536
    proposal_bytes_max: int = 256 * MIB
    # Concurrent proposals are coalesced into one Raft entry (group commit) of at most this
    # many commands and bytes. Bigger entries: fewer fsyncs and messages per command; but an
    # entry is the unit of pickling and of each replica's apply loop. One command may not
    # exceed batch_bytes_max (CommandTooLarge).
    batch_commands_max: int = 4096
    batch_bytes_max: int = 1 * MIB
    # pysyncobj's own queue of batches between our coalescer and its log (one per tick).
    commands_queue_size: int = 1024
    # Reads waiting per group for their ReadIndex confirmation (raft/read_index.py); beyond
    # it read_index() raises QueueFull. Each costs a future and ~100 bytes; a confirmation
    # round serves them all, so the bound only caps a leader that cannot confirm.
    reads_max: int = 65_536
    # --- replication --------------------------------------------------------------------
    # Entries per append_entries message, in bytes. Must exceed batch_bytes_max: pysyncobj
    # splits an entry bigger than this into a slow chunked transfer.
    append_entries_bytes_max: int = 4 * MIB
    # Bytes queued for one peer (held + unsent) beyond which messages to it are dropped and
    # counted: Raft recovers lost messages (the follower asks again from its log end).
    peer_send_buffer_bytes_max: int = 64 * MIB
    # --- journal and snapshots ----------------------------------------------------------
    # Log compaction (a snapshot, then the journal's prefix is dropped) runs when the journal
    # holds more than this many entries, or more than this many bytes, or this long passed
    # since the last one. The bytes bound keeps a busy group's journal (and its recycled
    # spare, raft/journal.py) near it: at 1 MiB entries 4096 entries were 4 GiB of disk,
    # all read back by a restart's recovery, and the file never recycled in a run.
    log_compaction_min_entries: int = 4096
    log_compaction_bytes: int = 256 * MIB
    log_compaction_min_time_s: float = 300.0
    # A snapshot is sent to a lagging follower in chunks of this size.
    snapshot_chunk_bytes: int = 1 * MIB
    # Recent commands kept in memory per group (older ones are read back from the journal,
    # from the page cache): the leader sends and applies entries soon after appending them.
    # Per node that is up to groups x this; a node-wide budget is future work.
    journal_cache_bytes_max: int = 4 * MIB
    # Appended bytes buffered before a write(2), also written at every flush.
    journal_write_buffer_bytes_max: int = 1 * MIB

    def check(self) -> None:
        """Raise RaftConfigError if the limits contradict each other."""
        rules: list[tuple[bool, str]] = [
            (self.tick_interval_s > 0, "tick_interval_s must be > 0"),
            (
                self.heartbeat_interval_s * 3 < self.election_timeout_min_s,
                "election_timeout_min_s must exceed 3 heartbeats (pysyncobj requires it)",
            ),
            (
                self.tick_interval_s < self.heartbeat_interval_s,
                "tick_interval_s must be below heartbeat_interval_s, or heartbeats are late",
            ),
            (
                self.tick_interval_s <= self.follower_tick_interval_s
                and 2 * self.follower_tick_interval_s <= self.election_timeout_min_s,
                "follower_tick_interval_s must be in [tick_interval_s, election_timeout_min_s/2]",
            ),
            (
                self.election_timeout_min_s < self.election_timeout_max_s,
                "election_timeout_min_s must be < election_timeout_max_s",
            ),
            (
                self.leader_step_down_s > self.heartbeat_interval_s,
                "leader_step_down_s must exceed heartbeat_interval_s",
            ),
            (self.durability in ("fsync", "none"), "durability is 'fsync' or 'none'"),
            (self.reads_max >= 1, "reads_max must be >= 1"),
            (self.proposals_max >= self.batch_commands_max >= 1, "batch_commands_max too big"),
            (self.proposal_bytes_max >= self.batch_bytes_max >= KIB, "batch_bytes_max too big"),
            (
                self.append_entries_bytes_max > self.batch_bytes_max + 64 * KIB,
                "append_entries_bytes_max must exceed batch_bytes_max (plus pickle overhead): "
                "a larger entry would go in pysyncobj's chunked transfer, which raft/wire.py "
                "does not carry",
            ),
            (
                2 * max(self.append_entries_bytes_max, self.snapshot_chunk_bytes) < FRAME_BYTES_MAX,
                "FRAME_BYTES_MAX must exceed twice the biggest message",
            ),
            (
                self.peer_send_buffer_bytes_max >= 2 * FRAME_BYTES_MAX,
                "peer_send_buffer_bytes_max must hold two of the biggest frames",
            ),
            (self.log_compaction_min_entries >= 2, "log_compaction_min_entries must be >= 2"),
            (self.log_compaction_bytes >= MIB, "log_compaction_bytes must be >= 1 MiB"),
            (self.journal_cache_bytes_max >= 0, "journal_cache_bytes_max must be >= 0"),
            (self.journal_write_buffer_bytes_max >= KIB, "journal write buffer too small"),
        ]
        broken = [message for ok, message in rules if not ok]
        if broken:
            raise RaftConfigError("; ".join(broken))


def build_syncobj_conf(
    config: RaftConfig,
    *,
    journal: object,
    snapshot_path: str,
    serializer: Callable[[str, Any], None],
    deserializer: Callable[[str], Any],
) -> SyncObjConf:
    """The SyncObjConf of one group: every option of pysyncobj 0.3.17 named, with why."""
    return SyncObjConf(
        # Ticks come from RaftNode's one thread (doTick), never from a thread per group.
        autoTick=False,
        autoTickPeriod=config.tick_interval_s,  # unused with autoTick=False
        # False: pysyncobj sends append_entries as soon as a command enters the leader's log
        # and as soon as the commit index moves, instead of waiting for appendEntriesPeriod.
        # Our coalescer hands it one command (a batch) per group per tick, so this does not
        # mean a message per user command.
        appendEntriesUseBatch=False,
        appendEntriesPeriod=config.heartbeat_interval_s,
        appendEntriesBatchSizeBytes=config.append_entries_bytes_max,
        raftMinTimeout=config.election_timeout_min_s,
        raftMaxTimeout=config.election_timeout_max_s,
        leaderFallbackTimeout=config.leader_step_down_s,
        commandsQueueSize=config.commands_queue_size,
        # False: with no leader, a command fails at once (NotLeader) instead of waiting in
        # pysyncobj's queue with no deadline; the facade retries until its own deadline.
        commandsWaitLeader=False,
        # The durable journal (raft/journal.py), handed over through journalFile: see
        # raft/journal.py for the one hook that makes pysyncobj accept the object.
        journalFile=journal,
        # Snapshots: our serializer writes the state machine's snapshot and fsyncs it.
        fullDumpFile=snapshot_path,
        serializer=serializer,
        deserializer=deserializer,
        serializeChecker=None,  # synchronous: serializer returns when the file is written
        useFork=False,  # pysyncobj never forks with a custom serializer anyway
        logCompactionMinEntries=config.log_compaction_min_entries,
        logCompactionMinTime=config.log_compaction_min_time_s,
        logCompactionSplit=False,
        logCompactionBatchSize=config.snapshot_chunk_bytes,
        # Members are added and removed one at a time at run time (raft/membership.py).
        dynamicMembershipChange=True,
        onReady=None,
        onStateChanged=None,
        onCodeVersionChanged=None,
        # pysyncobj's own encryption belongs to its TCP transport, unused: raft/transport.py
        # authenticates peers itself (raft/auth.py) and never unpickles frames (raft/wire.py).
        password=None,
        # Options of pysyncobj's TCPTransport, unused by raft/transport.py; named so that
        # validate() passes and nobody wonders. connectionTimeout must be >= raftMaxTimeout.
        connectionTimeout=max(3.5, config.election_timeout_max_s),
        connectionRetryTime=config.connect_retry_s,
        bindAddress=None,
        bindRetryTime=1.0,
        maxBindRetries=0,
        preferredAddrType="ipv4",
        sendBufferSize=2**16,
        recvBufferSize=2**16,
        tcp_keepalive=None,
        # The per-group poller only ever watches pysyncobj's PipeNotifier pipe.
        pollerType="auto",
        # globalDnsResolver is process-wide; addresses here are IP literals anyway.
        dnsCacheTime=600.0,
        dnsFailCacheTime=30.0,
    )
