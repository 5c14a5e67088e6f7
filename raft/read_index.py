"""ReadIndex: linearizable reads from a group's leader, confirmed by a round of its followers.

A leader that thinks it leads may have been deposed without knowing it (cut off, paused): a
read it answers from its own state could miss a write that a newer leader acknowledged.
Raft's ReadIndex (Ongaro's dissertation, 6.4; etcd's `ReadIndex`) closes that without a
log entry per read. On the leader, for each read (`Replica.read_index()`):

1. **record** (tick thread, the round after the read arrived): the leader must have
   applied its election no-op (`leader_ready`: until then its commit index may lag what
   an earlier leader committed; the read waits); the read's index is the commit index now.
2. **confirm**: reads recorded in a round that sent no confirmation yet get the next
   round number `seq`, and READ {term, seq} goes to every follower, once per round
   however many reads it covers (batching: the cost is a message per follower per round,
   not per read). A follower answers READ_ACK {term, seq} iff its current term is not
   above the READ's term (then it had voted for no later leader when it answered, and
   terms only grow). The leader counts acks in its own term only; a round is confirmed
   once a majority of the group (the leader included) acked it or a later round, since
   an ack of a later round was sent later still.
3. **wait** until the leader has applied the read's index, then answer the index: the
   caller reads its state machine (which is then at least at the index) at once.

Why it is linearizable: every ack left its follower after the read arrived (the READ was
sent after). A leader of a later term needs the vote of one of the acking majority, given
after that node's ack, so after the read arrived: any write it acknowledges completes after
the read began and may be ordered after it. Any write acknowledged before the read arrived
was committed at an index the commit index recorded in step 1 covers (committed by this
leader, or by an earlier one, which its no-op being applied covers). Clocks play no part: a
pause anywhere (a GC, SIGSTOP of the leader between confirmation and answer) can only make
the answer older than the moment it is delivered, never older than the read's start.

Anything else fails the read with NotLeader at once: the replica is not the leader, or its
term changed while the read waited (a leader that lost and regained leadership answers its
reads from scratch). Nothing here reads a clock; the caller's deadline bounds the wait.

Followers answer READ on the tick thread without a tick (a quiesced follower stays
quiesced, raft/quiesce.py); the ack is held until the round's journals are synced like
every reply. This module imports nothing of raft/: raft/wire.py encodes its messages.
"""

from __future__ import annotations

import collections
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

READ = "dmq_read"  # leader -> follower: {term, seq}
READ_ACK = "dmq_read_ack"  # follower -> leader: {term, seq}
READ_TYPES = frozenset({READ, READ_ACK})


@dataclass(slots=True)
class PendingRead:
    """One read waiting on the leader: its answer is `index`, once confirmed and applied."""

    answer: Callable[[int | None, BaseException | None], None]  # called once, tick thread
    index: int = -1  # the commit index recorded at step 1 (-1: not recorded yet)
    seq: int = 0  # the confirmation round that covers it (0: none sent yet)


@dataclass(slots=True)
class ReadIndexState:
    """A replica's reads, as leader. `incoming` is filled by the event loop and drained by the
    tick thread; everything else belongs to the tick thread."""

    incoming: collections.deque[PendingRead] = field(default_factory=collections.deque)
    waiting: list[PendingRead] = field(default_factory=list)  # recorded, not answered
    term: int = 0  # the term of `seq` and `acked`
    seq: int = 0  # the last confirmation round sent in `term`
    acked: dict[str, int] = field(default_factory=dict)  # follower -> highest seq acked
    rounds_sent: int = 0  # confirmation rounds sent (a metric: reads / rounds = batching)
    reads_answered: int = 0

    def __len__(self) -> int:
        return len(self.incoming) + len(self.waiting)

    def fail_all(self, error: BaseException) -> None:
        """Fail every read here (not the leader any more, or stopped)."""
        reads = [*self.waiting, *self.incoming]
        self.waiting.clear()
        self.incoming.clear()
        for read in reads:
            read.answer(None, error)

    def new_term(self, term: int) -> bool:
        """Forget the rounds of an older term; True if the term changed."""
        if term == self.term:
            return False
        self.term = term
        self.seq = 0
        self.acked.clear()
        return True

    def record(self, commit_index: int) -> bool:
        """Step 1 for the reads that arrived; True if any waits for a confirmation round."""
        while self.incoming:
            read = self.incoming.popleft()
            read.index = commit_index
            self.waiting.append(read)
        return any(read.seq == 0 for read in self.waiting)

    def next_round(self) -> int:
        """Step 2: the round that covers every recorded read not yet covered."""
        self.seq += 1
        self.rounds_sent += 1
        for read in self.waiting:
            if read.seq == 0:
                read.seq = self.seq
        return self.seq

    def on_ack(self, peer_id: str, term: Any, seq: Any) -> bool:
        """A follower's READ_ACK; True if it counts (this term, a newer round)."""
        if term != self.term or not isinstance(seq, int) or seq > self.seq:
            return False
        if seq <= self.acked.get(peer_id, 0):
            return False
        self.acked[peer_id] = seq
        return True

    def confirmed(self, followers: Iterable[str]) -> int:
        """The highest round a majority of the group acked (the leader acks its own)."""
        heard = sorted((self.acked.get(peer, 0) for peer in followers), reverse=True)
        needed = (len(heard) + 1) // 2  # followers needed besides the leader
        return self.seq if needed == 0 else heard[needed - 1]

    def answer_ready(self, confirmed: int, last_applied: int) -> int:
        """Step 3: answer the confirmed reads whose index is applied; how many were."""
        ready: list[PendingRead] = []
        kept: list[PendingRead] = []
        for read in self.waiting:
            done = 0 < read.seq <= confirmed and read.index <= last_applied
            (ready if done else kept).append(read)
        if not ready:
            return 0
        self.waiting = kept
        for read in ready:
            read.answer(read.index, None)
        self.reads_answered += len(ready)
        return len(ready)


def ack_for(message: Any, current_term: int) -> dict[str, Any] | None:
    """A follower's answer to READ: the ack, or None if its term is above the READ's."""
    term = message.get("term") if isinstance(message, dict) else None
    seq = message.get("seq") if isinstance(message, dict) else None
    if not isinstance(term, int) or not isinstance(seq, int) or current_term > term:
        return None
    return {"type": READ_ACK, "term": term, "seq": seq}
