"""Proves the crash-point explorer (`python -m jepsen.crash`, jepsen/crash.py) end to end
and its file-system model (jepsen/crashfs.py) on scripted traces.

- A real broker under strace, a small workload (8 records, acks=all from 4 threads and
  acks=1 from one, a Raft snapshot every 4 entries): every crash point from the first
  produce on, in the three variants, each distinct state restarted as a real broker; the
  model's final directory equals the broker's (checked by the explorer before it
  explores); every state starts and serves every acknowledged record, and nothing an
  earlier crash point served goes missing. The explorer found the lost write of
  jepsen/README.md's "Real bugs found" (a compaction cut off after its snapshot) in 11
  crash points of a 16-record run with the fix reverted; see the README for the run.
- The model: a write that no fsync followed is gone in `synced`, half there (cut at a
  page) in `torn`, whole in `process`; a rename moves the data it names; a synced file
  renamed over another is what a crash after the rename leaves; states that do not
  differ are explored once.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from jepsen.crashfs import PAGE_BYTES, Replay, crash_points, parse_trace

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.timeout(300)
def test_every_crash_point_of_a_small_workload_restarts_with_every_acknowledged_record() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "jepsen.crash", "--records", "8", "--jobs", "2"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=280,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    summary = json.loads(done.stdout[done.stdout.index("{") :])
    assert summary["failed"] == 0 and summary["failures"] == []
    assert summary["acks"] >= 8  # the 8 acks=all records and the acks=1 ones
    assert summary["states"] >= 30 and summary["points"] > summary["states"]


def _hex(data: bytes) -> str:
    return "".join(f"\\x{b:02x}" for b in data)


def _trace(tmp_path: Path, root: Path, lines: list[str]) -> Path:
    """A trace in strace's -f -ttt -y -xx form: strings and <paths> hex-escaped."""
    out = []
    for k, line in enumerate(lines):
        line = line.replace("{root}", str(root))
        line = re.sub(r'"([^"]*)"', lambda m: '"' + _hex(m.group(1).encode()) + '"', line)
        line = re.sub(r"<([^<>]*)>", lambda m: "<" + _hex(m.group(1).encode()) + ">", line)
        out.append(f"100 {1000 + k}.000000 {line}")
    path = tmp_path / "trace.txt"
    path.write_text("\n".join(out) + "\n")
    return path


def test_the_model_keeps_what_was_synced_and_tears_what_was_not(tmp_path: Path) -> None:
    root = tmp_path / "data"
    page = "a" * PAGE_BYTES
    trace = _trace(
        tmp_path,
        root,
        [
            'openat(AT_FDCWD<{root}>, "{root}/seg", O_RDWR|O_CREAT, 0644) = 3<{root}/seg>',
            'write(3<{root}/seg>, "' + page + f'", {PAGE_BYTES}) = {PAGE_BYTES}',
            "fsync(3<{root}/seg>) = 0",
            'pwrite64(3<{root}/seg>, "'
            + "b" * 2 * PAGE_BYTES
            + f'", {2 * PAGE_BYTES}, {PAGE_BYTES}) = {2 * PAGE_BYTES}',
            'openat(AT_FDCWD<{root}>, "{root}/cp.tmp", O_WRONLY|O_CREAT|O_TRUNC, 0644) = 4<{root}/cp.tmp>',
            'write(4<{root}/cp.tmp>, "cp2", 3) = 3',
            "fdatasync(4<{root}/cp.tmp>) = 0",
            'rename("{root}/cp.tmp", "{root}/cp") = 0',
            "close(4<{root}/cp>) = 0",
        ],
    )
    calls = parse_trace(trace)
    assert [c.name for c in calls][:3] == ["openat", "write", "fsync"]
    replay = Replay(root)
    for call in calls:
        replay.apply(call)
    assert replay.final_tree() == {"seg": page.encode() + b"b" * 2 * PAGE_BYTES, "cp": b"cp2"}

    points, states = crash_points(calls, root)
    last = {p.variant: states[p.digest] for p in points}  # the crash after the rename
    assert last["synced"].files == {"seg": page.encode(), "cp": b"cp2"}
    # Torn: the first half of the unsynced bytes, cut at a page, reached the disk.
    assert last["torn"].files["seg"] == page.encode() + b"b" * PAGE_BYTES
    assert last["process"].files["seg"] == page.encode() + b"b" * 2 * PAGE_BYTES
    # The rename is a crash point of its own, the fsyncs too; equal states are kept once.
    assert {p.call for p in points} == {"fsync seg", "fdatasync cp.tmp", "rename cp.tmp"}
    assert len(states) < len(points)
