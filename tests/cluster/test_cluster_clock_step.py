"""A broker restarted with its wall clock stepped far off waits for the clock, never exits.

With a cluster secret every internal call is signed with the sender's wall-clock time and
refused more than CLOCK_SKEW_MS_MAX (60 s) from the receiver's (dmq/internal_auth.py):
availability, not safety. A jepsen campaign run (seed 1275855209) restarted a registered
broker while the clock nemesis had moved its clock: its registration, relayed to the
metadata leader, was refused as `expired`, the broker treated the 401 as final and
exited, and it never came back. A peer's refusal for the clock is now a retriable
BrokerUnavailable (dmq/peers.py): the broker keeps asking, and is ready once its clock is
back within the bound.

The clock is moved with Debian's libfaketime (`make system-deps` installs it), wall clock
only, as jepsen/'s clock nemesis does.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import pytest
from cluster_harness import DmqCluster

FAKETIME_LIB = Path("/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1")
STEP = "+1200"  # seconds: twenty times CLOCK_SKEW_MS_MAX
HELD_S = 6.0  # how long the stepped broker must stay up, refused, before the clock returns

pytestmark = pytest.mark.skipif(
    not FAKETIME_LIB.exists(), reason="needs libfaketime (make system-deps)"
)


def test_a_broker_restarted_with_a_stepped_clock_waits_and_joins_once_it_is_corrected(
    dmq_cluster: Callable[..., DmqCluster], tmp_path: Path
) -> None:
    cluster = dmq_cluster(4, metadata_voters=["n1", "n2", "n3"], secret=b"s" * 32)
    cluster.start_all()
    stepped = cluster["n4"]  # an observer: its registration is relayed to a voter
    cluster.kill9("n4")
    clock = tmp_path / "n4.faketime"
    clock.write_text(f"{STEP}\n")
    stepped.env = {
        "LD_PRELOAD": str(FAKETIME_LIB),
        "FAKETIME_TIMESTAMP_FILE": str(clock),
        "FAKETIME_DONT_FAKE_MONOTONIC": "1",
        "FAKETIME_CACHE_DURATION": "1",
    }
    stepped.start()

    deadline = time.monotonic() + HELD_S
    while time.monotonic() < deadline:
        assert stepped.alive, f"n4 exited with its clock stepped:\n{stepped.log_tail()}"
        time.sleep(0.2)
    assert not stepped.is_ready()
    others = [n for n in cluster.live() if n is not stepped]
    refusals = [n.node_id for n in others if "from this broker's clock" in n.log_tail(100_000)]
    assert refusals, "no broker refused the stepped broker's calls: no test"

    clock.write_text("+0\n")
    cluster.wait_ready([stepped], timeout_s=60)
