"""The README's curl examples, run for real against a live broker.

Every `console` block of README.md is a list of `$ command` lines, each followed by
its exact expected output. The test runs each command with bash (127.0.0.1:8080
replaced by the test broker's address) and compares: JSON outputs as JSON, other
outputs as text. So the README cannot drift from what dmq does.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

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
            assert json.loads(got) == json.loads(expected), command
        except json.JSONDecodeError:
            assert got == expected.strip(), command
