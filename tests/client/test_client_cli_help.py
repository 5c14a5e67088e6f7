"""Every `dmq` command explains itself, and every table is headed the same way.

Proves:
- `dmq ... --help` runs for every command and subcommand (exit 0) and lists each of its
  flags; every flag has help text that says something besides a default in parentheses,
  and none cites a source file (`.py`) in place of an explanation;
- the tables the commands print against a real broker (topic list and describe, group
  list, describe and reset, cluster status, txn list, share list and describe) are
  headed in one style, rpk's: upper-case words joined by hyphens (HIGH-WATERMARK, not
  HIGH_WATERMARK; AGE-MS, not AGE_MS), and counts read right ("1 partition", "1 member");
  a finished transaction shows no age ("-", not 0);
- every command that prints data has `--output`: `table` (the default) or `json` (the
  API's answer), `lines` or `json` for the two that print records (`consume`, `share
  consume`, whose json is one record shape); every command is classed as printing data or
  not, so a new one cannot be left out; `--json`, the old spelling, is hidden and means
  `--output json`; a table command's `--output json` prints JSON;
- `dmq bench --help` says how long each benchmark's `--quick` run takes, and its full run
  where it was timed.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
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


# Every leaf command, classed: those that print data take --output (table|json, or
# lines|json where they print records); the others print a confirmation line, progress, or
# nothing.
RECORD_COMMANDS = {"consume", "share consume"}
DATA_COMMANDS = {
    "topic create", "topic list", "topic describe", "topic alter", "group list",
    "group describe", "group reset", "storage show", "storage set-aside", "share configure",
    "share describe", "share list", "txn list", "txn describe", "txn abort", "delay list",
    "user list", "user whoami", "acl list", "quota set", "quota list", "cluster status",
    "cluster operations", "cluster features",
}  # fmt: skip
NO_DATA = {
    "serve", "topic delete", "produce", "cluster reassign", "cluster decommission-broker",
    "cluster metadata-voters", "cluster decommission-partition", "group delete",
    "storage reset", "delay cancel", "user add", "user remove", "acl add", "acl remove",
    "cert dev", "cluster upgrade",
}  # fmt: skip


def _leaves() -> dict[str, argparse.ArgumentParser]:
    return {
        " ".join(path): parser
        for path, parser in COMMANDS
        if path and not any(isinstance(a, argparse._SubParsersAction) for a in parser._actions)
    }


def _option(parser: argparse.ArgumentParser, flag: str) -> argparse.Action | None:
    return next((a for a in parser._actions if flag in a.option_strings), None)


def test_every_command_that_prints_data_has_output_table_or_json() -> None:
    leaves = _leaves()
    benches = {path for path in leaves if path.startswith("bench ")}  # results: --json PATH
    classed = RECORD_COMMANDS | DATA_COMMANDS | NO_DATA | benches
    assert set(leaves) == classed, set(leaves) ^ classed
    for path in RECORD_COMMANDS | DATA_COMMANDS:
        output = _option(leaves[path], "--output")
        assert output is not None, f"dmq {path} has no --output"
        want = ["lines", "json"] if path in RECORD_COMMANDS else ["table", "json"]
        assert list(output.choices or ()) == want and output.default == want[0], path
        old = _option(leaves[path], "--json")
        assert old is None or (old.help == argparse.SUPPRESS and old.const == "json"), path
    args = cli.build_parser().parse_args(["topic", "list", "--json"])
    assert args.output == "json"


def test_output_json_prints_the_apis_answer(broker: BrokerProcess) -> None:
    assert broker.json("POST", "/v1/topics", {"name": "t", "partitions": 2})[0] == 201
    created = json.loads(dmq(broker, "topic", "create", "u", "--output", "json"))
    assert created["name"] == "u" and created["config"]["remote_storage_enable"] is False
    altered = dmq(broker, "topic", "alter", "t", "--partitions", "3", "--output", "json")
    assert len(json.loads(altered)["partitions"]) == 3
    assert json.loads(dmq(broker, "topic", "list", "--output", "json"))["topics"]
    dmq(broker, "share", "configure", "s")
    fields = dmq(broker, "share", "configure", "s", "--lock-duration-ms", "5000")
    assert ["lock_duration_ms", "5000"] in [line.split() for line in fields.splitlines()]
    shares = json.loads(dmq(broker, "share", "list", "--output", "json"))
    assert shares, shares
    reset = json.loads(dmq(broker, "group", "reset", "g", "--to", "earliest", "--topic", "t",
                           "--output", "json"))  # fmt: skip
    assert reset["offsets"][0] == {"topic": "t", "partition": 0, "offset": 0}, reset


def test_bench_help_says_how_long_each_benchmark_takes() -> None:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert cli.main(["bench", "--help"]) == 0
    shown = " ".join(out.getvalue().split())  # argparse wraps the help lines
    benchmarks = [path[1] for path, _ in COMMANDS if len(path) == 2 and path[0] == "bench"]
    assert len(benchmarks) >= 13, benchmarks
    for name in benchmarks:
        found = re.search(rf" {name} .*?\(--quick ~[\d.]+ (s|min); full ([^)]*)\)", shown)
        assert found, f"dmq bench --help gives no duration for {name}: {shown}"
    assert "full ~30 s" in shown and "--quick ~54 s; full ~6 min" in shown  # log; --nodes 3
