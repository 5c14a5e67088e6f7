"""The Raft wire codec (raft/wire.py) against pickle, on the messages replication sends.

    python -m bench.wire_bench [--quick]

For each message: encode (into a send buffer) and decode (from a view of the receive
buffer), in microseconds per message, best of several repeats (the minimum is the figure
least disturbed by other work on a shared machine). `decode` for wire includes the check of
every log command by raft/safe_pickle.py (`decode_message`), which pickle never did; the
`apply` column is what pysyncobj pays anyway when it applies an entry (one unpickle of
each command), for scale.
"""

from __future__ import annotations

import argparse
import os
import pickle
import timeit
from collections.abc import Callable
from typing import Any

from raft import wire


def _batch(commands: int, size: int) -> bytes:
    """A log command as raft/node.py writes it: REGULAR type byte + pickled batch."""
    values = [os.urandom(size) for _ in range(commands)]
    return b"\x00" + pickle.dumps((3, (values,)), pickle.HIGHEST_PROTOCOL)


def messages() -> dict[str, dict[str, Any]]:
    head = {"type": "append_entries", "term": 3, "commit_index": 1000, "prevLogIdx": 1000}
    return {
        "next_node_idx": {
            "type": "next_node_idx",
            "next_node_idx": 123_456,
            "reset": False,
            "success": True,
        },
        "heartbeat": {**head, "prevLogTerm": 3, "entries": []},
        "1 entry, 64 x 1 KiB": {**head, "prevLogTerm": 3, "entries": [(_batch(64, 1024), 1001, 3)]},
        "1 entry, 1000 x 1 KiB": {
            **head,
            "prevLogTerm": 3,
            "entries": [(_batch(1000, 1024), 1001, 3)],
        },
        "100 entries of 100 B": {
            **head,
            "prevLogTerm": 3,
            "entries": [(_batch(1, 100), 1001 + k, 3) for k in range(100)],
        },
        "dmq_quiesce": {"type": "dmq_quiesce", "term": 3, "last": 1000, "last_term": 3, "round": 2},
    }


def best_us(call: Callable[[], object], number: int, repeat: int) -> float:
    return min(timeit.repeat(call, number=number, repeat=repeat)) / number * 1e6


def measure(message: dict[str, Any], number: int, repeat: int) -> dict[str, float]:
    out = bytearray()

    def wire_encode() -> None:
        del out[:]
        wire.encode_into(out, message)

    payload = wire.encode(message)
    pickled = pickle.dumps(message, pickle.HIGHEST_PROTOCOL)
    commands = [entry[0] for entry in message.get("entries", ())]

    def apply() -> None:
        for command in commands:
            pickle.loads(memoryview(command)[1:])  # noqa: S301 - timing pickle on our own bytes

    return {
        "pickle enc": best_us(
            lambda: pickle.dumps(message, pickle.HIGHEST_PROTOCOL), number, repeat
        ),
        "pickle dec": best_us(lambda: pickle.loads(pickled), number, repeat),  # noqa: S301 - ours
        "wire enc": best_us(wire_encode, number, repeat),
        "wire dec": best_us(lambda: wire.decode_message(payload), number, repeat),
        "apply": best_us(apply, number, repeat) if commands else 0.0,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer repeats")
    args = parser.parse_args(argv)
    repeat = 3 if args.quick else 9
    columns = ["pickle enc", "pickle dec", "wire enc", "wire dec", "apply"]
    print(f"{'message (us per message)':28s}" + "".join(f"{c:>12s}" for c in columns))
    for name, message in messages().items():
        size = sum(len(e[0]) for e in message.get("entries", ()))
        number = 20 if size > 100_000 else 200 if size > 5_000 else 2000
        row = measure(message, number, repeat)
        print(f"{name:28s}" + "".join(f"{row[c]:12.2f}" for c in columns))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
