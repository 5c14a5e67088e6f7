"""dmq/malloc_tuning.py: a broker keeps freed memory, so new buffers are not fresh pages.

Each case runs in its own interpreter (malloc's settings are per process): the same
churn of buffers of 130 KB-2 MB, four alive at a time as a broker's request bodies and
batches are, in the main thread and in another (its own arena), and the page faults of
the second half counted from getrusage. Counts are exact, not timings."""

from __future__ import annotations

import json
import platform
import subprocess
import sys

import pytest

from dmq.malloc_tuning import keep_freed_memory

CHURN = r"""
import json, random, resource, sys, threading
from dmq.malloc_tuning import keep_freed_memory
env = json.loads(sys.argv[1])
tuned = keep_freed_memory(env) if env is not None else False
rng = random.Random(1)
def churn(rounds):
    alive = []
    for _ in range(rounds):
        buffer = bytearray(rng.randrange(130_000, 2_000_000))
        buffer[::4096] = b"\1" * len(buffer[::4096])  # touch every page
        alive.append(bytes(buffer))
        if len(alive) > 4:
            alive.pop(0)
def faults():
    churn(200)
    before = resource.getrusage(resource.RUSAGE_THREAD).ru_minflt
    churn(200)
    return resource.getrusage(resource.RUSAGE_THREAD).ru_minflt - before
other = []
thread = threading.Thread(target=lambda: other.append(faults()))
thread.start()
thread.join()
print(json.dumps({"tuned": tuned, "main": faults(), "thread": other[0]}))
"""


def churn_faults(environ: dict[str, str] | None) -> dict[str, int]:
    """Page faults of the churn's second half; `environ` None: malloc left as it is."""
    done = subprocess.run(
        [sys.executable, "-c", CHURN, json.dumps(environ)],
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    )
    return json.loads(done.stdout)  # type: ignore[no-any-return]


@pytest.mark.skipif(
    platform.libc_ver()[0] != "glibc", reason="tunes glibc's malloc; elsewhere nothing changes"
)
def test_a_tuned_process_reuses_freed_buffers_instead_of_faulting_in_new_pages() -> None:
    plain = churn_faults(None)
    tuned = churn_faults({})
    assert tuned["tuned"] and not plain["tuned"]
    # Untuned, nearly every buffer is fresh memory: ~200 buffers of ~1 MB, 250 pages each.
    assert plain["main"] > 10_000 and plain["thread"] > 10_000
    # Tuned, the heaps hand freed buffers back out: at most a few hundred faults, a
    # hundredth of the plain figure, in either arena.
    assert tuned["main"] < plain["main"] / 20 and tuned["thread"] < plain["thread"] / 20


def test_an_operators_own_malloc_tunables_win() -> None:
    assert keep_freed_memory({"MALLOC_TRIM_THRESHOLD_": "0"}) is False
    assert churn_faults({"MALLOC_MMAP_THRESHOLD_": "131072"})["tuned"] is False
