"""Checkers: pure functions from a history (a list of `jepsen.history.Op`) to a verdict.

- `log.check_log`: the log workload's anomalies (README.md lists each one).
- `wgl.check_linearizable`: Wing & Gong's linearizability search (with Lowe's memo),
  split per key, with a time budget that answers "unknown" rather than hanging.
- `queue.check_total_queue`: total-queue semantics (lost, unexpected, duplicated,
  recovered) for consumption that must see every acknowledged value at least once.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

VALID = "valid"
INVALID = "invalid"
UNKNOWN = "unknown"


@dataclass
class Verdict:
    """What a checker found: its validity, each anomaly type with every instance (the
    operations involved, by history index), and counts for the report."""

    valid: str = VALID
    anomalies: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    stats: dict[str, Any] = field(default_factory=dict)

    def flag(self, kind: str, example: dict[str, Any]) -> None:
        self.anomalies.setdefault(kind, []).append(example)
        self.valid = INVALID


def merge(verdicts: dict[str, Verdict]) -> str:
    """invalid if any is invalid, else unknown if any is unknown, else valid."""
    found = {v.valid for v in verdicts.values()}
    return INVALID if INVALID in found else UNKNOWN if UNKNOWN in found else VALID
