"""The upgrade nemesis's releases: the previous release checked out of git history, which
tree each broker runs, and the finalize that ends the way back (README.md, "Releases and
upgrading").

A strike (`upgrade`, nemesis.py) stops one broker gracefully (SIGTERM, as an operator
does) and heals by starting it on the *other* release: this tree's brokers go back to
RELEASE_FROM, RELEASE_FROM's come forward to this tree; a broker on RELEASE_FROM is the
one chosen when there is one (strikes alternate: back, forward, back, ...). Before a strike, with probability
FINALIZE_P and only while no broker runs RELEASE_FROM, the nemesis finalizes the cluster's
feature level (`POST /v1/cluster/features/finalize`, recorded with its answer: a broker
down then makes it refused, which is recorded too); once finalized, every restart is on
this tree (a rollback is no longer possible, and a RELEASE_FROM broker would be refused).

The old tree is a detached `git worktree` in a temporary directory, removed at `close`;
brokers run it with this interpreter and the same flags, PYTHONPATH naming the tree they run
(and PYTHONSAFEPATH=1, so that the working directory, this repository, does not come first).
"""

from __future__ import annotations

import random
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Any

from jepsen.cluster import Broker, HarnessError, http, plain_signed

RELEASE_FROM = "425063b"  # release 0.1.0, as tests/cluster/test_cluster_rolling_upgrade.py
REPO = Path(__file__).resolve().parent.parent
# Per strike while no broker runs RELEASE_FROM: how often the run finalizes. About one
# run in two of 30 s (one or two strikes) finalizes; the rest test upgrade and rollback only.
FINALIZE_P = 0.5
FINALIZE_TIMEOUT_S = 15.0


def _git(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["git", "-C", str(REPO), *args], capture_output=True, text=True, timeout=120, check=False
    )


class Releases:
    """Which release each broker runs; the old tree on disk while the run lasts."""

    def __init__(self) -> None:
        # Outside the repository: linters and `git status` must not see a second tree.
        self.old_tree = Path(tempfile.mkdtemp(prefix="dmq-jepsen-release-from-")) / "tree"
        self.old: set[str] = set()  # brokers running RELEASE_FROM
        self.finalized = False

    def setup(self) -> None:
        if _git("cat-file", "-e", f"{RELEASE_FROM}^{{commit}}").returncode != 0:
            raise HarnessError(f"the upgrade nemesis needs git history with {RELEASE_FROM}")
        added = _git("worktree", "add", "--detach", str(self.old_tree), RELEASE_FROM)
        if added.returncode != 0:
            raise HarnessError(f"git worktree add {RELEASE_FROM}: {added.stderr.strip()}")

    def close(self) -> None:
        if self.old_tree.exists():
            _git("worktree", "remove", "--force", str(self.old_tree))
        _git("worktree", "prune")
        shutil.rmtree(self.old_tree.parent, ignore_errors=True)

    def flip(self, broker: Broker) -> str:
        """Make `broker`'s next start run the other release (this tree once finalized);
        the release it will run."""
        to_old = broker.node_id not in self.old and not self.finalized
        # PYTHONSAFEPATH: `python -m dmq` does not put the working directory (this
        # repository, where the run's relative paths start) before PYTHONPATH.
        tree = self.old_tree if to_old else REPO
        broker.env = {**broker.env, "PYTHONPATH": str(tree), "PYTHONSAFEPATH": "1"}
        if to_old:
            self.old.add(broker.node_id)
            plain_signed.add(broker.url)
            return RELEASE_FROM
        self.old.discard(broker.node_id)
        plain_signed.discard(broker.url)
        return "this tree"

    def maybe_finalize(self, rng: random.Random, urls: list[str]) -> dict[str, Any] | None:
        """Finalize with probability FINALIZE_P while no broker runs RELEASE_FROM; the
        answer to record (None: not tried)."""
        if self.finalized or self.old or not urls or rng.random() >= FINALIZE_P:
            return None
        error: OSError | None = None
        for url in rng.sample(urls, len(urls)):  # a broker just restarted may not listen yet
            try:
                answer = http(url + "/v1/cluster/features/finalize", "POST", {}, FINALIZE_TIMEOUT_S)
                break
            except OSError as refused:
                error = refused
        else:
            return {"finalize": "unreachable", "finalize_answer": repr(error)[:300]}
        self.finalized = answer.status == 200
        return {"finalize": answer.status, "finalize_answer": answer.body.decode()[:300]}
