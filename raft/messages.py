"""What raft/ changes in pysyncobj's append_entries messages, on their way out and in, and why.

pysyncobj 0.3.17 lets a leader keep several append_entries in flight to one follower
(`appendEntriesUseBatch=False` sends one per new command), but every success reply sets the
leader's nextIndex back to just after the entries *that* reply acknowledges. The next
append_entries then starts before entries the follower already holds, and the follower
handles any append_entries whose prevLogIdx is not its last entry by deleting everything
after prevLogIdx and appending the message's entries. So, under load, followers keep
truncating and re-appending entries they have already made durable and acknowledged, and
when the message is cut short by appendEntriesBatchSizeBytes they keep fewer than they
acknowledged: a power loss at that moment could lose a committed entry.

`trim_append_entries` rewrites such a message, before pysyncobj sees it, into the one the
Raft paper's receiver would act on: entries the follower already holds with the same term
are dropped (Log Matching: same index and term means same entry and same prefix), and
prevLogIdx moves to the last of them. If the follower holds even more entries and its last
one carries the leader's current term, they came from this leader and extend the leader's
log, so the message becomes an empty append at the follower's last entry: no truncation,
and the reply acknowledges everything the follower has. A message that still conflicts
with the follower's log is left alone, so pysyncobj truncates exactly where Raft must.

`trim_outgoing_append_entries` removes the cause on the leader's side: the transport
remembers, per follower, the last index it sent in the current term, and cuts from each
new append_entries the entries before it (prevLogIdx moves up to it). Any append_entries
whose prevLogIdx/prevLogTerm come from the leader's own log is a valid one, so this is
always safe; it relies on TCP's order only for progress, and forgets the mark when the
connection drops or the follower answers that its log differs (then pysyncobj's own
back-off takes over, untrimmed). Without it the leader sends most entries twice under load.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


def trim_append_entries(message: Any, term_at: Callable[[int], int | None], last_index: int) -> Any:
    """The message pysyncobj should handle instead of `message` (module docstring).

    `term_at(idx)` is the term of the follower's entry idx, or None if it holds none;
    `last_index` is the index of its last entry. Anything but a plain append_entries
    (votes, snapshots, chunked transfers of one large entry) passes unchanged.
    """
    if (
        not isinstance(message, dict)
        or message.get("type") != "append_entries"
        or "prevLogIdx" not in message
        or "transmission" in message
    ):
        return message
    prev_idx, prev_term = message["prevLogIdx"], message["prevLogTerm"]
    if term_at(prev_idx) != prev_term:
        return message  # pysyncobj rejects it and the leader backs off: nothing to trim
    entries = message.get("entries") or []
    held = 0  # entries[:held] are already in the follower's log
    for k in range(len(entries) - 1, -1, -1):
        _, idx, term = entries[k]
        if term_at(idx) == term:
            held = k + 1
            break
    if held == len(entries):
        last_idx = entries[-1][1] if entries else prev_idx
        if last_index > last_idx and term_at(last_index) == message["term"]:
            return {
                **message,
                "prevLogIdx": last_index,
                "prevLogTerm": message["term"],
                "entries": [],
            }
    if held == 0:
        return message
    _, new_prev_idx, new_prev_term = entries[held - 1]
    return {
        **message,
        "prevLogIdx": new_prev_idx,
        "prevLogTerm": new_prev_term,
        "entries": entries[held:],
    }


SentMark = tuple[int, int]  # (leader's term, index of the last entry sent to the follower)


def trim_outgoing_append_entries(
    message: Any, mark: SentMark | None, term_at: Callable[[int], int | None]
) -> tuple[Any, SentMark | None]:
    """The append_entries to send instead of `message`, and the mark to keep if it is sent.

    `mark` is what was sent to this follower before (or None); `term_at(idx)` is the term of
    the leader's entry idx, or None if its journal no longer holds it.
    """
    if "prevLogIdx" not in message or "transmission" in message:
        return message, None  # a snapshot or a chunked entry: no mark, nothing to trim
    term = message["term"]
    prev_idx = message["prevLogIdx"]
    entries = message.get("entries") or []
    end = entries[-1][1] if entries else prev_idx
    if mark is None or mark[0] != term or mark[1] <= prev_idx:
        return message, (term, end)
    sent_idx = mark[1]
    sent_term = term_at(sent_idx)
    if sent_term is None:
        return message, (term, end)
    trimmed = {
        **message,
        "prevLogIdx": sent_idx,
        "prevLogTerm": sent_term,
        "entries": entries[sent_idx - prev_idx :] if end > sent_idx else [],
    }
    return trimmed, (term, max(end, sent_idx))


def carries_nothing_new(message: Any) -> bool:
    """An append_entries without entries or snapshot data: a heartbeat, or what pysyncobj
    sends after every commit to pass the new commit index on (with appendEntriesUseBatch
    off), or what trimming left of a repeat."""
    return (
        not message.get("entries") and "transmission" not in message and "serialized" not in message
    )
