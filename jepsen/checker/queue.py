"""Total-queue semantics (Jepsen's total-queue checker), for consumption that must see
every acknowledged value at least once: consumer groups, or a log read end to end.

- lost: acknowledged enqueues never dequeued (invalid);
- unexpected: dequeued values nobody tried to enqueue (invalid);
- duplicated: values dequeued more than once (counted: at-least-once delivery allows
  it, e.g. after a rebalance);
- recovered: enqueues whose outcome was unknown (info) but were dequeued.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable

from jepsen.checker import Verdict
from jepsen.history import Op, pairs


def check_total_queue(
    ops: Iterable[Op], enqueue_f: str = "send", dequeue_fs: tuple[str, ...] = ("group-poll",)
) -> Verdict:
    """Values enqueued by `enqueue_f` ops (value["value"]); dequeued as the values of the
    records (`[offset, value]`) of ok `dequeue_fs` ops."""
    attempted: dict[str, str] = {}  # value -> outcome type
    dequeued: Counter[str] = Counter()
    for pair in pairs(ops):
        if pair.invoke.f == enqueue_f:
            attempted[pair.invoke.value["value"]] = pair.type
        elif pair.invoke.f in dequeue_fs and pair.type == "ok":
            assert pair.complete is not None
            dequeued.update(value for _, value in pair.complete.value.get("records", []))
    verdict = Verdict()
    for value, outcome in sorted(attempted.items()):
        if outcome == "ok" and value not in dequeued:
            verdict.flag("lost", {"value": value})
    for value in sorted(dequeued):
        if value not in attempted:
            verdict.flag("unexpected", {"value": value})
    duplicated = {value: n for value, n in dequeued.items() if n > 1}
    verdict.stats.update(
        attempted=len(attempted),
        acknowledged=sum(outcome == "ok" for outcome in attempted.values()),
        dequeued=len(dequeued),
        duplicated=len(duplicated),
        duplicated_examples=dict(sorted(duplicated.items())[:5]),
        recovered=sum(attempted.get(v) == "info" for v in dequeued),
    )
    return verdict
