"""A consumer-group member as its own process, for the real-process tests.

    python group_consumer_proc.py URL GROUP TOPIC OUT_FILE SESSION_TIMEOUT_MS

Polls with the Python client's `Consumer(group=...)` (auto-commit: at-least-once) and
appends one line per record, `partition offset value`, to OUT_FILE, flushed after each
poll, and `assign p,p,...` / `revoke p,p,...` lines when its assignment changes. Stops on SIGTERM (closes:
commits and leaves the group); a SIGKILL stops it without either.
"""

from __future__ import annotations

import signal
import sys
from types import FrameType

from dmq.client import Consumer, TopicPartition


def main() -> None:
    url, group, topic, out_path, session_ms = sys.argv[1:6]
    stop = False

    def on_term(signum: int, frame: FrameType | None) -> None:
        nonlocal stop
        stop = True

    signal.signal(signal.SIGTERM, on_term)
    with open(out_path, "a", buffering=1) as out:

        def assign(tps: list[TopicPartition]) -> None:
            out.write("assign " + ",".join(str(tp.partition) for tp in tps) + "\n")

        def revoke(tps: list[TopicPartition]) -> None:
            out.write("revoke " + ",".join(str(tp.partition) for tp in tps) + "\n")

        consumer = Consumer(url, group=group, topics=[topic],
                            session_timeout_ms=int(session_ms), on_assign=assign,
                            on_revoke=revoke)  # fmt: skip
        try:
            while not stop:
                for r in consumer.poll(timeout_ms=200):
                    out.write(f"{r.partition} {r.offset} {r.value!r}\n")
        finally:
            consumer.close()


if __name__ == "__main__":
    main()
