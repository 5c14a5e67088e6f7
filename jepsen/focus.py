"""Where the nemesis wants the clients while a fault lasts (shared by nemesis.py, which
sets it, and the workers of workload.py, which read it before each operation).

A partition that cuts off a minority, or a pause, is aimed at nodes whose clients see
what a broken promise looks like: a cut-off leader acknowledging writes it cannot
commit, a cut-off or resumed follower answering reads from a stale log. Clients on
127.0.0.1 are never cut, so "the clients on the cut-off side" are the workers the
harness binds there: while an `Aim` is set, the pinned share of the workers (every
other one) talk only to its nodes and send to the partitions those nodes led when the
fault began; the others go on rotating over every broker. While any fault lasts the
workers also stop thinking between operations (heavier load when it matters).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Aim:
    nodes: tuple[str, ...]  # the cut-off (or paused) side
    partitions: tuple[int, ...]  # the partitions they led at the start: sends go there


class Focus:
    """The current aim and whether a fault lasts. Set and read across threads: each
    field is replaced whole (an attribute store is atomic), never changed in place."""

    def __init__(self) -> None:
        self.aim: Aim | None = None
        self.faulty = False

    def strike(self, aim: Aim | None) -> None:
        """A fault began; `aim` (if any) pins the pinned workers to its nodes. A second
        fault in the same window keeps the first aim unless it brings one."""
        if aim is not None and aim.nodes:
            self.aim = aim
        self.faulty = True

    def clear(self) -> None:
        self.aim = None
        self.faulty = False
