"""Runs the streaming cases (streaming_cases.py) in a fresh Python interpreter, so a fresh
JVM and py4j gateway.

Three full runs of the suite stalled in the first streaming query, before its first
micro-batch (no progress, and `query.stop()` blocked too), after the ~980 tests before it
in the same process; never with spark_io alone nor with the Spark benchmark before it.
The cause was not found (the JVM side was not captured): the foreachBatch callback into
this interpreter is the likely place. A subprocess keeps what the cases prove (each
assertion there fails this test, with its output) and the process state of the rest of
the suite out of it.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

CASES = Path(__file__).with_name("streaming_cases.py")
RUN_S = 600

pytestmark = pytest.mark.timeout(RUN_S + 60)


def test_streaming_cases_pass_in_a_fresh_interpreter(tmp_path: Path) -> None:
    command = [
        sys.executable, "-m", "pytest", str(CASES), "-q", "-p", "no:cacheprovider",
        "--basetemp", str(tmp_path / "cases"),
    ]  # fmt: skip
    done = subprocess.run(
        command, capture_output=True, text=True, timeout=RUN_S, cwd=CASES.parents[2]
    )
    assert done.returncode == 0, done.stdout[-20000:] + done.stderr[-5000:]
    assert re.search(r"^4 passed", done.stdout, re.MULTILINE), done.stdout[-5000:]
