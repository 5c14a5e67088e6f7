"""The README's curl examples, run for real against a live broker.

Every `console` block of README.md is a list of `$ command` lines, each followed by
its exact expected output. The test runs each command with bash (127.0.0.1:8080
replaced by the test broker's address) and compares: JSON outputs as JSON, other
outputs as text. So the README cannot drift from what dmq does. The README's records
carry no fixed timestamp (a 2023 one was deleted by the 7-day retention a minute after
it was produced): the broker stamps them, so every `timestamp` of an output must be the
time of the run, and the value the README shows stands for it.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from tests_support import ROOT, BrokerProcess


def readme_examples() -> list[tuple[str, str]]:
    text = (ROOT / "README.md").read_text()
    examples: list[tuple[str, str]] = []
    for block in re.findall(r"```console\n(.*?)```", text, flags=re.S):
        command: str | None = None
        expected: list[str] = []
        for line in block.splitlines():
            if line.startswith("$ "):
                if command is not None:
                    examples.append((command, "\n".join(expected)))
                command, expected = line[2:], []
            else:
                expected.append(line)
        if command is not None:
            examples.append((command, "\n".join(expected)))
    return examples


def test_readme_has_examples() -> None:
    assert len(readme_examples()) >= 5


@pytest.mark.skipif(
    shutil.which("curl") is None, reason="curl is not installed (make test installs it)"
)
def test_readme_curl_examples_give_the_documented_output(
    broker: BrokerProcess, tmp_path: Path
) -> None:
    address = f"{broker.host}:{broker.port}"
    started_ms = int(time.time() * 1000)
    for command, expected in readme_examples():
        out = subprocess.run(
            ["bash", "-c", command.replace("127.0.0.1:8080", address)],
            capture_output=True,
            text=True,
            timeout=30,
            cwd=tmp_path,
        )
        assert out.returncode == 0, f"{command}\n{out.stderr}"
        got = out.stdout.strip()
        try:
            got_doc, expected_doc = json.loads(got), json.loads(expected)
        except json.JSONDecodeError:
            assert got == expected.strip(), command
        else:
            got_doc = _stamped(got_doc, started_ms, int(time.time() * 1000))
            assert got_doc == _stamped(expected_doc, 0, 2**63), command


def _stamped(doc: Any, low_ms: int, high_ms: int) -> Any:
    """`doc` with each `timestamp` checked to lie in [low_ms, high_ms] and replaced by
    "stamped", so that outputs compare whatever the clock said."""
    if isinstance(doc, list):
        return [_stamped(item, low_ms, high_ms) for item in doc]
    if not isinstance(doc, dict):
        return doc
    out = {k: _stamped(v, low_ms, high_ms) for k, v in doc.items()}
    if "timestamp" in out:
        assert low_ms <= out["timestamp"] <= high_ms, (doc, low_ms, high_ms)
        out["timestamp"] = "stamped"
    return out
