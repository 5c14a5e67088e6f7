"""IdentityService forming the cluster id at a first start, with the metadata group's
leader moving under it: every retriable error is waited out, never a reason to exit.

A fake metadata service stands in for group 0 here: a leader lost at exactly that moment
cannot be provoked on real processes (the jepsen campaign found it, 2 runs in 16 under
load, as a broker exiting at its first start); test_cluster_identity.py proves the rest
of the identity rules on real brokers."""

from __future__ import annotations

import asyncio
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from dmq import errors
from dmq.broker import identity
from dmq.broker.identity import IdentityService
from dmq.metadata.machine import FormCluster

FORMED = "0123456789abcdef0123456789abcdef"


class FakeMetadata:
    """FormCluster is refused (another broker formed the cluster first); the read that
    follows fails `barrier_failures` times as a leader lost with the outcome unknown."""

    def __init__(self, barrier_failures: int) -> None:
        self.state = SimpleNamespace(cluster_id="")
        self.barrier_failures = barrier_failures
        self.calls: list[str] = []

    async def propose(self, command: Any) -> None:
        assert isinstance(command, FormCluster)
        self.calls.append("propose")
        raise errors.InvalidRequest("the cluster id is formed already", field="cluster_id")

    async def read_barrier(self) -> None:
        self.calls.append("barrier")
        if self.barrier_failures:
            self.barrier_failures -= 1
            raise errors.RequestTimeout(
                "metadata: group 0: the leader was lost before the entry was known to "
                "commit; it may still commit; the outcome is unknown"
            )
        self.state.cluster_id = FORMED


def test_a_leader_lost_while_reading_the_formed_id_is_waited_out(
    tmp_path: Path, monkeypatch: Any
) -> None:
    monkeypatch.setattr(identity, "ADOPT_RETRY_S", 0.0)
    metadata = FakeMetadata(barrier_failures=2)
    ctx = SimpleNamespace(metadata=metadata, cluster_id="", data_dir=tmp_path)
    found = asyncio.run(IdentityService(ctx)._catalogue_id())  # type: ignore[arg-type]
    assert found == FORMED
    assert metadata.calls == ["propose", "barrier"] * 3
