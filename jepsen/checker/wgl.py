"""A small linearizability checker: Wing & Gong's search with Lowe's memo, split per key.

Used for committed group offsets (per group and partition, a register: `commit` writes,
`read-committed` reads), as Jepsen's Knossos/Porcupine check a register. Pure: the input
is a list of `LinOp`s, the output "valid", "invalid" or "unknown".

The search (numbered as in Lowe, "Testing for linearizability", 2017):
1. Order every call and return event by time (calls first on ties: overlapping is the
   lenient reading). An operation that never completed (info) returns at +infinity: it
   may take effect at any point after its call, or never (it need not be linearized).
2. Walk the list. At a call, try to linearize that operation now: apply it to the model
   state; if the model accepts and (linearized set, state) was not seen before, remember
   it, lift the call and its return out of the list, and restart from the head.
3. At a return whose call is not yet linearized, the current choice failed: undo the last
   linearized operation (put it back) and go on from the entry after its call.
4. With nothing left to undo the history is not linearizable; when only returns of
   operations that never completed are left, it is.
5. A deadline bounds the search (it is exponential in the worst case): past it the key
   is "unknown", never a hang.
"""

from __future__ import annotations

import math
import time
from collections import defaultdict
from collections.abc import Hashable, Iterable
from dataclasses import dataclass
from typing import Any, Protocol

from jepsen.checker import INVALID, UNKNOWN, VALID, Verdict


@dataclass(frozen=True, slots=True)
class LinOp:
    """One completed-or-unknown operation on one key. `end` is math.inf for an info op;
    `output` is what a read returned (ignored for writes)."""

    key: Hashable
    f: str  # "write" or "read"
    input: Any
    output: Any
    start: float
    end: float
    index: int = -1  # its completion's index in the history, for reports


class Model(Protocol):
    def step(self, state: Any, op: LinOp) -> tuple[bool, Any]:
        """(accepted, next state) for applying op to state."""
        ...


class Register:
    """A register holding the last value written (None at first): a read must return it."""

    def step(self, state: Any, op: LinOp) -> tuple[bool, Any]:
        if op.f == "write":
            return True, op.input
        return op.output == state, state


@dataclass(slots=True)
class _Entry:
    op_id: int
    is_call: bool
    time: float
    prev: _Entry | None = None
    next: _Entry | None = None
    match: _Entry | None = None  # a call's return entry


def _build(ops: list[LinOp]) -> _Entry:
    events: list[tuple[float, int, int]] = []  # (time, 0 call / 1 return, op id)
    for i, op in enumerate(ops):
        events.append((op.start, 0, i))
        events.append((op.end, 1, i))
    events.sort()
    head = _Entry(-1, False, -math.inf)
    tail = head
    calls: dict[int, _Entry] = {}
    for when, kind, i in events:
        entry = _Entry(i, kind == 0, when, prev=tail)
        tail.next = entry
        tail = entry
        if kind == 0:
            calls[i] = entry
        else:
            calls[i].match = entry
    return head


def _lift(call: _Entry) -> None:
    for entry in (call, call.match):
        assert entry is not None and entry.prev is not None
        entry.prev.next = entry.next
        if entry.next is not None:
            entry.next.prev = entry.prev


def _unlift(call: _Entry) -> None:
    for entry in (call.match, call):
        assert entry is not None and entry.prev is not None
        entry.prev.next = entry
        if entry.next is not None:
            entry.next.prev = entry


def check_key(ops: list[LinOp], model: Model, init: Any, deadline: float) -> str:
    """Is this one key's history linearizable? valid / invalid / unknown (deadline)."""
    head = _build(ops)
    state = init
    linearized = 0
    seen: set[tuple[int, Any]] = set()
    stack: list[tuple[_Entry, Any]] = []
    entry = head.next
    steps = 0
    while entry is not None:
        steps += 1
        if steps % 1024 == 0 and time.monotonic() > deadline:
            return UNKNOWN
        if entry.is_call:
            accepted, after = model.step(state, ops[entry.op_id])
            marked = linearized | (1 << entry.op_id)
            if accepted and (marked, after) not in seen:
                seen.add((marked, after))
                stack.append((entry, state))
                state, linearized = after, marked
                _lift(entry)
                entry = head.next
                continue
            entry = entry.next
        elif math.isinf(entry.time):
            return VALID  # only never-completed operations remain: leave them out
        else:
            if not stack:
                return INVALID
            call, state = stack.pop()
            linearized &= ~(1 << call.op_id)
            _unlift(call)
            entry = call.next
    return VALID


def check_linearizable(
    ops: Iterable[LinOp], model: Model | None = None, init: Any = None, timeout_s: float = 10.0
) -> Verdict:
    """Check every key on its own; invalid keys are anomalies ("nonlinearizable"), keys
    past the time budget make the verdict unknown unless another key is invalid."""
    model = model or Register()
    by_key: dict[Hashable, list[LinOp]] = defaultdict(list)
    for op in ops:
        by_key[op.key].append(op)
    verdict = Verdict()
    deadline = time.monotonic() + timeout_s
    unknown: list[Hashable] = []
    for key, key_ops in by_key.items():
        result = check_key(key_ops, model, init, deadline)
        if result == INVALID:
            verdict.flag(
                "nonlinearizable",
                {"key": repr(key), "ops": sorted(op.index for op in key_ops)[:20]},
            )
        elif result == UNKNOWN:
            unknown.append(key)
    verdict.stats.update(keys=len(by_key), unknown_keys=[repr(k) for k in unknown])
    if unknown and verdict.valid == VALID:
        verdict.valid = UNKNOWN
    return verdict
