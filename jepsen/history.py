"""The history of a run: every operation's invocation and completion, as Jepsen records it.

One event per line of `history.jsonl`:

    {"index": 12, "time": 3.0512, "process": 4, "type": "invoke", "f": "send",
     "node": "n2", "value": {"partition": 0, "value": "4-17"}}

- `index`: position in the history (0, 1, ...); `time`: seconds on the harness's
  monotonic clock since the run began.
- `process`: the logical client (an int), or "nemesis" for faults. A client process runs
  one operation at a time. After an `info` completion the worker goes on as a new process
  (Jepsen's convention): the old one may still have an operation in flight forever.
- `type`: `invoke`, then exactly one of `ok` (it happened), `fail` (it certainly had no
  effect) or `info` (unknown: a timeout, a reset connection, a 503 after a proposal).
- `f`: `send`, `poll`, `assign`, `final-poll`, `replica-read` (the log workload; group
  operations add `subscribe`, `group-poll`, `commit`, `read-committed`), or a nemesis
  function (`start-partition`, `stop-partition`, `start-kill`, ...).
- `value`: the operation's argument in `invoke`, its result in `ok`. Values written by
  sends are unique strings, so a value read identifies the send that wrote it.

Shapes of the log workload's values (partition `p`, records as `[offset, value]`):
- send: invoke `{"partition": p, "value": v}`; ok adds `"offset": o` (null if the broker
  answered without one).
- poll, final-poll: invoke `{"partition": p, "offset": o}`; ok adds `"records"`,
  `"next_offset"` and `"high_watermark"`.
- assign: invoke and ok `{"partition": p, "offset": o}`: the process seeks to `o`.
- replica-read: invoke `{"partition": p, "end_offset": e}`; ok adds `"sha256"` (of one
  node's own committed batches of p in [0, e), read with the internal catch-up request,
  never relayed), `"bytes"` and `"log_end"` (that replica's end); e is the smallest end
  of all replicas, so every replica's digest covers the same offsets.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

TYPES = ("invoke", "ok", "fail", "info")
NEMESIS = "nemesis"


@dataclass(frozen=True, slots=True)
class Op:
    """One event of the history."""

    index: int
    time: float  # seconds since the run began (monotonic)
    process: int | str
    type: str  # invoke | ok | fail | info
    f: str
    node: str | None
    value: Any

    def to_json(self) -> dict[str, Any]:
        return {
            "index": self.index,
            "time": round(self.time, 6),
            "process": self.process,
            "type": self.type,
            "f": self.f,
            "node": self.node,
            "value": self.value,
        }

    @staticmethod
    def from_json(doc: dict[str, Any]) -> Op:
        if doc["type"] not in TYPES:
            raise ValueError(f"event {doc.get('index')}: type {doc['type']!r} not in {TYPES}")
        return Op(
            int(doc["index"]),
            float(doc["time"]),
            doc["process"],
            doc["type"],
            doc["f"],
            doc.get("node"),
            doc.get("value"),
        )


class History:
    """A thread-safe, append-only history, written through to a JSONL file as it grows
    (so a run that crashes leaves what it did)."""

    def __init__(self, path: Path | None = None) -> None:
        self._lock = threading.Lock()
        self._ops: list[Op] = []
        self._t0 = time.monotonic()
        self._file: TextIO | None = open(path, "w") if path is not None else None  # noqa: SIM115

    def now(self) -> float:
        return time.monotonic() - self._t0

    def add(self, process: int | str, type_: str, f: str, node: str | None, value: Any) -> Op:
        with self._lock:
            op = Op(len(self._ops), self.now(), process, type_, f, node, value)
            self._ops.append(op)
            if self._file is not None:
                self._file.write(json.dumps(op.to_json(), separators=(",", ":")) + "\n")
            return op

    def ops(self) -> list[Op]:
        with self._lock:
            return list(self._ops)

    def close(self) -> None:
        with self._lock:
            if self._file is not None:
                self._file.close()
                self._file = None


def write_jsonl(ops: Iterable[Op], path: Path) -> None:
    with open(path, "w") as out:
        for op in ops:
            out.write(json.dumps(op.to_json(), separators=(",", ":")) + "\n")


def read_jsonl(path: Path) -> list[Op]:
    with open(path) as lines:
        return [Op.from_json(json.loads(line)) for line in lines if line.strip()]


@dataclass(frozen=True, slots=True)
class Pair:
    """An invocation and its completion (None: never completed, as good as info)."""

    invoke: Op
    complete: Op | None

    @property
    def type(self) -> str:
        return "info" if self.complete is None else self.complete.type

    @property
    def end(self) -> float:
        """Completion time; an operation that never completed may take effect any time."""
        return float("inf") if self.complete is None else self.complete.time


def pairs(ops: Iterable[Op]) -> Iterator[Pair]:
    """Each client operation as (invoke, completion), in invocation order. A process has
    at most one operation open at a time; a second invoke before a completion is a
    malformed history."""
    open_ops: dict[int | str, Op] = {}
    done: list[Pair] = []
    for op in ops:
        if op.process == NEMESIS:
            continue
        if op.type == "invoke":
            if op.process in open_ops:
                raise ValueError(f"process {op.process} invoked {op.index} with one open")
            open_ops[op.process] = op
        else:
            invoke = open_ops.pop(op.process, None)
            if invoke is None or invoke.f != op.f:
                raise ValueError(f"completion {op.index} matches no open {op.f} invocation")
            done.append(Pair(invoke, op))
    done.extend(Pair(invoke, None) for invoke in open_ops.values())
    done.sort(key=lambda pair: pair.invoke.index)
    return iter(done)
