"""Every `dmq` command explains itself, and every table is headed the same way.

Proves:
- `dmq ... --help` runs for every command and subcommand (exit 0) and lists each of its
  flags; every flag has help text that says something besides a default in parentheses,
  and none cites a source file (`.py`) in place of an explanation;
- the tables the commands print against a real broker (topic list and describe, group
  list, describe and reset, cluster status, txn list, share list and describe) are
  headed in one style, rpk's: upper-case words joined by hyphens (HIGH-WATERMARK, not
  HIGH_WATERMARK; AGE-MS, not AGE_MS), and counts read right ("1 partition", "1 member");
  a finished transaction shows no age ("-", not 0).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import re
import subprocess
import sys
from collections.abc import Iterator

import pytest

from dmq import cli
from dmq.cli._common import HEADER_STYLE
from dmq.client import Producer
from tests_support import BrokerProcess


def _commands(
    parser: argparse.ArgumentParser, path: tuple[str, ...] = ()
) -> Iterator[tuple[tuple[str, ...], argparse.ArgumentParser]]:
    yield path, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from _commands(sub, (*path, name))


COMMANDS = list(_commands(cli.build_parser()))


def test_the_walk_finds_every_command() -> None:
    paths = {" ".join(path) for path, _ in COMMANDS}
    assert {"serve", "produce", "consume", "topic create", "group reset", "txn list",
            "share configure", "acl add", "bench broker"} <= paths  # fmt: skip
    assert len(paths) > 40


@pytest.mark.parametrize(
    ("path", "parser"), COMMANDS, ids=[" ".join(p) or "dmq" for p, _ in COMMANDS]
)
def test_every_flag_has_help(path: tuple[str, ...], parser: argparse.ArgumentParser) -> None:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert cli.main([*path, "--help"]) == 0
    shown = out.getvalue()
    for action in parser._actions:
        if not action.option_strings or action.help == argparse.SUPPRESS:
            continue
        flag = max(action.option_strings, key=len)
        assert flag in shown, (path, flag)
        text = action.help or ""
        assert re.sub(r"\([^)]*\)|\[[^]]*\]", "", text).strip(), f"{path} {flag}: no help"
        assert ".py" not in text, f"{path} {flag} cites a source file: {text}"


def dmq(broker: BrokerProcess, *argv: str) -> str:
    done = subprocess.run(
        [sys.executable, "-m", "dmq", "--url", broker.url, *argv],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 0, (argv, done.stderr)
    return done.stdout


def _headers(text: str) -> list[list[str]]:
    """The header rows of the tables in `text`: lines whose first cell is upper case."""
    rows = []
    for line in text.splitlines():
        cells = re.split(r"\s{2,}", line.strip())
        if cells[0] and cells[0] == cells[0].upper() and re.match(r"[A-Z]", cells[0]):
            rows.append(cells)
    return rows


def test_tables_are_headed_in_one_style_and_counts_read_right(broker: BrokerProcess) -> None:
    assert broker.json("POST", "/v1/topics", {"name": "t", "partitions": 1})[0] == 201
    assert broker.json("POST", "/v1/topics/t/records", {"records": [{"value": "v"}]})[0] == 200
    assert dmq(broker, "consume", "t", "--group", "g") == "v\n"
    dmq(broker, "share", "configure", "s")
    with Producer(broker.url, transactional_id="tx", linger_ms=0) as producer:
        producer.begin_transaction()
        producer.send("t", b"x", partition=0).result(30)
        producer.commit_transaction()
    described = dmq(broker, "topic", "describe", "t")
    assert "topic t: 1 partition," in described, described
    assert ", 0 members\n" in dmq(broker, "group", "describe", "g")  # the member left
    outputs = {
        "topic list": dmq(broker, "topic", "list"),
        "topic describe": described,
        "group list": dmq(broker, "group", "list"),
        "group describe": dmq(broker, "group", "describe", "g"),
        "group reset": dmq(broker, "group", "reset", "g", "--to", "earliest", "--topic", "t"),
        "cluster status": dmq(broker, "cluster", "status"),
        "txn list": dmq(broker, "txn", "list"),
        "share list": dmq(broker, "share", "list"),
        "share describe": dmq(broker, "share", "describe", "s"),
    }
    for command, text in outputs.items():
        headers = _headers(text)
        assert headers, (command, text)
        for row in headers:
            bad = [cell for cell in row if not HEADER_STYLE.fullmatch(cell)]
            assert not bad, (command, row)
    assert "HIGH-WATERMARK" in outputs["topic describe"]
    assert "AGE-MS" in outputs["txn list"]
    txn_row = re.split(r"\s{2,}", outputs["txn list"].splitlines()[1])
    assert txn_row[1] == "complete_commit" and txn_row[4] == "-", txn_row  # no age once done
